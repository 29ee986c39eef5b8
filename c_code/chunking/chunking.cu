// Chunking / UnChunking: time (T, B, D) <-> overlapping chunks (size, B * n_chunks, D).
//
// Chunk c of sequence b is column y = b * n_chunks + c of the chunked layout
// (batch-major merge); its frame x is time frame c * step + x.  A frame counts
// where its mask is > 0.1.  Two movements cover all four directions:
//   gather  (time -> chunks): Chunking forward, UnChunking backward;
//   scatter (chunks -> time): UnChunking forward (mean), Chunking backward (sum).
// Inputs may be strided (no need_contiguous); outputs are C-contiguous.
#include "../dialect/kernel.h"

struct PtnChunkGeom {
  int64_t T, B, D, size, step, n_chunks;
};

// A strided 2-D / 3-D view (element strides).
struct PtnView2 {
  const Float* p;
  int64_t s0, s1;
};
struct PtnView3 {
  const Float* p;
  int64_t s0, s1, s2;
};

static inline PtnView2 ptn_view2(Ndarray* a) {
  return {Ndarray_DEV_DATA(a), Ndarray_STRIDE(a, 0), Ndarray_STRIDE(a, 1)};
}
static inline PtnView3 ptn_view3(Ndarray* a) {
  return {Ndarray_DEV_DATA(a), Ndarray_STRIDE(a, 0), Ndarray_STRIDE(a, 1), Ndarray_STRIDE(a, 2)};
}
static const PtnView2 ptn_no_view2 = {0, 0, 0};

[[noreturn]] static void ptn_chunk_error(const std::string& msg) { ptn::raise(PTN_STATUS_VALUE, msg); }

static void ptn_chunk_check_dim(const char* what, int64_t got, int64_t want) {
  if (got != want) {
    std::ostringstream s;
    s << what << " is " << got << ", expected " << want;
    ptn_chunk_error(s.str());
  }
}

// n_chunks = max(T - size + step - 1, 0) // step + 1 (at least one chunk, also for T = 0).
static inline int64_t ptn_n_chunks(int64_t T, int64_t size, int64_t step) {
  int64_t num = T - size + step - 1;
  return (num > 0 ? num : 0) / step + 1;
}

// chunk_params = [chunk_size, chunk_step], both positive integers.
static void ptn_chunk_read_params(Ndarray* params, int64_t* size, int64_t* step) {
  ptn_chunk_check_dim("chunk_params ndim", Ndarray_NDIM(params), 1);
  ptn_chunk_check_dim("chunk_params size", Ndarray_DIMS(params)[0], 2);
  Float host[2];
  Ndarray_copy_to_host(host, Ndarray_DEV_DATA(params), 2 * sizeof(Float));  // need_contiguous
  const char* names[2] = {"chunk_size", "chunk_step"};
  int64_t vals[2];
  for (int k = 0; k < 2; ++k) {
    Float v = host[k];
    if (!(v >= 1 && v <= Float(1e9)) || v != std::floor(v)) {
      std::ostringstream s;
      s << names[k] << " must be a positive integer, got " << v;
      ptn_chunk_error(s.str());
    }
    vals[k] = (int64_t)v;
  }
  *size = vals[0];
  *step = vals[1];
}

// Frames of time t are covered by chunks c in [c_begin, c_end): 0 <= t - c * step < size.
static inline DEV_FUNC void ptn_chunk_range(const PtnChunkGeom& g, int64_t t, int64_t* c_begin, int64_t* c_end) {
  *c_begin = t >= g.size ? (t - g.size) / g.step + 1 : 0;
  int64_t e = t / g.step + 1;
  *c_end = e < g.n_chunks ? e : g.n_chunks;
}

#if CUDA
// One thread per output element (x, y, z); rows with D = 0 still get their oindex.
DEF_KERNEL void ptn_chunk_gather_kernel(PtnChunkGeom g, PtnView3 src, PtnView2 tmask, PtnView2 cmask,
                                        PtnView2 factor, Float* out, Float* oindex) {
  const int64_t Y = g.B * g.n_chunks, Dp = g.D > 0 ? g.D : 1;
  const int64_t n = g.size * Y * Dp;
  for (int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t z = idx % Dp, row = idx / Dp;
    int64_t y = row % Y, x = row / Y;
    int64_t b = y / g.n_chunks, c = y % g.n_chunks;
    int64_t t = c * g.step + x;
    bool valid = t < g.T;
    if (valid && tmask.p) valid = tmask.p[t * tmask.s0 + b * tmask.s1] > Float(0.1);
    if (valid && cmask.p) valid = cmask.p[x * cmask.s0 + y * cmask.s1] > Float(0.1);
    if (z < g.D) {
      Float v = 0;
      if (valid) {
        v = src.p[t * src.s0 + b * src.s1 + z * src.s2];
        if (factor.p) v *= factor.p[t * factor.s0 + b * factor.s1];
      }
      out[row * g.D + z] = v;
    }
    if (z == 0 && oindex) oindex[row] = valid ? Float(1) : Float(0);
  }
}

// One thread per output element (t, b, z).
DEF_KERNEL void ptn_chunk_scatter_kernel(PtnChunkGeom g, PtnView3 src, PtnView2 cmask, bool average, Float* out,
                                         Float* oindex, Float* ofactors) {
  const int64_t Dp = g.D > 0 ? g.D : 1;
  const int64_t n = g.T * g.B * Dp;
  for (int64_t idx = threadIdx.x + (int64_t)blockDim.x * blockIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t z = idx % Dp, row = idx / Dp;
    int64_t b = row % g.B, t = row / g.B;
    int64_t c0, c1;
    ptn_chunk_range(g, t, &c0, &c1);
    Float acc = 0;
    int64_t count = 0;
    for (int64_t c = c0; c < c1; ++c) {
      int64_t x = t - c * g.step, y = b * g.n_chunks + c;
      if (!(cmask.p[x * cmask.s0 + y * cmask.s1] > Float(0.1))) continue;
      ++count;
      if (z < g.D) acc += src.p[x * src.s0 + y * src.s1 + z * src.s2];
    }
    if (z < g.D) out[row * g.D + z] = (average && count > 0) ? acc / Float(count) : acc;
    if (z == 0) {
      if (oindex) oindex[row] = count > 0 ? Float(1) : Float(0);
      if (ofactors) ofactors[row] = count > 0 ? Float(1) / Float(count) : Float(1);
    }
  }
}
#endif

// out[x, y, :] = valid ? src[t, b, :] * factor[t, b] : 0 with t = c * step + x, valid = t < T and the masks
// (tmask in time layout, cmask in chunk layout; either may be absent); oindex[x, y] = valid.
static void ptn_chunk_gather(const PtnChunkGeom& g, PtnView3 src, PtnView2 tmask, PtnView2 cmask, PtnView2 factor,
                             Float* out, Float* oindex) {
  const int64_t Y = g.B * g.n_chunks;
  if (g.size * Y == 0) return;
#if CUDA
  start_dev_kernel(ptn_chunk_gather_kernel, (g, src, tmask, cmask, factor, out, oindex));
  HANDLE_LAST_ERROR();
#else
  const bool contiguous_rows = src.s2 == 1;
  for (int64_t x = 0; x < g.size; ++x) {
    for (int64_t b = 0; b < g.B; ++b) {
      for (int64_t c = 0; c < g.n_chunks; ++c) {
        const int64_t y = b * g.n_chunks + c, t = c * g.step + x;
        const int64_t row = x * Y + y;
        bool valid = t < g.T;
        if (valid && tmask.p) valid = tmask.p[t * tmask.s0 + b * tmask.s1] > Float(0.1);
        if (valid && cmask.p) valid = cmask.p[x * cmask.s0 + y * cmask.s1] > Float(0.1);
        if (oindex) oindex[row] = valid ? Float(1) : Float(0);
        Float* dst = out + row * g.D;
        if (!valid) {
          std::fill(dst, dst + g.D, Float(0));
          continue;
        }
        const Float* s = src.p + t * src.s0 + b * src.s1;
        if (factor.p) {
          const Float f = factor.p[t * factor.s0 + b * factor.s1];
          for (int64_t z = 0; z < g.D; ++z) dst[z] = s[z * src.s2] * f;
        } else if (contiguous_rows) {
          memcpy(dst, s, g.D * sizeof(Float));
        } else {
          for (int64_t z = 0; z < g.D; ++z) dst[z] = s[z * src.s2];
        }
      }
    }
  }
#endif
}

// out[t, b, :] = sum (or mean, with `average`) of src[x, y, :] over the chunks covering t whose cmask[x, y] > 0.1;
// oindex[t, b] = (count > 0); ofactors[t, b] = 1 / count, or 1 without any.
static void ptn_chunk_scatter(const PtnChunkGeom& g, PtnView3 src, PtnView2 cmask, bool average, Float* out,
                              Float* oindex, Float* ofactors) {
  if (g.T * g.B == 0) return;
#if CUDA
  start_dev_kernel(ptn_chunk_scatter_kernel, (g, src, cmask, average, out, oindex, ofactors));
  HANDLE_LAST_ERROR();
#else
  for (int64_t t = 0; t < g.T; ++t) {
    int64_t c0, c1;
    ptn_chunk_range(g, t, &c0, &c1);
    for (int64_t b = 0; b < g.B; ++b) {
      const int64_t row = t * g.B + b;
      Float* dst = out + row * g.D;
      std::fill(dst, dst + g.D, Float(0));
      int64_t count = 0;
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t x = t - c * g.step, y = b * g.n_chunks + c;
        if (!(cmask.p[x * cmask.s0 + y * cmask.s1] > Float(0.1))) continue;
        ++count;
        const Float* s = src.p + x * src.s0 + y * src.s1;
        if (src.s2 == 1) {
          for (int64_t z = 0; z < g.D; ++z) dst[z] += s[z];
        } else {
          for (int64_t z = 0; z < g.D; ++z) dst[z] += s[z * src.s2];
        }
      }
      if (average && count > 1) {
        const Float n = Float(count);
        for (int64_t z = 0; z < g.D; ++z) dst[z] /= n;
      }
      if (oindex) oindex[row] = count > 0 ? Float(1) : Float(0);
      if (ofactors) ofactors[row] = count > 0 ? Float(1) / Float(count) : Float(1);
    }
  }
#endif
}

// The geometry from the time-layout (T, B, D) and chunk-layout (size, B * n_chunks, D) shapes.
static PtnChunkGeom ptn_chunk_geom(Ndarray* params, Ndarray* time_arr, Ndarray* chunk_arr, const char* time_name,
                                   const char* chunk_name) {
  PtnChunkGeom g;
  ptn_chunk_read_params(params, &g.size, &g.step);
  g.T = Ndarray_DIMS(time_arr)[0];
  g.B = Ndarray_DIMS(time_arr)[1];
  g.D = Ndarray_DIMS(time_arr)[2];
  g.n_chunks = ptn_n_chunks(g.T, g.size, g.step);
  std::string c(chunk_name), t(time_name);
  ptn_chunk_check_dim((c + " dim 0 (chunk_size)").c_str(), Ndarray_DIMS(chunk_arr)[0], g.size);
  ptn_chunk_check_dim((c + " dim 1 (n_batch * n_chunks, n_chunks from " + t + "'s n_time)").c_str(),
                      Ndarray_DIMS(chunk_arr)[1], g.B * g.n_chunks);
  ptn_chunk_check_dim((c + " dim 2 (n_dim of " + t + ")").c_str(), Ndarray_DIMS(chunk_arr)[2], g.D);
  return g;
}

static void ptn_chunk_check_2d(const char* name, Ndarray* a, int64_t d0, int64_t d1) {
  std::string n(name);
  ptn_chunk_check_dim((n + " dim 0").c_str(), Ndarray_DIMS(a)[0], d0);
  ptn_chunk_check_dim((n + " dim 1").c_str(), Ndarray_DIMS(a)[1], d1);
}

// ---------------------------------------------------------------- Chunking
// inputs: input (T,B,D), index (T,B), output_buffer [= output], oindex_buffer [= oindex], chunk_params (2,)
// outputs: output (size, B*n_chunks, D), oindex (size, B*n_chunks)
static void chunking_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 2);
  Ndarray *input = inputs[0], *index = inputs[1];
  Ndarray *out = *outputs[0], *oindex = *outputs[1];
  PtnChunkGeom g = ptn_chunk_geom(inputs[4], input, out, "input", "output_buffer");
  ptn_chunk_check_2d("index", index, g.T, g.B);
  ptn_chunk_check_2d("oindex_buffer", oindex, g.size, g.B * g.n_chunks);
  ptn_chunk_gather(g, ptn_view3(input), ptn_view2(index), ptn_no_view2, ptn_no_view2, Ndarray_DEV_DATA(out),
                   Ndarray_DEV_DATA(oindex));
}

// inputs: input (shape only), chunk_params, oindex (size, B*n_chunks), D_output (size, B*n_chunks, D)
// outputs: D_input (T,B,D): the sum over the chunks that copied each frame.
static void chunking_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 4);
  assert_cmp(n_outputs, ==, 1);
  Ndarray *oindex = inputs[2], *d_out = inputs[3];
  Ndarray* d_in = *outputs[0];
  PtnChunkGeom g = ptn_chunk_geom(inputs[1], d_in, d_out, "input", "D_output");
  ptn_chunk_check_2d("oindex", oindex, g.size, g.B * g.n_chunks);
  ptn_chunk_scatter(g, ptn_view3(d_out), ptn_view2(oindex), false, Ndarray_DEV_DATA(d_in), 0, 0);
}

// ---------------------------------------------------------------- UnChunking
// inputs: input (size, B*n_chunks, D), index (size, B*n_chunks), output_buffer (T,B,D) [= output],
//         oindex_buffer (T,B) [= oindex], ofactors_buffer (T,B) [= ofactors], chunk_params (2,)
// outputs: output (T,B,D) (mean over overlaps), oindex (T,B), ofactors (T,B)
static void unchunking_fw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 6);
  assert_cmp(n_outputs, ==, 3);
  Ndarray *input = inputs[0], *index = inputs[1];
  Ndarray *out = *outputs[0], *oindex = *outputs[1], *ofactors = *outputs[2];
  PtnChunkGeom g = ptn_chunk_geom(inputs[5], out, input, "output_buffer", "input");
  ptn_chunk_check_2d("index", index, g.size, g.B * g.n_chunks);
  ptn_chunk_check_2d("oindex_buffer", oindex, g.T, g.B);
  ptn_chunk_check_2d("ofactors_buffer", ofactors, g.T, g.B);
  ptn_chunk_scatter(g, ptn_view3(input), ptn_view2(index), true, Ndarray_DEV_DATA(out), Ndarray_DEV_DATA(oindex),
                    Ndarray_DEV_DATA(ofactors));
}

// inputs: input (shape only), index (size, B*n_chunks), chunk_params, ofactors (T,B), D_output (T,B,D)
// outputs: D_input (size, B*n_chunks, D) = chunk of D_output * ofactors, where index > 0.1.
static void unchunking_bw(int n_inputs, Ndarray** inputs, int n_outputs, Ndarray*** outputs) {
  assert_cmp(n_inputs, ==, 5);
  assert_cmp(n_outputs, ==, 1);
  Ndarray *index = inputs[1], *ofactors = inputs[3], *d_out = inputs[4];
  Ndarray* d_in = *outputs[0];
  PtnChunkGeom g = ptn_chunk_geom(inputs[2], d_out, d_in, "D_output", "input");
  ptn_chunk_check_2d("index", index, g.size, g.B * g.n_chunks);
  ptn_chunk_check_2d("ofactors", ofactors, g.T, g.B);
  ptn_chunk_gather(g, ptn_view3(d_out), ptn_no_view2, ptn_view2(index), ptn_view2(ofactors), Ndarray_DEV_DATA(d_in),
                   0);
}
