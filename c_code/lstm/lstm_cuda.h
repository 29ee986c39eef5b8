// NativeLstm2's CUDA-only steps (lstm.cu) that take one launch per call where a loop over the frames took one or
// two per frame: the bias of every visited frame (forward), and the backward pass's matrix P of every visited frame
// (its input rows and its carried recurrent inputs, a recurrence over the frames run per (row, column) in a loop).
// With them, a frame takes two launches forward (the recurrent product, the gates) and two backward.
#ifndef PTNATIVE_LSTM_LSTM_CUDA_H
#define PTNATIVE_LSTM_LSTM_CUDA_H

#include "../dialect/kernel.h"

#if CUDA
// H[t] += bias for the visited frames t = first + k step (k < count); H (T, rows, cols), bias (cols,).
DEF_KERNEL void lstm_add_bias_frames(Float* H, const Float* bias, int64_t first, int64_t step, int64_t count,
                                     int64_t rows, int64_t cols) {
  const int64_t per = rows * cols;
  GRID_LOOP(i, count * per) {
    const int64_t k = i / per, r = i % per;
    H[(first + k * step) * per + r] += bias[r % cols];
  }
}

// P (T, B, ld = n_in + n) on the visited frames t = first + k step: [x[t] (0 on rows where mask is 0) | Yp[t]],
// Yp of the first visited frame y0, then Y[tp] + Yp[tp] (1 - mask[tp]) with tp the previous visited frame.
DEF_KERNEL void lstm2_fill_p(const Float* x, const Float* mask, const Float* y0, const Float* Y, Float* P,
                             int64_t first, int64_t step, int64_t count, int64_t n_batch, int64_t n_in,
                             int64_t n_cells) {
  const int64_t ld = n_in + n_cells;
  GRID_LOOP(i, n_batch * ld) {
    const int64_t b = i / ld, j = i % ld;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t t = first + k * step, row = t * n_batch + b;
      Float v;
      if (j < n_in) {
        v = mask[row] == Float(0) ? Float(0) : x[row * n_in + j];
      } else if (k == 0) {
        v = y0[b * n_cells + j - n_in];
      } else {
        const int64_t prev = (t - step) * n_batch + b;
        v = Y[prev * n_cells + j - n_in] + P[prev * ld + j] * (Float(1) - mask[prev]);
      }
      P[row * ld + j] = v;
    }
  }
}
#endif

#endif  // PTNATIVE_LSTM_LSTM_CUDA_H
