// Memory of the library's own for an HMM kernel's intermediates.  On the CPU each calling thread keeps one buffer
// per slot that only grows, up to HMM_KEEP_DOUBLES: repeated calls neither allocate nor touch fresh pages (a fresh
// megabyte-sized block per call costs more in page faults than an HMM pass, as the allocator returns it to the
// system between calls; a small one still costs a malloc and a free).  Larger requests, and CUDA, take per-call
// scratch memory.  A kernel that needs two blocks at once takes them from two slots.
#ifndef PTNATIVE_HMM_HMM_KEPT_H
#define PTNATIVE_HMM_HMM_KEPT_H

#include "../dialect/kernel.h"

#include "hmm_model.h"

#define HMM_KEEP_DOUBLES ((int64_t)1 << 22)  // 32 MB

// n doubles starting on a 64-byte boundary (as hmm_aligned's), valid until the calling thread's next call with the
// same slot.
template <int Slot>
static double* hmm_kept_doubles(ptn::Scratch& scratch, int64_t n) {
#if !CUDA
  if (n <= HMM_KEEP_DOUBLES) {
    thread_local std::vector<double> kept;
    if ((int64_t)kept.size() < n + 8) kept.resize(n + 8);
    char* at = (char*)kept.data();
    return (double*)(at + (64 - (uintptr_t)at % 64) % 64);
  }
  return hmm_aligned<double>(scratch, n);
#else
  return scratch.get<double>(n);
#endif
}

#endif  // PTNATIVE_HMM_HMM_KEPT_H
