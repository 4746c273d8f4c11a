// Stop requests through sigwait on a dedicated thread.
#include "core/signals.h"

#include <pthread.h>

#include <atomic>
#include <utility>

namespace tessera {
namespace {

std::atomic<int> g_received{0};
std::atomic<bool> g_closing{false};

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

StopSignals::StopSignals(std::function<void(int)> on_signal) : on_signal_(std::move(on_signal)) {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
  g_closing = false;
  thread_ = std::thread([this, set] {
    for (;;) {
      int signo = 0;
      if (sigwait(&set, &signo) != 0) continue;
      if (g_closing) return;
      int none = 0;
      g_received.compare_exchange_strong(none, signo);
      if (on_signal_) on_signal_(signo);
    }
  });
}

StopSignals::~StopSignals() {
  g_closing = true;
  pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait; not a stop request any more
  thread_.join();
  // Requests that came after the last one was taken are dropped, not turned into a default
  // termination by the unblocking below.
  const sigset_t set = stop_set();
  const timespec zero{};
  while (sigtimedwait(&set, nullptr, &zero) > 0) {
  }
  if (g_received != 0) {  // already stopping: later requests must not kill the process mid-exit
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

int StopSignals::received() { return g_received; }

}  // namespace tessera
