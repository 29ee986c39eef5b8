// One worker pool for the process: the threads callback that ptnative/blas_threads.py installs in the OpenBLAS
// libraries of the process (numpy's, scipy's; OpenBLAS >= 0.3.27, openblas_set_threads_callback_function), and
// the runner of the kernels' parallel parts (ptn_parts_run, handed to every kernel library at load time).
//
// Why: after each parallel call, OpenBLAS's own workers wait for the next one by spinning, for about 2^28 CPU
// cycles (0.1 s).  numpy's and scipy's OpenBLAS are two libraries with a pool each, and PyTensor graphs call both
// (Python-mode Dot22 through numpy, C-mode Gemm through scipy) between ptnative's threaded kernels: their spinning
// workers then take a core from the kernels' threads.  With this callback every library's parallel work runs on
// the workers here, which spin for PTN_BLAS_THREADS_SPIN_US microseconds and then sleep; OpenBLAS's own workers go
// to sleep after their last spin and are never woken again.
//
// Semantics (what OpenBLAS requires of the callback): dojob(i, jobdata + i * jobdata_elsize, dojob_data) runs for
// every i < numjobs, all of them at the same time (OpenBLAS's jobs of one call may wait for each other), job 0 on
// the calling thread; the call returns when every job has returned.  Calls into one OpenBLAS library (told apart
// by `dojob`) run one at a time, as on OpenBLAS's own pool: its job i uses the library's buffers of thread i.  The
// workers are started when first needed and kept; a call made while they serve another library's call, or from
// inside a job of the same library (which OpenBLAS does not make), runs its jobs on threads started for it.
// After fork() the child starts its own workers.
#ifndef PTNATIVE_RUNTIME_BLAS_THREADS_H
#define PTNATIVE_RUNTIME_BLAS_THREADS_H

#include <cstddef>
#include <cstdint>

#define PTN_BLAS_THREADS_SPIN_US 50
#define PTN_BLAS_THREADS_EXPORT __attribute__((visibility("default")))

extern "C" {

// OpenBLAS's openblas_dojob_callback: runs one job as thread `thread_num`.
typedef void (*ptn_blas_dojob)(int thread_num, void* jobdata, int dojob_data);

// OpenBLAS's openblas_threads_callback (see above).  `sync` is not read: every call is synchronous.
PTN_BLAS_THREADS_EXPORT void ptn_blas_threads_run(int sync, ptn_blas_dojob dojob, int numjobs, size_t jobdata_elsize,
                                                  void* jobdata, int dojob_data);

// The kernels' parallel parts (c_code/dialect/native_op.h, parallel_parts) on the same workers: job(i, jobdata +
// i * jobdata_elsize, 0) for every i < numjobs, all at once, job 0 on the calling thread; returns when all have
// returned.  Unlike OpenBLAS's calls, two calls with the same `job` may run at once (the second on threads started
// for it while the workers serve the first).  Jobs must not throw.
PTN_BLAS_THREADS_EXPORT void ptn_parts_run(ptn_blas_dojob job, int numjobs, size_t jobdata_elsize, void* jobdata);

// For tests and `python -m ptnative info`: calls of ptn_blas_threads_run and ptn_parts_run with more than one job
// so far, and the workers started (kept for later calls) in this process.
PTN_BLAS_THREADS_EXPORT int64_t ptn_blas_threads_calls(void);
PTN_BLAS_THREADS_EXPORT int ptn_blas_threads_workers(void);

}  // extern "C"

#endif  // PTNATIVE_RUNTIME_BLAS_THREADS_H
