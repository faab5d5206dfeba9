// handshake_launch.hip — host side of the hybrid MoE handshakes (docs/OPS.md section 4): a channel per
// (layer, batch size) with its staging buffers and step counter, one CPU worker thread for all
// channels, and the two graph-capturable handshakes that order the GPU stream against the CPU work:
//
//   host function (mechanism 0): after the D2H copy a host-function node posts the job to the
//     worker; the GPU experts run; a second host-function node joins the worker before the H2D
//     copy. Nothing but the CPU thread's own bookkeeping runs inside the callbacks.
//   stream memory operations (mechanism 1): the stream clears the mapped `done` word
//     (WriteValue32), packs, copies, and a one-thread kernel publishes the step counter in the
//     mapped `ready` word; the worker, polling `ready`, computes and writes
//     done = 0x80000000 | seq; the stream waits (WaitValue32, AND 0x80000000) before the H2D copy.
//
// Either way the worker checks that the staged input carries the step it was told about, and the
// combine kernel (handshake.hip) checks that the output carries this step: a stale buffer or flag
// turns into NaN output plus a recorded error that ftlab.hybrid raises, never a silent result.
// Every launch goes to torch's current stream, so a captured CUDA/HIP graph bakes all of it in.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include "handshake.hip"
#include "handshake_host.h"

namespace ftlab {

using tvm::ffi::TensorView;
using namespace launch;
using namespace hs;

// A channel for `tokens` tokens of top_k routes over CPU banks gate_up / down (kind: cpu_job.h),
// on GPU `device`; cpu_fn is the address of ftlab_cpu_moe_job, run with `threads` OpenMP threads
// (0: the OpenMP default). Returns its handle.
int64_t hs_new(int64_t mechanism, int64_t cpu_fn, TensorView gate_up, TensorView down, int64_t kind, int64_t tokens,
               int64_t top_k, int64_t hidden, int64_t inter, int64_t experts, int64_t device, int64_t threads) {
  TVM_FFI_CHECK(mechanism == kHostFunc || mechanism == kStreamMemOp, ValueError)
      << "mechanism must be 0 (host function) or 1 (stream memory operations), got " << mechanism;
  TVM_FFI_CHECK(cpu_fn != 0, ValueError) << "cpu_fn must be the address of ftlab_cpu_moe_job";
  TVM_FFI_CHECK(tokens > 0 && top_k > 0 && hidden > 0 && inter > 0 && experts > 0, ValueError)
      << "tokens, top_k, hidden, inter and experts must be positive";
  TVM_FFI_CHECK(gate_up.device().device_type == kDLCPU && down.device().device_type == kDLCPU, ValueError)
      << "the CPU banks must be host tensors";
  check_contiguous(gate_up, "gate_up");
  check_contiguous(down, "down");
  Channel* c = new Channel();
  c->mechanism = static_cast<int>(mechanism);
  c->device = static_cast<int>(device);
  c->fn = reinterpret_cast<FtlabCpuMoeFn>(cpu_fn);
  c->tokens = static_cast<int>(tokens), c->top_k = static_cast<int>(top_k), c->hidden = static_cast<int>(hidden);
  c->experts = static_cast<int>(experts);
  c->in_words = c->in_trailer() + 1;
  c->out_words = c->out_trailer() + 1;
  try {
    int previous = 0;
    check(port_get_device(&previous), "get device");
    check(port_set_device(c->device), "set device");
    void* p = nullptr;
    check(port_host_alloc_mapped(&p, c->in_words * 4), "pinned input staging");
    c->host_in = static_cast<int32_t*>(p);
    check(port_host_alloc_mapped(&p, c->out_words * 4), "pinned output staging");
    c->host_out = static_cast<int32_t*>(p);
    check(port_host_alloc_mapped(&p, sizeof(Control)), "pinned control words");
    c->ctl = static_cast<Control*>(p);
    std::memset(p, 0, sizeof(Control));
    std::memset(c->host_in, 0, c->in_words * 4);
    std::memset(c->host_out, 0, c->out_words * 4);
    check(port_host_device_pointer(&p, c->ctl), "device pointer of the control words");
    c->ctl_dev = static_cast<Control*>(p);
    check(port_malloc(&p, c->in_words * 4), "device input staging");
    c->dev_in = static_cast<int32_t*>(p);
    check(port_malloc(&p, c->out_words * 4), "device output staging");
    c->dev_out = static_cast<int32_t*>(p);
    check(port_malloc(&p, 4), "step counter");
    c->seq = static_cast<int32_t*>(p);
    check(port_memset(c->seq, 0, 4), "step counter");
    check(port_set_device(previous), "set device");
  } catch (...) {
    delete c;
    throw;
  }
  const int64_t pairs = tokens * top_k;
  c->job = FtlabCpuMoeJob{FTLAB_CPU_JOB_VERSION,
                          static_cast<int32_t>(kind),
                          static_cast<int32_t>(threads),
                          0,
                          tokens,
                          hidden,
                          top_k,
                          experts,
                          inter,
                          reinterpret_cast<const float*>(c->host_in + kInHeader + 2 * pairs),
                          c->host_in + kInHeader,
                          reinterpret_cast<const float*>(c->host_in + kInHeader + pairs),
                          reinterpret_cast<float*>(c->host_out + kOutHeader),
                          base_of(gate_up),
                          base_of(down)};
  Worker::get().add(c);
  return reinterpret_cast<int64_t>(c);
}

// Takes the channel off the worker and frees its buffers; the caller has synchronized the device.
void hs_free(int64_t handle) {
  Channel* c = channel_of(handle);
  Worker::get().remove(c);
  delete c;
}

// Stage the CPU part of a step and hand it over: gpu_ids int32 [T, k] receives the slot ids of
// the GPU routes (-1 elsewhere), read through the live table int32 [E].
void hs_submit(int64_t handle, TensorView x, TensorView ids, TensorView w, TensorView table, TensorView gpu_ids) {
  Channel* c = channel_of(handle);
  TVM_FFI_CHECK(x.ndim() == 2 && x.size(0) == c->tokens && x.size(1) == c->hidden, ValueError)
      << "x must be [" << c->tokens << ", " << c->hidden << "] for this channel";
  TVM_FFI_CHECK(ids.numel() == static_cast<int64_t>(c->tokens) * c->top_k && w.numel() == ids.numel() &&
                    gpu_ids.numel() == ids.numel(),
                ValueError)
      << "ids, w and gpu_ids must hold " << c->tokens << " x " << c->top_k << " routes";
  TVM_FFI_CHECK(table.numel() == c->experts, ValueError) << "table must hold " << c->experts << " slots";
  check_contiguous(x, "x");
  check_contiguous(w, "w");
  TVM_FFI_CHECK(w.dtype().code == kDLFloat && w.dtype().bits == 32, TypeError) << "w must be float32";
  const port_stream_t stream = stream_of(x);
  if (c->mechanism == kStreamMemOp) {
    const int rc = port_stream_write_value32(stream, const_cast<uint32_t*>(&c->ctl_dev->done), 0);
    TVM_FFI_CHECK(rc == 0, RuntimeError) << "stream write-value (clear done) failed: " << rc;
  }
  const int32_t* idp = i32_of(ids, "ids");
  const int32_t* tp = i32_of(table, "table");
  int32_t* gp = i32_of(gpu_ids, "gpu_ids");
  const float* wp = static_cast<const float*>(base_of(w));
  switch (fp_of(x, "x")) {
    case Fp::f32:
      hs_pack_kernel<f32_t><<<1, kHandshakeThreads, 0, stream>>>(static_cast<const float*>(base_of(x)), idp, wp, tp,
                                                                  c->experts, c->tokens, c->top_k, c->hidden, c->seq,
                                                                  gp, c->dev_in);
      break;
    case Fp::f16:
      hs_pack_kernel<f16_t><<<1, kHandshakeThreads, 0, stream>>>(static_cast<const uint16_t*>(base_of(x)), idp, wp,
                                                                  tp, c->experts, c->tokens, c->top_k, c->hidden,
                                                                  c->seq, gp, c->dev_in);
      break;
    case Fp::bf16:
      hs_pack_kernel<bf16_t><<<1, kHandshakeThreads, 0, stream>>>(static_cast<const uint16_t*>(base_of(x)), idp, wp,
                                                                   tp, c->experts, c->tokens, c->top_k, c->hidden,
                                                                   c->seq, gp, c->dev_in);
      break;
  }
  check_launch("hs_pack_kernel");
  check(port_memcpy_async(c->host_in, c->dev_in, c->in_words * 4, port_memcpy_d2h, stream), "D2H staging copy");
  if (c->mechanism == kStreamMemOp) {
    hs_signal_kernel<<<1, 32, 0, stream>>>(c->seq, &c->ctl_dev->ready);
    check_launch("hs_signal_kernel");
  } else {
    check(port_launch_host_func(stream, &Worker::post, c), "host function (post)");
  }
}

// Wait for the CPU part, bring it back and write y = y_gpu + y_cpu (x's dtype, [T, H]).
void hs_join(int64_t handle, TensorView y_gpu, TensorView y) {
  Channel* c = channel_of(handle);
  TVM_FFI_CHECK(y.numel() == static_cast<int64_t>(c->tokens) * c->hidden && y_gpu.numel() == y.numel(), ValueError)
      << "y and y_gpu must be [" << c->tokens << ", " << c->hidden << "]";
  check_contiguous(y, "y");
  check_contiguous(y_gpu, "y_gpu");
  const Fp fp = fp_of(y, "y");
  TVM_FFI_CHECK(fp_of(y_gpu, "y_gpu") == fp, TypeError) << "y_gpu must have y's dtype";
  const port_stream_t stream = stream_of(y);
  if (c->mechanism == kStreamMemOp) {
    const int rc = port_stream_wait_value32_and(stream, const_cast<uint32_t*>(&c->ctl_dev->done), kDoneBit);
    TVM_FFI_CHECK(rc == 0, RuntimeError) << "stream wait-value (done) failed: " << rc;
  } else {
    check(port_launch_host_func(stream, &Worker::join, c), "host function (join)");
  }
  check(port_memcpy_async(c->dev_out, c->host_out, c->out_words * 4, port_memcpy_h2d, stream), "H2D staging copy");
  const volatile uint32_t* done = c->mechanism == kStreamMemOp ? &c->ctl_dev->done : nullptr;
  const int n = c->tokens * c->hidden;
  const unsigned blocks = static_cast<unsigned>(std::min(8, (n + kHandshakeThreads - 1) / kHandshakeThreads));
  switch (fp) {
    case Fp::f32:
      hs_combine_kernel<f32_t><<<blocks, kHandshakeThreads, 0, stream>>>(
          static_cast<const float*>(base_of(y_gpu)), c->dev_out, c->seq, done, &c->ctl_dev->unchecked, c->ctl_dev->errors, c->tokens,
          c->hidden, static_cast<float*>(base_of(y)));
      break;
    case Fp::f16:
      hs_combine_kernel<f16_t><<<blocks, kHandshakeThreads, 0, stream>>>(
          static_cast<const uint16_t*>(base_of(y_gpu)), c->dev_out, c->seq, done, &c->ctl_dev->unchecked, c->ctl_dev->errors, c->tokens,
          c->hidden, static_cast<uint16_t*>(base_of(y)));
      break;
    case Fp::bf16:
      hs_combine_kernel<bf16_t><<<blocks, kHandshakeThreads, 0, stream>>>(
          static_cast<const uint16_t*>(base_of(y_gpu)), c->dev_out, c->seq, done, &c->ctl_dev->unchecked, c->ctl_dev->errors, c->tokens,
          c->hidden, static_cast<uint16_t*>(base_of(y)));
      break;
  }
  check_launch("hs_combine_kernel");
}

// (what failed << 32) | the failing step; 0 when every combined step was this step's answer.
// Read after the stream is synchronized.
int64_t hs_errors(int64_t handle) {
  Channel* c = channel_of(handle);
  std::atomic_thread_fence(std::memory_order_acquire);
  return (static_cast<int64_t>(static_cast<uint32_t>(c->ctl->errors[0])) << 32) |
         static_cast<uint32_t>(c->ctl->errors[1]);
}

void hs_clear_errors(int64_t handle) {
  Channel* c = channel_of(handle);
  c->ctl->errors[0] = 0;
  c->ctl->errors[1] = 0;
}

// Fault injection for tests and the notebook (see Fault); 0 clears both.
void hs_fault(int64_t handle, int64_t mode) {
  TVM_FFI_CHECK(mode == kNoFault || mode == kSkipOutput || mode == kSkipUnchecked, ValueError)
      << "fault mode must be 0, 1 or 2, got " << mode;
  Channel* c = channel_of(handle);
  c->ctl->unchecked = mode == kSkipUnchecked ? 1 : 0;
  c->fault.store(static_cast<int>(mode));
}

// out int64 [5]: jobs, CPU ns in jobs, stale inputs seen, CPU kernel failures, the device's step
// counter as the worker last saw it in the staging (host_in[0]).
void hs_stats(int64_t handle, TensorView out) {
  Channel* c = channel_of(handle);
  TVM_FFI_CHECK(out.device().device_type == kDLCPU && out.dtype().code == kDLInt && out.dtype().bits == 64 &&
                    out.numel() >= 5 && out.IsContiguous(),
                ValueError)
      << "out must be a contiguous CPU int64 tensor of >= 5 elements";
  int64_t* o = static_cast<int64_t*>(base_of(out));
  o[0] = c->jobs.load(), o[1] = c->cpu_ns.load(), o[2] = c->stale_inputs.load(), o[3] = c->failures.load();
  o[4] = c->host_in[0];
}

// out int64 [256, 4]: the last jobs' (step, seen, start, end) in steady-clock ns (ring by job).
void hs_timeline(int64_t handle, TensorView out) {
  Channel* c = channel_of(handle);
  TVM_FFI_CHECK(out.device().device_type == kDLCPU && out.dtype().code == kDLInt && out.dtype().bits == 64 &&
                    out.numel() == kTimeline * 4 && out.IsContiguous(),
                ValueError)
      << "out must be a contiguous CPU int64 tensor [" << kTimeline << ", 4]";
  std::memcpy(base_of(out), c->timeline, sizeof(c->timeline));
}

// Unblock a stream stuck in a handshake (a probe's deadline passed): the done word gets the valid
// bit with a counter of no step, pending host-function joins return; the combine kernel then
// records the step as failed and writes NaN.
void hs_release(int64_t handle) {
  Channel* c = channel_of(handle);
  c->ctl->done = kDoneBit | 0x7fffffffu;
  Worker::get().release(c);
}

int64_t hs_now_ns() { return now_ns(); }

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_new, ftlab::hs_new);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_free, ftlab::hs_free);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_submit, ftlab::hs_submit);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_join, ftlab::hs_join);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_errors, ftlab::hs_errors);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_clear_errors, ftlab::hs_clear_errors);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_fault, ftlab::hs_fault);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_stats, ftlab::hs_stats);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_timeline, ftlab::hs_timeline);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_release, ftlab::hs_release);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(hs_now_ns, ftlab::hs_now_ns);
