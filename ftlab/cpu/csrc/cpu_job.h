// cpu_job.h — the job a hybrid handshake hands to the CPU expert kernel (ftlab/cpu/csrc/moe_cpu.cc).
//
// The handshake module (handshake_launch.hip, built by nvcc / hipcc) and the CPU module (built by
// the host C++ compiler with -march=native -fopenmp) are separate shared objects of one process:
// the CPU module exports the address of `ftlab_cpu_moe_job`, and the handshake's worker thread
// calls it with this plain struct (no tvm-ffi objects cross the boundary). Plain C, no device code.
#pragma once
#include <stdint.h>

#define FTLAB_CPU_JOB_VERSION 3

enum FtlabCpuBankKind {
  FTLAB_BANK_Q4_0 = 0,
  FTLAB_BANK_F32 = 1,
  FTLAB_BANK_BF16 = 2,
  FTLAB_BANK_F16 = 3,
  FTLAB_BANK_Q8_0 = 4,
  FTLAB_BANK_Q4_K = 5,
  FTLAB_BANK_Q5_K = 6,
  FTLAB_BANK_Q6_K = 7
};
// A job's kind: gate_up's FtlabCpuBankKind | down's << 8. Dense banks share one kind; quantized
// banks (Q4_0, Q8_0, the K-quants) may differ (Q4_K_M: Q4_K gate_up, Q6_K down).
#define FTLAB_CPU_JOB_KIND(gate_up, down) ((gate_up) | ((down) << 8))

// y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])), e = ids[t, j] in [0, experts);
// other ids contribute nothing. x, w, y fp32; ids int32; banks contiguous [E, 2I, *] / [E, H, *].
struct FtlabCpuMoeJob {
  int32_t version;  // FTLAB_CPU_JOB_VERSION
  int32_t kind;     // FTLAB_CPU_JOB_KIND(gate_up's, down's)
  int32_t threads;  // OpenMP threads of the calling thread's parallel regions; 0: the default
  int32_t reserved;
  int64_t tokens, hidden, top_k, experts, inter;
  const float* x;     // [tokens, hidden]
  const int32_t* ids; // [tokens, top_k]
  const float* w;     // [tokens, top_k]
  float* y;           // [tokens, hidden]
  const void* gate_up;
  const void* down;
};

// Returns 0 on success, nonzero when the job is malformed (nothing written then).
typedef int (*FtlabCpuMoeFn)(const struct FtlabCpuMoeJob*);
