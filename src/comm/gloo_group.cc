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
#include <cstring>
#include <functional>

#include "comm/host_group.h"
#include "comm/process_group.h"
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

void sum_f32(void* c, const void* a, const void* b, size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// out = the sum of the w chunks of `count` elements that sit one after another in `chunks`.
void sum_chunks(const uint8_t* chunks, void* out, size_t count, int w, DType dtype) {
  std::vector<const uint8_t*> in(static_cast<size_t>(w));
  for (int j = 0; j < w; ++j) in[j] = chunks + static_cast<size_t>(j) * count * dtype_bytes(dtype);
  sum_ranks(in.data(), w, out, count, dtype);
}

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

class GlooGroup final : public HostGroup {
 public:
  GlooGroup(int rank, int size, std::shared_ptr<gloo::rendezvous::Context> context)
      : HostGroup(rank, size), context_(std::move(context)) {}

  // Drains the queue (pending operations run, or fail at once if the group is broken), then
  // joins the worker.
  ~GlooGroup() override { stop_worker(); }

  std::string transport() const override { return "TCP (Gloo)"; }

  std::unique_ptr<Work> all_gather(const void* in, void* out, int64_t count, DType dtype,
                                   const CollectiveOptions& options) override {
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    return enqueue(OpKind::kAllGather, count, dtype, 0, [=, this](const OpInfo& op) {
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
      opts.setTag(tag(op));
      opts.setTimeout(options.timeout);
      gloo::allgather(opts);
    });
  }

  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                       const CollectiveOptions& options) override {
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    return enqueue(OpKind::kReduceScatter, count, dtype, 0, [=, this](const OpInfo& op) {
      const uint8_t* src = static_cast<const uint8_t*>(in);
      if (size_ == 1) {
        if (src != out) std::memmove(out, src, nbytes);
        return;
      }
      uint8_t* chunks = grow(scratch_, nbytes * size_);
      alltoall(const_cast<uint8_t*>(src), chunks, nbytes * size_, tag(op), options.timeout);
      sum_chunks(chunks, out, static_cast<size_t>(count), size_, dtype);
    });
  }

  std::unique_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, const CollectiveOptions& options) override {
    const size_t elem = dtype_bytes(dtype);
    const size_t c = static_cast<size_t>(count);
    const size_t chunk = (c + size_ - 1) / size_;
    return enqueue(OpKind::kAllReduce, count, dtype, 0, [=, this](const OpInfo& op) {
      if (size_ == 1) return;
      if (dtype == DType::kF32) {
        gloo::AllreduceOptions opts(context_);
        opts.setOutput(static_cast<float*>(data), c);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);  // bcube misbehaves at 2 ranks
        opts.setReduceFunction(&sum_f32);
        opts.setTag(tag(op));
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
      alltoall(padded, chunks, chunk_bytes * size_, tag(op), options.timeout);
      sum_chunks(chunks, padded + rank_ * chunk_bytes, chunk, size_, dtype);
      gloo::AllgatherOptions opts(context_);
      opts.setOutput(padded, chunk_bytes * size_);
      opts.setTag(tag(op));
      opts.setTimeout(options.timeout);
      gloo::allgather(opts);
      std::memcpy(data, padded, c * elem);
    });
  }

  std::unique_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root,
                                  const CollectiveOptions& options) override {
    CHECK(root >= 0 && root < size_);
    const size_t nbytes = static_cast<size_t>(count) * dtype_bytes(dtype);
    return enqueue(OpKind::kBroadcast, count, dtype, root, [=, this](const OpInfo& op) {
      if (size_ == 1) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), nbytes);
      opts.setRoot(root);
      opts.setTag(tag(op));
      opts.setTimeout(options.timeout);
      gloo::broadcast(opts);
    });
  }

  std::unique_ptr<Work> barrier(const CollectiveOptions& options) override {
    return enqueue(OpKind::kBarrier, 0, DType::kF32, 0, [=, this](const OpInfo& op) {
      if (size_ == 1) return;
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag(op));
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

 private:
  // An operation already running on the worker cannot be woken (Gloo's close does not signal
  // local waiters): it fails when its peers, seeing the closed connections, stop, or at its
  // timeout.
  void on_broken() override {
    if (context_) context_->closeConnections();
  }

  // Gloo's tag for a collective: the low 16 bits of its sequence number, and 16 bits of its
  // signature above them.
  static uint32_t tag(const OpInfo& op) {
    return static_cast<uint32_t>(op.seq & 0xffff) |
           static_cast<uint32_t>((op.signature ^ (op.signature >> 32)) & 0xffff) << 16;
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
    const uint64_t h = fnv1a({uint64_t(count), uint64_t(dtype)});
    const uint64_t slot = gloo::Slot::build(kPointToPointSlotPrefix, tag) ^ ((h & 0xffffff) << 32);
    const bool is_send = kind == OpKind::kSend;
    const std::string what = std::string(op_name(kind)) + " tag " + std::to_string(tag) + (is_send ? " to" : " from") +
                             " rank " + std::to_string(peer) + " on rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + " (" + shape_text(kind, count, dtype, 0) + ")";
    const std::string earlier = broken();
    if (!earlier.empty()) throw CollectiveError(what + " failed: group unusable after an earlier failure: " + earlier);
    // A zero-byte buffer still travels (Gloo sends an empty message), so both sides stay matched.
    static char empty;
    auto buffer = context_->createUnboundBuffer(nbytes > 0 ? data : &empty, nbytes);
    if (is_send) {
      buffer->send(peer, slot);
      add_bytes(kind, nbytes);
    } else {
      buffer->recv(peer, slot);
    }
    return std::make_unique<GlooPointToPointWork>(std::move(buffer), is_send, options.timeout, what,
                                                  [this](const std::string& error) { mark_broken(error); });
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

  std::shared_ptr<gloo::rendezvous::Context> context_;  // null when size_ == 1
  std::vector<uint8_t> scratch_;   // alltoall output (worker only)
  std::vector<uint8_t> scratch2_;  // padded bf16 all-reduce buffer (worker only)
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
