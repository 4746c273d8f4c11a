// Micro-batches for one data-parallel rank, cut from the train token stream in the sampler's
// order and prefetched on a background thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "data/sampler.h"

namespace tessera::data {

struct LoaderOptions {
  int64_t seq_len = 0;       // T: tokens per sample
  int64_t micro_batch = 0;   // samples per next() on this rank
  int64_t global_batch = 0;  // G: samples per optimizer step over all ranks
  int rank = 0;
  int world = 1;  // W: G / W samples per rank per step, in G / (W * micro_batch) micro-batches
};

// Samples in a stream of `stream_tokens` tokens: sample s is tokens [s*T, s*T + T + 1), so
// neighbours share one token and there are (stream_tokens - 1) / T of them. Throws DataError
// when there is none.
uint64_t num_samples(uint64_t stream_tokens, int64_t seq_len);
// Throws ConfigError, naming the values, unless every size is positive, rank is in [0, W), W
// divides G and micro_batch divides G / W.
void validate(const LoaderOptions& options);

class Loader {
 public:
  // read(begin, n, out) writes tokens [begin, begin + n) of the stream to out; it is called on
  // the loader's thread only (e.g. a lambda over TokenStream::read). Global batch i after `start`
  // covers positions [start + i*G, start + (i+1)*G): a start saved by state() under the same G is
  // a multiple of G, so that is global batch start/G + i of the run. Throws ConfigError or
  // DataError as validate() and num_samples() do.
  Loader(std::function<void(uint64_t, uint64_t, int32_t*)> read, uint64_t stream_tokens, uint64_t seed,
         const LoaderOptions& options, SamplerState start);
  ~Loader();  // stops and joins the thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // inputs and targets: (micro_batch, T) int32, row-major; row i is tokens [s*T, s*T + T) and
  // [s*T + 1, s*T + T + 1) of its sample s, so targets[i][t] = inputs[i][t + 1] for t < T - 1.
  struct Batch {
    const int32_t* inputs;
    const int32_t* targets;
  };
  // This rank's next micro-batch; blocks until it is ready. The pointers stay valid until the
  // next call. Rethrows an exception of `read` once the batches read before it are handed out.
  // Allocates nothing.
  Batch next();
  // The state to save at an optimizer-step boundary: the position after the global batches whose
  // micro-batches this rank has all taken. A loader started from it, at any world size, continues
  // with the next global batch. Call it from the thread that calls next().
  SamplerState state() const;
  // G / (W * micro_batch): the calls of next() per optimizer step.
  int64_t micro_batches_per_step() const { return per_step_; }
  const Sampler& sampler() const { return sampler_; }

 private:
  static constexpr uint64_t kSlots = 3;  // one held by the trainer, two being filled ahead

  void produce();         // the background thread's loop
  bool fill(uint64_t k);  // writes this rank's micro-batch k into its slot; false when stopped
  int32_t* inputs(uint64_t slot) { return buffers_.data() + slot * 2 * rows_; }
  int32_t* targets(uint64_t slot) { return inputs(slot) + rows_; }

  std::function<void(uint64_t, uint64_t, int32_t*)> read_;
  LoaderOptions options_;
  Sampler sampler_;
  uint64_t start_;                // position of the first sample of the first global batch
  int64_t per_step_;              // micro-batches per optimizer step
  uint64_t rows_;                 // micro_batch * T: int32 per inputs or targets buffer
  std::vector<int32_t> buffers_;  // kSlots x (inputs, targets)
  std::vector<int32_t> sample_;   // T + 1 tokens: the producer's scratch

  std::mutex mu_;
  std::condition_variable ready_;   // produced_ advanced or error_ set: wakes next()
  std::condition_variable free_;    // released_ advanced or stop_ set: wakes the producer
  uint64_t produced_ = 0;           // micro-batches [0, produced_) are in their slots
  uint64_t released_ = 0;           // micro-batches [0, released_) are done with; their slots free
  std::exception_ptr error_;        // what read threw; the producer has exited
  std::atomic<bool> stop_ = false;  // written under mu_; read unlocked between samples too
  uint64_t handed_ = 0;             // micro-batches next() returned; the consumer's thread only
  std::thread thread_;              // last: starts after everything above is constructed
};

}  // namespace tessera::data
