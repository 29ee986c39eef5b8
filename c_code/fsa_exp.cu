// exp for the automaton kernels (pasted before fsa.cu and hmm.cu).

// exp(x) for x <= 0 (-inf allowed; x < -708 gives 0).  CPU: Cody-Waite reduction, degree-13
// Taylor (~1 ulp), with integer bit selects instead of FP compares so that g++ -O3
// vectorises loops over it without -ffast-math.  CUDA: exp.
DEV_FUNC inline double fsa_exp(double x) {
#if CUDA
  return x < -708.0 ? 0.0 : exp(x);
#else
  uint64_t xb;
  memcpy(&xb, &x, sizeof(double));
  uint64_t keep = (uint64_t)(xb > 0xc086200000000000ULL) - 1;  // all ones unless x < -708 (x <= 0)
  uint64_t xcb = (xb & keep) | (0xc086200000000000ULL & ~keep);
  double xc;
  memcpy(&xc, &xcb, sizeof(double));
  const double magic = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  double kb = xc * 1.4426950408889634 + magic;
  double k = kb - magic;
  double r = (xc - k * 0.6931471803691238) - k * 1.9082149292705877e-10;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  int64_t kbits, mbits;
  memcpy(&kbits, &kb, sizeof(double));
  memcpy(&mbits, &magic, sizeof(double));
  int64_t sbits = (kbits - mbits + 1023) << 52;  // 2^k
  double scale;
  memcpy(&scale, &sbits, sizeof(double));
  double v = p * scale;
  uint64_t vb;
  memcpy(&vb, &v, sizeof(double));
  vb &= keep;
  memcpy(&v, &vb, sizeof(double));
  return v;
#endif
}

