// ProcessGroup over Gloo's TCP transport: one worker thread per group runs collectives in FIFO
// order; failures become CollectiveError and close every connection so that peers fail fast.
//
// Reduce-scatter is gloo::alltoall into a scratch buffer followed by a local fp32 sum, not
// Gloo's legacy ReduceScatterHalvingDoubling. The legacy algorithm has int element and byte
// counts (chunking under 2 GiB), no per-operation timeout (only the context's, shared with
// every other operation) and float/double only. alltoall is new-style (per-op timeout, size_t
// sizes), sends the same bytes as a ring reduce-scatter, (W-1) x count x elem per rank, and
// lets bf16 be reduced with fp32 accumulation for free. The price is a scratch buffer of
// W x count elements (allocated on first use, grown only, then reused) and W-1 concurrent
// streams instead of one ring neighbour.
//
// Bytes each call adds to bytes_sent(op) on this rank (payload handed to the transport;
// elem = dtype_bytes, c = count, W = size; 0 when W == 1 or c == 0):
//   all_gather      (W-1) c elem                          Gloo ring all-gather
//   reduce_scatter  (W-1) c elem                          alltoall of W chunks of c
//   all_reduce f32  Gloo ring (reduce-scatter + all-gather of segments); this rank's segment
//                   bytes, mirrored from Gloo in ring_allreduce_bytes: 2 (W-1)/W c elem when
//                   c elem splits into whole segments (c a multiple of 2W and c elem <= 2 MiB
//                   x W, or a multiple of 1 MiB segments); summed over ranks always 2 (W-1) c elem
//   all_reduce bf16 2 (W-1) ceil(c/W) elem                reduce-scatter + all-gather, padded
//   broadcast       k c elem, k = this rank's children in Gloo's binomial tree rooted at root
//                   (root: ceil(log2 W) when W is a power of two; leaves 0)
//   barrier         0 (Gloo's dissemination barrier sends ceil(log2 W) empty messages)
//   send            c elem (recv: 0)
//
// Ranks whose collectives are out of step (one skipped a call) must fail, not crash or mix up
// data. Gloo matches messages by tag, and two calls of different sizes under one tag end in an
// assertion on Gloo's I/O thread that terminates the process ("op.preamble.length <=
// op.nbytes"). So the tag carries the call's signature (kind, count, dtype, root) beside its
// sequence number: calls that differ never meet, every rank waits at its own call and fails at
// its timeout, naming the operation, its sequence number and its shape. Calls of the same
// signature still match each other; only a header exchanged per call could tell them apart.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/process_group.h"
#include "core/bf16.h"
#include "core/check.h"

namespace tessera::comm {

size_t dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kSendRecv:
      return "send_recv";
    case OpKind::kCount: break;
  }
  return "?";
}

namespace detail {

// A tessera Store seen as Gloo's rendezvous store. Every key gets `prefix`, and every get/wait
// is bounded by one deadline, so the whole rendezvous honours the caller's timeout.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(tessera::comm::Store& store, std::string prefix, Millis timeout)
      : store_(store), prefix_(std::move(prefix)), deadline_(std::chrono::steady_clock::now() + timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    Bytes v = store_.get(prefix_ + key, remaining());
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, remaining()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_.wait(full, std::min(timeout, remaining()));
  }

 private:
  Millis remaining() const {
    auto left = std::chrono::duration_cast<Millis>(deadline_ - std::chrono::steady_clock::now());
    return std::max(left, Millis(0));
  }

  tessera::comm::Store& store_;
  std::string prefix_;
  std::chrono::steady_clock::time_point deadline_;
};

using tessera::bf16_to_f32;
using tessera::f32_to_bf16;

void sum_f32(void* c, const void* a, const void* b, size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// out[i] = sum over j < w of chunks[j*count + i], accumulated in fp32 in rank order (so every
// rank computes bit-identical sums). out may alias anything but chunks.
void sum_chunks(const uint8_t* chunks, void* out, size_t count, int w, DType dtype) {
  if (dtype == DType::kF32) {
    const float* in = reinterpret_cast<const float*>(chunks);
    float* o = static_cast<float*>(out);
    std::memcpy(o, in, count * 4);
    for (int j = 1; j < w; ++j) {
      const float* s = in + static_cast<size_t>(j) * count;
      for (size_t i = 0; i < count; ++i) o[i] += s[i];
    }
    return;
  }
  const uint16_t* in = reinterpret_cast<const uint16_t*>(chunks);
  uint16_t* o = static_cast<uint16_t*>(out);
  constexpr size_t kBlock = 2048;
  float acc[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {
    size_t n = std::min(kBlock, count - b);
    for (size_t i = 0; i < n; ++i) acc[i] = bf16_to_f32(in[b + i]);
    for (int j = 1; j < w; ++j) {
      const uint16_t* s = in + static_cast<size_t>(j) * count + b;
      for (size_t i = 0; i < n; ++i) acc[i] += bf16_to_f32(s[i]);
    }
    for (size_t i = 0; i < n; ++i) o[b + i] = f32_to_bf16(acc[i]);
  }
}

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

class GlooWork final : public Work {
 public:
  explicit GlooWork(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (!state_->error.empty()) throw CollectiveError(state_->error);
  }

 private:
  std::shared_ptr<WorkState> state_;
};

// A posted send or recv: waiting completes it on the caller's thread, within the timeout.
class GlooPointToPointWork final : public Work {
 public:
  GlooPointToPointWork(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, bool send, Millis timeout,
                       std::string what, std::function<void(const std::string&)> on_failure)
      : buffer_(std::move(buffer)),
        send_(send),
        timeout_(timeout),
        what_(std::move(what)),
        on_failure_(std::move(on_failure)) {}
  // An unwaited operation is still pending in Gloo, which reads or writes the caller's memory:
  // its owner must wait before it lets the memory go.
  void wait() override {
    if (done_) return;
    done_ = true;
    std::string error;
    try {
      const bool completed = send_ ? buffer_->waitSend(timeout_) : buffer_->waitRecv(timeout_);
      if (!completed) error = "aborted";
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty()) return;
    on_failure_(what_ + " failed: " + error);
    throw CollectiveError(what_ + " failed: " + error +
                          " (the peer is slow, hung or gone, or posted another count or tag: compare what each "
                          "rank names)");
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  bool send_;
  Millis timeout_;
  std::string what_;
  std::function<void(const std::string&)> on_failure_;
  bool done_ = false;
};

class GlooGroup final : public ProcessGroup {
 public:
  GlooGroup(int rank, int size, std::shared_ptr<gloo::rendezvous::Context> context)
      : rank_(rank), size_(size), context_(std::move(context)) {
    for (auto& b : bytes_) b.store(0);
    worker_ = std::thread([this] { run(); });
  }

  // Drains the queue (pending operations run, or fail at once if the group is broken), then
  // joins the worker.
  ~GlooGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Work> all_gather(const void* in, void* out, int64_t count, DType dtype,
                                   const CollectiveOptions& options) override {
    CHECK(count >= 0);
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    return enqueue(OpKind::kAllGather, count, dtype, 0, uint64_t(size_ - 1) * nbytes, count == 0,
                   [=, this](uint32_t tag) {
                     uint8_t* o = static_cast<uint8_t*>(out);
                     uint8_t* mine = o + static_cast<size_t>(rank_) * nbytes;
                     if (size_ == 1) {
                       if (in != mine) std::memmove(mine, in, nbytes);
                       return;
                     }
                     gloo::AllgatherOptions opts(context_);
                     // In place when `in` already sits at this rank's slot of `out`.
                     if (in != mine) opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), nbytes);
                     opts.setOutput(o, nbytes * size_);
                     opts.setTag(tag);
                     opts.setTimeout(options.timeout);
                     gloo::allgather(opts);
                   });
  }

  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                       const CollectiveOptions& options) override {
    CHECK(count >= 0);
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    return enqueue(OpKind::kReduceScatter, count, dtype, 0, uint64_t(size_ - 1) * nbytes, count == 0,
                   [=, this](uint32_t tag) {
                     const uint8_t* src = static_cast<const uint8_t*>(in);
                     if (size_ == 1) {
                       if (src != out) std::memmove(out, src, nbytes);
                       return;
                     }
                     uint8_t* chunks = grow(scratch_, nbytes * size_);
                     alltoall(const_cast<uint8_t*>(src), chunks, nbytes * size_, tag, options.timeout);
                     sum_chunks(chunks, out, static_cast<size_t>(count), size_, dtype);
                   });
  }

  std::unique_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, const CollectiveOptions& options) override {
    CHECK(count >= 0);
    const size_t elem = dtype_bytes(dtype);
    const size_t c = static_cast<size_t>(count);
    const size_t chunk = (c + size_ - 1) / size_;
    uint64_t bytes = 0;
    if (count > 0 && size_ > 1)
      bytes = dtype == DType::kF32 ? ring_allreduce_bytes(c * elem, elem, rank_, size_)
                                   : 2 * uint64_t(size_ - 1) * chunk * elem;
    return enqueue(OpKind::kAllReduce, count, dtype, 0, bytes, count == 0, [=, this](uint32_t tag) {
      if (size_ == 1) return;
      if (dtype == DType::kF32) {
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(static_cast<float*>(data), c);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);  // bcube misbehaves at 2 ranks
        opts.setReduceFunction(&sum_f32);
        opts.setTag(tag);
        opts.setTimeout(options.timeout);
        gloo::allreduce(opts);
        return;
      }
      // bf16: reduce-scatter (fp32 accumulation, one rounding) + all-gather over W chunks of
      // ceil(c/W), zero-padded.
      const size_t chunk_bytes = chunk * elem;
      uint8_t* padded = grow(scratch2_, chunk_bytes * size_);
      std::memcpy(padded, data, c * elem);
      std::memset(padded + c * elem, 0, chunk_bytes * size_ - c * elem);
      uint8_t* chunks = grow(scratch_, chunk_bytes * size_);
      alltoall(padded, chunks, chunk_bytes * size_, tag, options.timeout);
      sum_chunks(chunks, padded + rank_ * chunk_bytes, chunk, size_, dtype);
      gloo::AllgatherOptions opts(context_);
      opts.setOutput(padded, chunk_bytes * size_);
      opts.setTag(tag);
      opts.setTimeout(options.timeout);
      gloo::allgather(opts);
      std::memcpy(data, padded, c * elem);
    });
  }

  std::unique_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root,
                                  const CollectiveOptions& options) override {
    CHECK(count >= 0);
    CHECK(root >= 0 && root < size_);
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    return enqueue(OpKind::kBroadcast, count, dtype, root, uint64_t(broadcast_sends(rank_, root, size_)) * nbytes,
                   count == 0,
                   [=, this](uint32_t tag) {
                     if (size_ == 1) return;
                     gloo::BroadcastOptions opts(context_);
                     opts.setOutput(static_cast<uint8_t*>(data), nbytes);
                     opts.setRoot(root);
                     opts.setTag(tag);
                     opts.setTimeout(options.timeout);
                     gloo::broadcast(opts);
                   });
  }

  std::unique_ptr<Work> barrier(const CollectiveOptions& options) override {
    return enqueue(OpKind::kBarrier, 0, DType::kF32, 0, 0, false, [=, this](uint32_t tag) {
      if (size_ == 1) return;
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(options.timeout);
      gloo::barrier(opts);
    });
  }

  std::unique_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                             const CollectiveOptions& options) override {
    return point_to_point(OpKind::kSend, const_cast<void*>(data), count, dtype, peer, tag, options);
  }
  std::unique_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                             const CollectiveOptions& options) override {
    return point_to_point(OpKind::kRecv, data, count, dtype, peer, tag, options);
  }

  // Queued operations fail now. An operation already running on the worker cannot be woken
  // (Gloo's close does not signal local waiters): it fails when its peers, seeing the closed
  // connections, stop, or at its timeout.
  void abort() override {
    std::deque<Op> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.empty()) broken_ = "the group was aborted on rank " + std::to_string(rank_);
      dropped.swap(queue_);
    }
    for (auto& op : dropped) op.state->finish(failure(op, "the group was aborted"));
    if (context_) context_->closeConnections();
  }

  uint64_t bytes_sent(OpKind op) const override {
    CHECK(op != OpKind::kCount);
    return bytes_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }

 private:
  struct Op {
    OpKind kind;
    uint64_t seq;
    std::string shape;  // e.g. "1000 x f32", for messages
    uint32_t tag;       // the low 16 bits of seq, and a 16-bit hash of the signature above them
    uint64_t bytes;
    std::function<void(uint32_t)> body;
    std::shared_ptr<WorkState> state;
  };

  // A count-0 call (`empty`) moves nothing and completes at once, but still takes a sequence
  // number so that the ranks' numbering stays aligned.
  std::unique_ptr<Work> enqueue(OpKind kind, int64_t count, DType dtype, int root, uint64_t bytes, bool empty,
                                std::function<void(uint32_t)> body) {
    auto state = std::make_shared<WorkState>();
    std::string shape = std::to_string(count) + " x " + (dtype == DType::kF32 ? "f32" : "bf16");
    if (kind == OpKind::kBroadcast) shape += " from rank " + std::to_string(root);
    if (kind == OpKind::kBarrier) shape = "no data";
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the signature
    for (uint64_t v : {uint64_t(kind), uint64_t(count), uint64_t(dtype), uint64_t(root)}) {
      for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t seq = next_seq_++;
      const uint32_t tag = static_cast<uint32_t>(seq & 0xffff) | static_cast<uint32_t>((h ^ (h >> 32)) & 0xffff) << 16;
      Op op{kind, seq, std::move(shape), tag, bytes, std::move(body), state};
      if (empty) {
        state->finish();
      } else {
        queue_.push_back(std::move(op));
      }
    }
    cv_.notify_all();
    return std::make_unique<GlooWork>(state);
  }

  // Gloo's slot for a point-to-point call: a prefix no collective uses, the caller's tag, and a
  // hash of the count and dtype, so that a send and a recv of different shapes never meet (Gloo
  // would assert on the length).
  static constexpr uint8_t kPointToPointSlotPrefix = 0x40;

  std::unique_ptr<Work> point_to_point(OpKind kind, void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                                       const CollectiveOptions& options) {
    CHECK(count >= 0);
    CHECK_MSG(peer >= 0 && peer < size_ && peer != rank_, "point to point needs another rank of the group");
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over (count, dtype)
    for (uint64_t v : {uint64_t(count), uint64_t(dtype)}) {
      for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    }
    const uint64_t slot = gloo::Slot::build(kPointToPointSlotPrefix, tag) ^ ((h & 0xffffff) << 32);
    const bool is_send = kind == OpKind::kSend;
    const std::string what = std::string(op_name(kind)) + " tag " + std::to_string(tag) + (is_send ? " to" : " from") +
                             " rank " + std::to_string(peer) + " on rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + " (" + std::to_string(count) + " x " +
                             (dtype == DType::kF32 ? "f32" : "bf16") + ")";
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.empty())
        throw CollectiveError(what + " failed: group unusable after an earlier failure: " + broken_);
    }
    // A zero-byte buffer still travels (Gloo sends an empty message), so both sides stay matched.
    static char empty;
    auto buffer = context_->createUnboundBuffer(nbytes > 0 ? data : &empty, nbytes);
    if (is_send) {
      buffer->send(peer, slot);
      bytes_[static_cast<int>(kind)].fetch_add(nbytes, std::memory_order_relaxed);
    } else {
      buffer->recv(peer, slot);
    }
    return std::make_unique<GlooPointToPointWork>(std::move(buffer), is_send, options.timeout, what,
                                                  [this](const std::string& error) {
                                                    {
                                                      std::lock_guard<std::mutex> lock(mu_);
                                                      if (broken_.empty()) broken_ = error;
                                                    }
                                                    if (context_) context_->closeConnections();
                                                  });
  }

  std::string failure(const Op& op, const std::string& what) const {
    std::string hint;
    if (what.find("Timed out") != std::string::npos) {
      hint = " (a peer is slow, hung or gone, or called another operation here: the ranks' collectives are out "
             "of step; compare the operation and sequence number each rank names)";
    }
    return std::string(op_name(op.kind)) + " #" + std::to_string(op.seq) + " on rank " + std::to_string(rank_) +
           " of " + std::to_string(size_) + " failed (" + op.shape + "): " + what + hint;
  }

  void run() {
    for (;;) {
      Op op;
      std::string broken;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
        broken = broken_;
      }
      if (!broken.empty()) {
        op.state->finish(failure(op, "group unusable after an earlier failure: " + broken));
        continue;
      }
      std::string error;
      try {
        op.body(op.tag);
        bytes_[static_cast<int>(op.kind)].fetch_add(op.bytes, std::memory_order_relaxed);
      } catch (const std::exception& e) {
        error = failure(op, e.what());
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (broken_.empty()) broken_ = error;
        }
        // Peers blocked on this rank learn within milliseconds instead of at their timeout.
        if (context_) context_->closeConnections();
      }
      op.state->finish(error);
    }
  }

  void alltoall(uint8_t* in, uint8_t* out, size_t nbytes, uint32_t tag, Millis timeout) {
    gloo::AlltoallOptions opts(context_);
    opts.setInput(in, nbytes);
    opts.setOutput(out, nbytes);
    opts.setTag(tag);
    opts.setTimeout(timeout);
    gloo::alltoall(opts);
  }

  // Worker-thread scratch: grows to the largest request, never shrinks, so a warm group does not
  // allocate per call.
  static uint8_t* grow(std::vector<uint8_t>& buf, size_t n) {
    if (buf.size() < n) buf.resize(n);
    return buf.data();
  }

  const int rank_;
  const int size_;
  std::shared_ptr<gloo::rendezvous::Context> context_;  // null when size_ == 1

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  uint64_t next_seq_ = 0;
  bool stop_ = false;
  std::string broken_;  // first failure; non-empty means the group is unusable

  std::vector<uint8_t> scratch_;   // alltoall output (worker only)
  std::vector<uint8_t> scratch2_;  // padded bf16 all-reduce buffer (worker only)
  std::atomic<uint64_t> bytes_[static_cast<int>(OpKind::kCount)];
  std::thread worker_;
};

}  // namespace detail

std::unique_ptr<ProcessGroup> make_gloo_group(Store& store, int rank, int size, const std::string& interface_host,
                                              Millis timeout) {
  CHECK(size >= 1 && rank >= 0 && rank < size);
  if (size == 1) return std::make_unique<detail::GlooGroup>(rank, size, nullptr);
  // Each rank counts the groups it has built on this store; ranks build groups in the same
  // order, so they agree on a fresh prefix and never meet keys of an earlier group.
  const int64_t generation = store.add("gloo/generation/rank" + std::to_string(rank), 1);
  const std::string prefix = "gloo/" + std::to_string(generation) + "/";
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = interface_host;
    attr.ai_family = AF_INET;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    detail::GlooStoreAdapter adapter(store, prefix, timeout);
    context->connectFullMesh(adapter, device);
    return std::make_unique<detail::GlooGroup>(rank, size, std::move(context));
  } catch (const StoreError& e) {
    throw StoreError("rendezvous of rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " + e.what());
  } catch (const std::exception& e) {
    throw CollectiveError("rendezvous of rank " + std::to_string(rank) + " of " + std::to_string(size) + " on " +
                          interface_host + " (store prefix " + prefix + ") failed: " + e.what());
  }
}

}  // namespace tessera::comm
