// SIGTERM and SIGINT as stop requests (preemption), received on a dedicated thread.
//
// The signals are blocked in the thread that creates StopSignals and in every thread it starts
// afterwards, so no signal handler ever interrupts compute. That matters beyond tidiness: oneDNN's
// JIT f32 GEMM before 3.12 points rsp into a heap workspace while it runs, so a signal delivered to
// a thread inside it writes the signal frame into the heap (oneDNN issue 4845; Debian 12 ships
// 2.7). Create it before any other thread exists (before the first OpenMP region).
#pragma once

#include <functional>
#include <thread>

#include <signal.h>

namespace tessera {

class StopSignals {
 public:
  // on_signal, when set, also runs on the signal thread for each signal (e.g. to pass it on).
  explicit StopSignals(std::function<void(int)> on_signal = {});
  // Stops the thread, drops pending requests and restores the signal mask; after a stop request
  // the process ignores SIGTERM and SIGINT from then on (it is already stopping).
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first SIGTERM or SIGINT received since start-up, or 0.
  static int received();

 private:
  sigset_t old_mask_{};
  std::function<void(int)> on_signal_;
  std::thread thread_;
};

}  // namespace tessera
