// Asynchronous work on emulated streams (emu_runtime.cc). Kernels, copies and memsets run
// synchronously at the call; the emulated NCCL (emu_nccl.cc) runs its collectives on a thread of
// the communicator, so a stream can have work in flight. Stream order is kept: work issued on a
// stream first waits for what the stream has in flight and for the events it was told to wait on
// (cudaStreamWaitEvent); an event recorded on a stream completes when that work has.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

namespace emu {

// One piece of asynchronous work: done once finish() is called.
class Pending {
 public:
  void finish() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    finished_at_ = std::chrono::steady_clock::now();
    cv_.notify_all();
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  // When finish() was called (meaningful once done()).
  std::chrono::steady_clock::time_point finished_at() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_at_;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point finished_at_;
};
using PendingPtr = std::shared_ptr<Pending>;

// What work issued on `stream` now must wait for (empty when nothing is in flight there).
std::vector<PendingPtr> stream_dependencies(cudaStream_t stream);
// `work` becomes the stream's tail: later work on the stream waits for it. work must itself wait
// for stream_dependencies(stream) taken before.
void stream_push(cudaStream_t stream, PendingPtr work);
// Blocks until everything issued on `stream` (nullptr, the legacy stream: on every stream) is done.
void stream_drain(cudaStream_t stream);

}  // namespace emu
