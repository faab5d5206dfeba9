// handshake_host.h — the host side of the hybrid handshakes' channels (included by
// handshake_launch.hip only): the mapped control words, a channel's pinned staging and step
// counter, and the one CPU worker thread of the process that serves every channel, polling the
// stream-memop channels' `ready` words and taking the host-function channels' jobs.
//
// Host code (tvm-ffi, the GPU runtime through port.h, threads); no device code.
#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu_job.h"
#include "launch_common.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HS_PAUSE() _mm_pause()
#else
#define HS_PAUSE() std::this_thread::yield()
#endif

namespace ftlab {
namespace hs {
namespace {  // internal linkage: one translation unit (handshake_launch.hip) includes this

using tvm::ffi::TensorView;
using namespace launch;


enum Mechanism : int { kHostFunc = 0, kStreamMemOp = 1 };
// 1: the next job leaves the output words stale (the combine kernel catches it); 2: the same with
// the combine kernel's check switched off until the fault is cleared (a broken handshake, for the
// notebook that shows what an unchecked stale read returns).
enum Fault : int { kNoFault = 0, kSkipOutput = 1, kSkipUnchecked = 2 };
constexpr int kTimeline = 256;

// Mapped pinned control words, a cache line each by who writes them: ready (the GPU; the CPU
// worker polls it), done (the CPU worker; the stream waits on it), errors / unchecked.
struct Control {
  alignas(64) volatile int32_t ready;
  alignas(64) volatile uint32_t done;
  alignas(64) volatile int32_t errors[2];
  volatile int32_t unchecked;  // nonzero: the combine kernel skips its check (fault 2 only)
  int32_t pad[13];
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void check(port_error_t err, const char* what) {
  TVM_FFI_CHECK(err == port_success, RuntimeError) << what << " failed: " << port_error_string(err);
}

struct Channel {
  int mechanism = kHostFunc;
  int device = 0;
  FtlabCpuMoeFn fn = nullptr;
  FtlabCpuMoeJob job{};
  int tokens = 0, top_k = 0, hidden = 0, experts = 0;
  int64_t in_words = 0, out_words = 0;
  int32_t *host_in = nullptr, *host_out = nullptr;  // pinned
  int32_t *dev_in = nullptr, *dev_out = nullptr, *seq = nullptr;
  Control *ctl = nullptr, *ctl_dev = nullptr;
  // the shared worker's bookkeeping of this channel
  int64_t posted = 0, taken = 0, finished = 0;  // host-function jobs (under the worker's mutex)
  int32_t last_ready = 0;                        // the last step seen in `ready` (the worker's)
  std::atomic<int> fault{kNoFault};
  std::atomic<int64_t> jobs{0}, stale_inputs{0}, failures{0}, cpu_ns{0};
  int64_t timeline[kTimeline][4] = {};  // seq, seen, start, end (steady-clock ns)

  int64_t in_trailer() const { return kInHeader + 2LL * tokens * top_k + static_cast<int64_t>(tokens) * hidden; }
  int64_t out_trailer() const { return kOutHeader + static_cast<int64_t>(tokens) * hidden; }

  bool no_cpu_routes() const {
    for (int64_t p = 0; p < static_cast<int64_t>(tokens) * top_k; ++p)
      if (host_in[kInHeader + p] >= 0) return false;
    return true;
  }

  // One job: the staged input must carry step `expect` at both ends.
  void process(int32_t expect, int64_t seen) {
    const int64_t start = now_ns();
    std::atomic_thread_fence(std::memory_order_acquire);
    const int f = fault.exchange(kNoFault);
    if (f == kSkipOutput || f == kSkipUnchecked) {  // a broken handshake: the output words keep the last step
      jobs.fetch_add(1);
      return;
    }
    const int32_t s = host_in[0];
    int32_t status = 0;
    if (s != expect || host_in[in_trailer()] != expect || host_in[1] != tokens || host_in[2] != top_k ||
        host_in[3] != hidden) {
      status = 3;
      stale_inputs.fetch_add(1);
    } else if (no_cpu_routes()) {  // every route on the GPU (or none): y_cpu = 0, no kernel
      std::memset(host_out + kOutHeader, 0, static_cast<size_t>(tokens) * hidden * 4);
    } else {
      status = fn(&job);
      if (status) failures.fetch_add(1);
    }
    host_out[1] = status;
    std::atomic_thread_fence(std::memory_order_release);
    host_out[out_trailer()] = expect;
    host_out[0] = expect;
    std::atomic_thread_fence(std::memory_order_release);
    const int64_t end = now_ns();
    int64_t* row = timeline[jobs.load() % kTimeline];
    row[0] = expect, row[1] = seen, row[2] = start, row[3] = end;
    cpu_ns.fetch_add(end - start);
    jobs.fetch_add(1);
  }

  ~Channel() {
    port_set_device(device);
    if (host_in) port_host_free(host_in);
    if (host_out) port_host_free(host_out);
    if (ctl) port_host_free(ctl);
    if (dev_in) port_free(dev_in);
    if (dev_out) port_free(dev_out);
    if (seq) port_free(seq);
  }
};

// One CPU worker for every channel of the process: one thread, and so one OpenMP team, takes
// the jobs in the order they come (a decode step's layers follow each other anyway), polling
// the ready words of the stream-memory-operation channels and taking the jobs the host-function
// channels post. Per-channel threads would spin one core each and start one OpenMP team each:
// 48 layers' worth on 16 cores. It spins while jobs keep coming, then sleeps in 20 us naps.
class Worker {
 public:
  static Worker& get() {
    static Worker* worker = new Worker();  // lives until the process ends (never joined at exit)
    return *worker;
  }

  void add(Channel* c) {
    std::lock_guard<std::mutex> lk(mu_);
    if (c->mechanism == kStreamMemOp) polled_.push_back(c);
    cv_.notify_all();
  }

  // Called once the device is synchronized: no job of c is pending or running.
  void remove(Channel* c) {
    std::lock_guard<std::mutex> lk(mu_);
    polled_.erase(std::remove(polled_.begin(), polled_.end(), c), polled_.end());
    queue_.erase(std::remove(queue_.begin(), queue_.end(), c), queue_.end());
  }

  // Host-function callbacks: post a job / wait for every job the channel posted.
  static void post(void* self) {
    Worker& w = get();
    Channel* c = static_cast<Channel*>(self);
    std::lock_guard<std::mutex> lk(w.mu_);
    ++c->posted;
    w.queue_.push_back(c);
    w.cv_.notify_all();
  }

  static void join(void* self) {
    Worker& w = get();
    Channel* c = static_cast<Channel*>(self);
    std::unique_lock<std::mutex> lk(w.mu_);
    w.done_.wait(lk, [&] { return c->finished >= c->posted; });
  }

  void release(Channel* c) {  // a probe's deadline passed: pending joins return
    std::lock_guard<std::mutex> lk(mu_);
    c->finished = c->posted;
    done_.notify_all();
  }

 private:
  Worker() : thread_(&Worker::run, this) { thread_.detach(); }

  void run() {
    int64_t idle = 0;
    for (;;) {
      Channel* c = nullptr;
      int32_t ready = 0;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (!queue_.empty()) {
          c = queue_.front();
          queue_.pop_front();
        } else {
          for (Channel* p : polled_) {
            const int32_t r = p->ctl->ready;
            if (r != p->last_ready) {
              c = p, ready = r;
              break;
            }
          }
        }
        if (c == nullptr) {
          if (++idle >= kSpins) cv_.wait_for(lk, std::chrono::microseconds(20));
        }
      }
      if (c == nullptr) {
        HS_PAUSE();
        continue;
      }
      idle = 0;
      if (c->mechanism == kHostFunc) {
        const int64_t j = ++c->taken;  // the worker's own count: the device's step counter
        c->process(static_cast<int32_t>(j), now_ns());
        std::lock_guard<std::mutex> lk(mu_);
        c->finished = j;
        done_.notify_all();
      } else {
        c->last_ready = ready;
        c->process(ready, now_ns());
        std::atomic_thread_fence(std::memory_order_seq_cst);
        c->ctl->done = kDoneBit | (static_cast<uint32_t>(ready) & ~kDoneBit);
      }
    }
  }

  static constexpr int64_t kSpins = 200000;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::vector<Channel*> polled_;
  std::deque<Channel*> queue_;
  std::thread thread_;
};

Channel* channel_of(int64_t handle) {
  TVM_FFI_CHECK(handle != 0, ValueError) << "handshake channel is closed";
  return reinterpret_cast<Channel*>(handle);
}

int32_t* i32_of(const TensorView& t, const char* name) {
  check_contiguous(t, name);
  TVM_FFI_CHECK(t.dtype().code == kDLInt && t.dtype().bits == 32, TypeError) << name << " must be int32";
  return static_cast<int32_t*>(base_of(t));
}


}  // namespace
}  // namespace hs
}  // namespace ftlab
