// The worker thread, queue and failure bookkeeping of the host process groups.
#include "comm/host_group.h"

#include <gloo/allreduce.h>

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "core/check.h"

namespace tessera::comm::detail {

std::string shape_text(OpKind kind, int64_t count, DType dtype, int root) {
  if (kind == OpKind::kBarrier) return "no data";
  std::string shape = std::to_string(count) + " x " + (dtype == DType::kF32 ? "f32" : "bf16");
  if (kind == OpKind::kBroadcast) shape += " from rank " + std::to_string(root);
  return shape;
}

uint64_t fnv1a(std::initializer_list<uint64_t> values) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : values) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

std::string failure_message(const OpInfo& op, int rank, int size, const std::string& what) {
  std::string hint;
  if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos) {
    hint =
        " (a peer is slow, hung or gone, or called another operation here: the ranks' collectives are out "
        "of step; compare the operation and sequence number each rank names)";
  }
  return std::string(op_name(op.kind)) + " #" + std::to_string(op.seq) + " on rank " + std::to_string(rank) + " of " +
         std::to_string(size) + " failed (" + op.shape + "): " + what + hint;
}

namespace {

// Bytes this rank sends in gloo::allreduce's ring (gloo/allreduce.cc, ring()): the same
// segmenting, summed over the reduce-scatter and all-gather loops.
uint64_t ring_allreduce_bytes(size_t total_bytes, size_t elem, int rank, int w) {
  const size_t max_segment = elem * std::max<size_t>(1, gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize / elem);
  auto round_up = [](size_t x, size_t m) { return (x + m - 1) / m * m; };
  const size_t segments =
      round_up(std::max((total_bytes + max_segment - 1) / max_segment, static_cast<size_t>(w) * 2), w);
  const size_t per_rank = segments / w;
  const size_t segment_bytes = round_up((total_bytes + segments - 1) / segments, elem);
  auto length = [&](size_t first, size_t i) -> uint64_t {
    size_t offset = ((first * per_rank + i) * segment_bytes) % (segments * segment_bytes);
    return offset >= total_bytes ? 0 : std::min(segment_bytes, total_bytes - offset);
  };
  uint64_t bytes = 0;
  for (size_t i = 0; i < segments - per_rank; ++i) {
    bytes += length(static_cast<size_t>(rank) + 1, i);  // reduce-scatter
    bytes += length(static_cast<size_t>(rank), i);      // all-gather
  }
  return bytes;
}

// Sends this rank makes in gloo::broadcast's binomial tree (gloo/broadcast.cc).
int broadcast_sends(int rank, int root, int w) {
  const size_t vsize = w;
  const size_t vrank = (rank + vsize - root) % vsize;
  size_t dim = 0;
  while ((size_t{1} << dim) < vsize) ++dim;
  size_t mask = (size_t{1} << dim) - 1;
  int sends = 0;
  for (size_t i = 0; i < dim; ++i) {
    mask ^= size_t{1} << i;
    if ((vrank & mask) != 0) continue;
    size_t vpeer = vrank ^ (size_t{1} << i);
    if (vpeer >= vsize) continue;
    if ((vrank & (size_t{1} << i)) == 0) ++sends;
  }
  return sends;
}

}  // namespace

uint64_t ring_bytes(OpKind kind, int64_t count, DType dtype, int root, int rank, int size) {
  if (count <= 0 || size == 1) return 0;
  const size_t elem = dtype_bytes(dtype), c = static_cast<size_t>(count);
  const uint64_t others = static_cast<uint64_t>(size - 1);
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
      return others * c * elem;
    case OpKind::kAllReduce:
      return dtype == DType::kF32 ? ring_allreduce_bytes(c * elem, elem, rank, size)
                                  : 2 * others * ((c + size - 1) / size) * elem;
    case OpKind::kBroadcast:
      return static_cast<uint64_t>(broadcast_sends(rank, root, size)) * c * elem;
    default:
      return 0;
  }
}

void sum_ranks(const uint8_t* const* in, int w, void* out, size_t count, DType dtype) {
  constexpr size_t kBlock = 2048;
  float acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    const size_t n = std::min(kBlock, count - b);
    if (dtype == DType::kF32) {
      std::memcpy(acc, reinterpret_cast<const float*>(in[0]) + b, n * sizeof(float));
      for (int j = 1; j < w; ++j) {
        const float* s = reinterpret_cast<const float*>(in[j]) + b;
        for (size_t i = 0; i < n; ++i) acc[i] += s[i];
      }
      std::memcpy(static_cast<float*>(out) + b, acc, n * sizeof(float));
      continue;
    }
    const uint16_t* s0 = reinterpret_cast<const uint16_t*>(in[0]) + b;
    for (size_t i = 0; i < n; ++i) acc[i] = bf16_to_f32(s0[i]);
    for (int j = 1; j < w; ++j) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(in[j]) + b;
      for (size_t i = 0; i < n; ++i) acc[i] += bf16_to_f32(s[i]);
    }
    uint16_t* o = static_cast<uint16_t*>(out) + b;
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(acc[i]);
  }
}

namespace {

// Completion of one operation. The failure is kept as a message and thrown afresh by each
// wait(), so no exception object is shared between the worker and the waiting threads.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // empty: success

  void finish(std::string e = {}) {
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
};

class HostWork final : public Work {
 public:
  explicit HostWork(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (!state_->error.empty()) throw CollectiveError(state_->error);
  }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace

struct HostGroup::Queued {
  OpInfo op;
  Body body;
  std::shared_ptr<WorkState> state;
};

HostGroup::HostGroup(int rank, int size) : rank_(rank), size_(size) {
  for (auto& b : bytes_) b.store(0);
  worker_ = std::thread([this] { run(); });
}

HostGroup::~HostGroup() { stop_worker(); }

void HostGroup::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string HostGroup::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

void HostGroup::mark_broken(const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = error;
  }
  on_broken();
}

void HostGroup::abort() {
  std::deque<std::unique_ptr<Queued>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = "the group was aborted on rank " + std::to_string(rank_);
    dropped.swap(queue_);
  }
  for (auto& q : dropped) q->state->finish(failure_message(q->op, rank_, size_, "the group was aborted"));
  on_broken();
}

uint64_t HostGroup::bytes_sent(OpKind op) const {
  CHECK(op != OpKind::kCount);
  return bytes_[static_cast<int>(op)].load(std::memory_order_relaxed);
}

std::unique_ptr<Work> HostGroup::enqueue(OpKind kind, int64_t count, DType dtype, int root, Body body) {
  CHECK(count >= 0);
  auto state = std::make_shared<WorkState>();
  const uint64_t h = fnv1a({uint64_t(kind), uint64_t(count), uint64_t(dtype), uint64_t(root)});
  const bool empty = count == 0 && kind != OpKind::kBarrier;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto q = std::make_unique<Queued>(Queued{
        {kind, next_seq_++, count, dtype, root, h, shape_text(kind, count, dtype, root)}, std::move(body), state});
    if (empty) {
      state->finish();
    } else {
      queue_.push_back(std::move(q));
    }
  }
  cv_.notify_all();
  return std::make_unique<HostWork>(state);
}

void HostGroup::run() {
  for (;;) {
    std::unique_ptr<Queued> q;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      q = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    if (!broken.empty()) {
      q->state->finish(failure_message(q->op, rank_, size_, "group unusable after an earlier failure: " + broken));
      continue;
    }
    std::string error;
    try {
      q->body(q->op);
      add_bytes(q->op.kind, ring_bytes(q->op.kind, q->op.count, q->op.dtype, q->op.root, rank_, size_));
    } catch (const std::exception& e) {
      error = failure_message(q->op, rank_, size_, e.what());
      mark_broken(error);  // peers blocked on this rank learn within milliseconds, not at their timeout
    }
    q->state->finish(error);
  }
}

}  // namespace tessera::comm::detail
