// The loader's producer/consumer ring: the background thread reads micro-batch k into slot
// k mod kSlots once micro-batch k - kSlots is released, which next() does on its following call.
#include "data/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"

namespace tessera::data {

uint64_t num_samples(uint64_t stream_tokens, int64_t seq_len) {
  if (seq_len <= 0) throw ConfigError(fmt::format("seq_len must be positive, got {}", seq_len));
  const uint64_t n = stream_tokens == 0 ? 0 : (stream_tokens - 1) / static_cast<uint64_t>(seq_len);
  if (n < 1) throw DataError(fmt::format("dataset too small for seq_len {}: {} tokens", seq_len, stream_tokens));
  return n;
}

void validate(const LoaderOptions& o) {
  if (o.seq_len <= 0) throw ConfigError(fmt::format("seq_len must be positive, got {}", o.seq_len));
  if (o.micro_batch <= 0) throw ConfigError(fmt::format("micro_batch must be positive, got {}", o.micro_batch));
  if (o.global_batch <= 0) throw ConfigError(fmt::format("global batch must be positive, got {}", o.global_batch));
  if (o.world <= 0) throw ConfigError(fmt::format("world size must be positive, got {}", o.world));
  if (o.rank < 0 || o.rank >= o.world) throw ConfigError(fmt::format("rank {} is not in [0, {})", o.rank, o.world));
  if (o.global_batch % o.world != 0) {
    throw ConfigError(fmt::format("global batch {} is not divisible by the world size {}", o.global_batch, o.world));
  }
  if ((o.global_batch / o.world) % o.micro_batch != 0) {
    throw ConfigError(
        fmt::format("per-rank batch {} (global batch {} / world size {}) is not divisible by micro_batch {}",
                    o.global_batch / o.world, o.global_batch, o.world, o.micro_batch));
  }
}

namespace {
const LoaderOptions& validated(const LoaderOptions& o) {
  validate(o);
  return o;
}
}  // namespace

Loader::Loader(std::function<void(uint64_t, uint64_t, int32_t*)> read, uint64_t stream_tokens, uint64_t seed,
               const LoaderOptions& options, SamplerState start)
    : read_(std::move(read)),
      options_(validated(options)),
      sampler_(data::num_samples(stream_tokens, options.seq_len), seed),
      start_(start.position),
      per_step_(options.global_batch / (options.world * options.micro_batch)),
      rows_(static_cast<uint64_t>(options.micro_batch * options.seq_len)),
      buffers_(kSlots * 2 * rows_),
      sample_(static_cast<size_t>(options.seq_len + 1)) {
  thread_ = std::thread([this] { produce(); });
}

Loader::~Loader() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  free_.notify_all();
  thread_.join();
}

bool Loader::fill(uint64_t k) {
  const uint64_t g = static_cast<uint64_t>(options_.global_batch), w = static_cast<uint64_t>(options_.world);
  const uint64_t mb = static_cast<uint64_t>(options_.micro_batch), t = static_cast<uint64_t>(options_.seq_len);
  const uint64_t per_step = static_cast<uint64_t>(per_step_);
  const uint64_t first =
      start_ + (k / per_step) * g + static_cast<uint64_t>(options_.rank) * (g / w) + (k % per_step) * mb;
  int32_t* in = inputs(k % kSlots);
  int32_t* tg = targets(k % kSlots);
  for (uint64_t i = 0; i < mb; ++i) {
    if (stop_.load(std::memory_order_relaxed)) return false;
    read_(sampler_.sample_at(first + i) * t, t + 1, sample_.data());
    std::copy_n(sample_.data(), t, in + i * t);
    std::copy_n(sample_.data() + 1, t, tg + i * t);
  }
  return true;
}

void Loader::produce() {
  for (uint64_t k = 0;; ++k) {
    {
      std::unique_lock lock(mu_);
      free_.wait(lock, [&] { return stop_ || k - released_ < kSlots; });
      if (stop_) return;
    }
    // Filled unlocked: the slot is ours until produced_ publishes it, and the mutex orders the
    // writes here before next()'s reads and next()'s release before our next writes.
    try {
      if (!fill(k)) return;
    } catch (...) {
      {
        std::lock_guard lock(mu_);
        error_ = std::current_exception();
      }
      ready_.notify_one();
      return;
    }
    {
      std::lock_guard lock(mu_);
      produced_ = k + 1;
    }
    ready_.notify_one();
  }
}

Loader::Batch Loader::next() {
  std::unique_lock lock(mu_);
  if (released_ < handed_) {  // the caller is done with the batch the previous call returned
    released_ = handed_;
    free_.notify_one();
  }
  ready_.wait(lock, [&] { return produced_ > handed_ || error_; });
  if (produced_ <= handed_) std::rethrow_exception(error_);
  const uint64_t slot = handed_++ % kSlots;
  return {inputs(slot), targets(slot)};
}

SamplerState Loader::state() const {
  const uint64_t steps = handed_ / static_cast<uint64_t>(per_step_);
  return {start_ + steps * static_cast<uint64_t>(options_.global_batch)};
}

}  // namespace tessera::data
