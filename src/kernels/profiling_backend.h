// A backend that runs another's ops one at a time and times each: `tessera bench --profile-ops`,
// the breakdown of a step by op (which kernels a step spends its time in, on a GPU as on the CPU).
// Each op is bracketed by the inner backend's synchronize(), so its time is its own work and
// nothing queued before it; the price is the overlap the step loses (on a GPU, the host's
// launching ahead of the device), so a profiled step is slower than a plain one and its op times
// add up to more than a plain step's. Memory, queries and synchronize() pass through untimed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/backend.h"

namespace tessera::kernels {

// Calls and seconds by op (the Backend method's name), from every thread that ran one.
class OpProfile {
 public:
  struct Total {
    int64_t calls = 0;
    double seconds = 0.0;
  };
  void add(const char* op, double seconds);
  void reset();
  std::map<std::string, Total> totals() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Total> totals_;
};

// `inner` and `profile` must outlive the backend.
std::unique_ptr<Backend> make_profiling_backend(Backend& inner, OpProfile& profile);

}  // namespace tessera::kernels
