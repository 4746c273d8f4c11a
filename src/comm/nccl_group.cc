// ProcessGroup over a non-blocking NCCL communicator: collectives go onto one stream per group,
// completion is an event polled together with the communicator's asynchronous error, and a
// timeout or error aborts the communicator (ncclCommAbort), so this rank never hangs in NCCL:
// found by the thread waiting on the operation, or, when no thread waits (compute waits on the
// device, Work::wait_on_device), by the group's watchdog thread, which looks every 50 ms.
//
// Why non-blocking (config.blocking = 0): with a blocking communicator ncclCommInitRank and the
// first collectives (which connect peers lazily) block inside NCCL until every peer arrives, and
// only an abort from another thread can end them. Non-blocking calls return ncclInProgress at
// once and the communicator's state is polled with ncclCommGetAsyncError against our deadline.
//
// Bytes each call adds to bytes_sent(op) on this rank when it is issued (elem = dtype_bytes,
// c = count, W = size; 0 when W == 1 or c == 0). NCCL picks ring, tree, NVLS or CollNet per call
// and does not report what it moved, so these are the nominal ring volumes (nccl-tests' bus
// bandwidth factors), not a measurement:
//   all_gather      (W-1) c elem
//   reduce_scatter  (W-1) c elem
//   all_reduce      2 (W-1) c elem / W, the product divided with truncation (summed over ranks
//                   at most 2 (W-1) c elem, short by less than W bytes)
//   broadcast       c elem on every rank but the last of the ring root, root+1, ..., root-1
//                   (that is, rank (root + W - 1) % W sends 0)
//   barrier         the all_reduce formula for one fp32 element: 8 (W-1) / W
//   send            c elem (recv: 0); send_recv, under send_recv: its sends' c elem
#include "comm/nccl_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/check.h"

namespace tessera::comm {

namespace detail {

using Clock = std::chrono::steady_clock;

std::string cuda_message(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

std::string nccl_message(ncclResult_t r) {
  std::string m = ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);  // comm is unused by NCCL
  if (last != nullptr && last[0] != '\0') m += std::string(": ") + last;
  return m;
}

ncclDataType_t nccl_type(DType t) { return t == DType::kF32 ? ncclFloat32 : ncclBfloat16; }

// Polling interval: yields first (a small collective finishes in microseconds), then sleeps,
// growing to 1 ms, so a long wait costs little CPU.
class Backoff {
 public:
  void pause() {
    if (polls_++ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

struct Event {
  cudaEvent_t ev = nullptr;
  ~Event() {
    if (ev != nullptr) (void)cudaEventDestroy(ev);  // a pending event is released when it fires
  }
};

// A stream's wait for an operation, between two timing events recorded on that stream.
struct Stall {
  Event before, after;
};

struct OpId {
  OpKind kind;
  uint64_t seq;
};

// An operation issued and not known to be done.
struct Issued {
  OpId op;
  Clock::time_point deadline;
  Millis timeout;
  std::shared_ptr<Event> event;
};

constexpr auto kWatchInterval = std::chrono::milliseconds(50);

std::string timed_out(Millis timeout) {
  return "timed out after " + std::to_string(timeout.count()) + " ms (a peer did not take part, or is stuck)";
}

// What the group and its Work handles share. Every NCCL call on `comm` happens under `mu`;
// pollers drop `mu` while they sleep, so abort() from another thread gets in.
struct State {
  State(int r, int w, int d) : rank(r), size(w), device(d) {}

  const int rank;
  const int size;
  const int device;
  std::mutex mu;
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  cudaStream_t stream = nullptr;
  float* barrier_buf = nullptr;  // one device float, the barrier's all-reduce operand
  uint64_t next_seq = 0;
  std::string broken;  // why comm is gone; empty while usable
  // Operations with seq >= failed_from did not (or may not) complete: they were in flight when
  // the communicator was aborted. The stream runs operations in order, so earlier ones did.
  uint64_t failed_from = UINT64_MAX;
  uint64_t aborted_for = UINT64_MAX;               // the operation whose own failure `broken` is, if any
  std::deque<Issued> inflight;                     // issued, not known done, in order
  Clock::time_point last_deadline = Clock::now();  // latest deadline of any issued operation
  std::thread watchdog;
  std::condition_variable wake;
  bool stopping = false;
  std::deque<std::unique_ptr<Stall>> stalls;  // waits on the device not yet timed, in order
  double stalled_seconds = 0.0;               // of the waits timed so far

  // Adds the waits on the device that their streams have passed to stalled_seconds. mu held.
  void time_stalls() {
    std::erase_if(stalls, [&](const std::unique_ptr<Stall>& w) {
      if (cudaEventQuery(w->after.ev) != cudaSuccess) return false;  // not yet passed, or failed: later
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, w->before.ev, w->after.ev) == cudaSuccess) stalled_seconds += 1e-3 * ms;
      return true;
    });
  }

  std::string failure(OpId op, const std::string& what) const {
    return std::string(op_name(op.kind)) + " #" + std::to_string(op.seq) + " on rank " + std::to_string(rank) +
           " of " + std::to_string(size) + " failed: " + what;
  }

  // What wait() reports for operation `op` once the group is broken. mu held.
  std::string aborted(OpId op) const {
    return op.seq == aborted_for ? broken : failure(op, "the group was aborted: " + broken);
  }

  // Drops the completed head of `inflight`. mu held.
  void prune() {
    while (!inflight.empty() && cudaEventQuery(inflight.front().event->ev) == cudaSuccess) inflight.pop_front();
  }

  // Marks the group unusable and aborts the communicator, which ends its kernels and frees it.
  // `op`: the operation whose failure `why` is. mu held.
  void abort_locked(const std::string& why, uint64_t op = UINT64_MAX) {
    if (broken.empty()) {
      broken = why;
      aborted_for = op;
    }
    if (comm == nullptr) return;
    prune();
    failed_from = inflight.empty() ? next_seq : inflight.front().op.seq;
    inflight.clear();
    (void)cudaSetDevice(device);
    ncclResult_t r = ncclCommAbort(comm);
    comm = nullptr;
    if (r != ncclSuccess) broken += " (ncclCommAbort: " + nccl_message(r) + ")";
  }

  // One look of the watchdog: the communicator's asynchronous error, or an operation past its
  // deadline, aborts the group, whether or not a thread waits on it. mu held.
  void watch_once() {
    if (comm == nullptr) return;
    prune();
    if (inflight.empty()) return;
    ncclResult_t state = ncclSuccess;
    std::string why;
    if (ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) {
      why = "ncclCommGetAsyncError: " + nccl_message(r);
    } else if (state != ncclSuccess && state != ncclInProgress) {
      why = "NCCL asynchronous error: " + nccl_message(state);
    }
    const Clock::time_point now = Clock::now();
    for (const Issued& i : inflight) {
      if (why.empty() && now < i.deadline) continue;
      abort_locked(failure(i.op, why.empty() ? timed_out(i.timeout) : why), i.op.seq);
      return;
    }
  }

  void start_watchdog() {
    watchdog = std::thread([this] {
      (void)cudaSetDevice(device);
      std::unique_lock<std::mutex> lock(mu);
      while (!stopping) {
        wake.wait_for(lock, kWatchInterval);
        if (!stopping) watch_once();
      }
    });
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }

  // Polls the communicator until it leaves ncclInProgress (init, a non-blocking enqueue,
  // finalize). Returns an empty string on success, else what went wrong. mu held via `lock`.
  std::string settle(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Millis timeout,
                     const char* what) {
    Backoff backoff;
    for (;;) {
      if (comm == nullptr) return std::string("the group was aborted during ") + what + ": " + broken;
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) return "ncclCommGetAsyncError: " + nccl_message(r);
      if (state == ncclSuccess) return {};
      if (state != ncclInProgress) return std::string(what) + ": " + nccl_message(state);
      if (Clock::now() >= deadline)
        return std::string(what) + " timed out after " + std::to_string(timeout.count()) +
               " ms (a peer did not take part)";
      lock.unlock();
      backoff.pause();
      lock.lock();
    }
  }
};

class NcclWork final : public Work {
 public:
  // event null: nothing to wait for (count 0, or `error` set).
  NcclWork(std::shared_ptr<State> state, OpId op, std::shared_ptr<Event> event, Clock::time_point deadline,
           Millis timeout, std::string error = {})
      : state_(std::move(state)), op_(op), event_(std::move(event)), deadline_(deadline), timeout_(timeout),
        error_(std::move(error)) {}

  void wait() override {
    State& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    if (!error_.empty()) throw CollectiveError(error_);
    if (event_ == nullptr || done_) return;
    Backoff backoff;
    for (;;) {
      if (!s.broken.empty() && op_.seq >= s.failed_from) {
        error_ = s.aborted(op_);
        throw CollectiveError(error_);
      }
      cudaError_t q = cudaEventQuery(event_->ev);
      if (q == cudaSuccess) {
        done_ = true;
        return;
      }
      std::string why;
      if (q != cudaErrorNotReady) {
        why = "cudaEventQuery: " + cuda_message(q);
      } else if (s.comm != nullptr) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(s.comm, &state);
        if (r != ncclSuccess) {
          why = "ncclCommGetAsyncError: " + nccl_message(r);
        } else if (state != ncclSuccess && state != ncclInProgress) {
          why = "NCCL asynchronous error: " + nccl_message(state);
        }
      }
      if (why.empty() && Clock::now() >= deadline_) why = timed_out(timeout_);
      if (!why.empty()) {
        error_ = s.failure(op_, why);
        s.abort_locked(error_, op_.seq);
        throw CollectiveError(error_);
      }
      lock.unlock();
      backoff.pause();
      lock.lock();
    }
  }

  void wait_on_device(void* stream) override {
    if (stream == nullptr) return wait();
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!error_.empty()) throw CollectiveError(error_);
    if (event_ == nullptr || done_) return;
    if (!s.broken.empty() && op_.seq >= s.failed_from) {
      error_ = s.aborted(op_);
      throw CollectiveError(error_);
    }
    // Timed by events on the stream just before and after the wait (device_wait_seconds); a
    // failure to make them costs the figure, never the wait.
    const auto waiting = static_cast<cudaStream_t>(stream);
    auto stall = std::make_unique<Stall>();
    if (cudaEventCreate(&stall->before.ev) != cudaSuccess || cudaEventCreate(&stall->after.ev) != cudaSuccess ||
        cudaEventRecord(stall->before.ev, waiting) != cudaSuccess) {
      stall.reset();
    }
    // After an abort NCCL's kernels end, so the event fires and the stream goes on.
    if (cudaError_t e = cudaStreamWaitEvent(waiting, event_->ev, 0); e != cudaSuccess) {
      error_ = s.failure(op_, "cudaStreamWaitEvent: " + cuda_message(e));
      throw CollectiveError(error_);
    }
    if (stall && cudaEventRecord(stall->after.ev, waiting) == cudaSuccess) s.stalls.push_back(std::move(stall));
    if (s.stalls.size() > 1024) s.time_stalls();  // nobody asks (evaluation): keep the list short
  }

 private:
  std::shared_ptr<State> state_;
  const OpId op_;
  std::shared_ptr<Event> event_;
  const Clock::time_point deadline_;
  const Millis timeout_;
  // Guarded by state_->mu.
  std::string error_;
  bool done_ = false;
};

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<State> state, Millis close_timeout)
      : s_(std::move(state)), close_timeout_(close_timeout) {
    for (auto& b : bytes_) b.store(0);
    s_->start_watchdog();
  }

  // Waits for every issued operation (until the latest of their deadlines), then finalizes and
  // destroys the communicator; on an error or timeout it aborts instead. Work handles that
  // outlive the group still report their operation's outcome.
  ~NcclGroup() override {
    State& s = *s_;
    s.stop_watchdog();  // the drain below has its own deadline
    std::unique_lock<std::mutex> lock(s.mu);
    (void)cudaSetDevice(s.device);
    if (s.comm != nullptr) {
      std::string why = drain(lock);
      if (why.empty()) {
        const auto deadline = Clock::now() + close_timeout_;
        ncclResult_t r = ncclCommFinalize(s.comm);
        if (r != ncclSuccess && r != ncclInProgress) why = "ncclCommFinalize: " + nccl_message(r);
        if (why.empty()) why = s.settle(lock, deadline, close_timeout_, "ncclCommFinalize");
      }
      if (!why.empty()) {
        s.abort_locked("the group was destroyed on rank " + std::to_string(s.rank) + " after: " + why);
      } else if (s.comm != nullptr) {
        (void)ncclCommDestroy(s.comm);  // nothing left to report to: the group is going away
        s.comm = nullptr;
        s.inflight.clear();
        s.failed_from = s.next_seq;  // everything issued has completed
        s.broken = "the group was destroyed";
      }
    }
    // Destroying a stream with pending work (after an abort) returns at once; its resources are
    // released when the work ends. Failures here cannot be reported from a destructor.
    if (s.barrier_buf != nullptr) (void)cudaFree(s.barrier_buf);
    s.barrier_buf = nullptr;
    if (s.stream != nullptr) (void)cudaStreamDestroy(s.stream);
    s.stream = nullptr;
  }

  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }

  std::unique_ptr<Work> all_gather(const void* in, void* out, int64_t count, DType dtype,
                                   const CollectiveOptions& options) override {
    CHECK(count >= 0);
    const size_t c = static_cast<size_t>(count);
    const size_t nbytes = c * dtype_bytes(dtype);
    check_disjoint_or_slot(in, nbytes, out, nbytes * s_->size);
    return issue(OpKind::kAllGather, count == 0, uint64_t(s_->size - 1) * nbytes, options,
                 [=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllGather(in, out, c, nccl_type(dtype), comm, stream);
                 });
  }

  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                       const CollectiveOptions& options) override {
    CHECK(count >= 0);
    const size_t c = static_cast<size_t>(count);
    const size_t nbytes = c * dtype_bytes(dtype);
    check_disjoint_or_slot(out, nbytes, in, nbytes * s_->size);
    return issue(OpKind::kReduceScatter, count == 0, uint64_t(s_->size - 1) * nbytes, options,
                 [=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclReduceScatter(in, out, c, nccl_type(dtype), ncclSum, comm, stream);
                 });
  }

  std::unique_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, const CollectiveOptions& options) override {
    CHECK(count >= 0);
    const size_t c = static_cast<size_t>(count);
    const uint64_t w = static_cast<uint64_t>(s_->size);
    return issue(OpKind::kAllReduce, count == 0, 2 * (w - 1) * c * dtype_bytes(dtype) / w, options,
                 [=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllReduce(data, data, c, nccl_type(dtype), ncclSum, comm, stream);
                 });
  }

  std::unique_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root,
                                  const CollectiveOptions& options) override {
    CHECK(count >= 0);
    CHECK(root >= 0 && root < s_->size);
    const size_t c = static_cast<size_t>(count);
    const bool last_in_ring = s_->rank == (root + s_->size - 1) % s_->size;
    const uint64_t bytes = last_in_ring ? 0 : c * dtype_bytes(dtype);
    return issue(OpKind::kBroadcast, count == 0, bytes, options, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(data, data, c, nccl_type(dtype), root, comm, stream);
    });
  }

  // All-reduce of one float: the cheapest collective that needs every rank. Its value is
  // meaningless (it grows each time), so the buffer is never reset.
  std::unique_ptr<Work> barrier(const CollectiveOptions& options) override {
    const uint64_t w = static_cast<uint64_t>(s_->size);
    float* buf = s_->barrier_buf;
    return issue(OpKind::kBarrier, false, 2 * (w - 1) * sizeof(float) / w, options,
                 [=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, stream);
                 });
  }

  std::unique_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer, uint32_t /*tag*/,
                             const CollectiveOptions& options) override {
    CHECK(count >= 0);
    CHECK_MSG(peer >= 0 && peer < s_->size && peer != s_->rank, "point to point needs another rank of the group");
    const size_t c = static_cast<size_t>(count);
    return issue(OpKind::kSend, count == 0, c * dtype_bytes(dtype), options, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclSend(data, c, nccl_type(dtype), peer, comm, stream);
    });
  }

  std::unique_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer, uint32_t /*tag*/,
                             const CollectiveOptions& options) override {
    CHECK(count >= 0);
    CHECK_MSG(peer >= 0 && peer < s_->size && peer != s_->rank, "point to point needs another rank of the group");
    const size_t c = static_cast<size_t>(count);
    return issue(OpKind::kRecv, count == 0, 0, options, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclRecv(data, c, nccl_type(dtype), peer, comm, stream);
    });
  }

  double device_wait_seconds() override {
    State& s = *s_;
    std::lock_guard<std::mutex> lock(s.mu);
    s.time_stalls();
    return s.stalled_seconds;
  }

  // One NCCL group: one sequence number, one event after all its transfers.
  std::unique_ptr<Work> send_recv(const std::vector<PointToPoint>& batch, const CollectiveOptions& options) override {
    uint64_t bytes = 0;
    for (const PointToPoint& t : batch) {
      CHECK(t.count >= 0);
      CHECK_MSG(t.peer >= 0 && t.peer < s_->size && t.peer != s_->rank,
                "point to point needs another rank of the group");
      if (t.send) bytes += static_cast<uint64_t>(t.count) * dtype_bytes(t.dtype);
    }
    const bool empty = std::all_of(batch.begin(), batch.end(), [](const PointToPoint& t) { return t.count == 0; });
    return issue(OpKind::kSendRecv, empty, bytes, options, [batch](ncclComm_t comm, cudaStream_t stream) {
      ncclResult_t first = ncclGroupStart();
      for (const PointToPoint& t : batch) {
        if (first != ncclSuccess || t.count == 0) continue;
        const size_t c = static_cast<size_t>(t.count);
        first = t.send ? ncclSend(t.data, c, nccl_type(t.dtype), t.peer, comm, stream)
                       : ncclRecv(t.data, c, nccl_type(t.dtype), t.peer, comm, stream);
      }
      const ncclResult_t end = ncclGroupEnd();  // closes the group even after a failed call
      return first != ncclSuccess ? first : end;
    });
  }

  // Aborts the communicator now: its kernels end, peers waiting on this rank fail at their own
  // checks, and operations not yet complete fail in wait().
  void abort() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->abort_locked("the group was aborted on rank " + std::to_string(s_->rank));
  }

  uint64_t bytes_sent(OpKind op) const override {
    CHECK(op != OpKind::kCount);
    return bytes_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }

 private:
  // NCCL's in-place convention: `part` either is the slot of this rank in `whole` or does not
  // overlap it. Anything else is a caller bug.
  void check_disjoint_or_slot(const void* part, size_t part_bytes, const void* whole, size_t whole_bytes) const {
    const auto p = reinterpret_cast<uintptr_t>(part);
    const auto w = reinterpret_cast<uintptr_t>(whole);
    if (part_bytes == 0 || p + part_bytes <= w || w + whole_bytes <= p) return;
    CHECK_MSG(p == w + static_cast<uintptr_t>(s_->rank) * part_bytes,
              "NCCL collective buffers overlap other than in place");
  }

  // Issues one operation: a sequence number, the NCCL call on the group's stream, an event after
  // it. A count-0 call moves nothing and completes at once, but still takes a sequence number so
  // that the ranks' numbering stays aligned. Failures come back as a Work that throws.
  std::unique_ptr<Work> issue(OpKind kind, bool empty, uint64_t bytes, const CollectiveOptions& options,
                              const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
    State& s = *s_;
    std::unique_lock<std::mutex> lock(s.mu);
    const OpId op{kind, s.next_seq++};
    const auto deadline = Clock::now() + options.timeout;
    auto work = [&](std::shared_ptr<Event> ev, std::string error = {}) {
      return std::make_unique<NcclWork>(s_, op, std::move(ev), deadline, options.timeout, std::move(error));
    };
    if (empty) return work(nullptr);
    if (s.comm == nullptr) return work(nullptr, s.failure(op, "group unusable after an earlier failure: " + s.broken));

    std::string why;
    auto event = std::make_shared<Event>();
    if (cudaError_t e = cudaSetDevice(s.device); e != cudaSuccess) {
      why = "cudaSetDevice(" + std::to_string(s.device) + "): " + cuda_message(e);
    } else if (e = cudaEventCreateWithFlags(&event->ev, cudaEventDisableTiming); e != cudaSuccess) {
      why = "cudaEventCreateWithFlags: " + cuda_message(e);
    } else if (std::string late = follow(static_cast<cudaStream_t>(options.after)); !late.empty()) {
      why = std::move(late);
    } else {
      ncclResult_t r = call(s.comm, s.stream);
      if (r == ncclInProgress) {
        // The enqueue continues in NCCL's background (e.g. connecting to peers at the first
        // use): no other call on the communicator until it settles.
        why = s.settle(lock, deadline, options.timeout, op_name(kind));
      } else if (r != ncclSuccess) {
        why = std::string("nccl ") + op_name(kind) + ": " + nccl_message(r);
      }
      if (why.empty() && s.comm == nullptr) why = "the group was aborted: " + s.broken;
      if (why.empty()) {
        if (cudaError_t re = cudaEventRecord(event->ev, s.stream); re != cudaSuccess)
          why = "cudaEventRecord: " + cuda_message(re);
      }
    }
    if (!why.empty()) {
      std::string error = s.failure(op, why);
      s.abort_locked(error, op.seq);
      return work(nullptr, std::move(error));
    }
    s.prune();
    s.inflight.push_back({op, deadline, options.timeout, event});
    s.last_deadline = std::max(s.last_deadline, deadline);
    bytes_[static_cast<int>(kind)].fetch_add(s.size == 1 ? 0 : bytes, std::memory_order_relaxed);
    return work(std::move(event));
  }

  // Orders the group's stream after the work issued so far on `producer` (null: nothing to do).
  // Returns an empty string on success.
  std::string follow(cudaStream_t producer) {
    if (producer == nullptr) return {};
    Event produced;
    if (cudaError_t e = cudaEventCreateWithFlags(&produced.ev, cudaEventDisableTiming); e != cudaSuccess)
      return "cudaEventCreateWithFlags: " + cuda_message(e);
    if (cudaError_t e = cudaEventRecord(produced.ev, producer); e != cudaSuccess)
      return "cudaEventRecord on the producing stream: " + cuda_message(e);
    if (cudaError_t e = cudaStreamWaitEvent(s_->stream, produced.ev, 0); e != cudaSuccess)
      return "cudaStreamWaitEvent: " + cuda_message(e);
    return {};  // the wait outlives the event: CUDA keeps what it needs
  }

  // Waits until the stream has run everything issued, an error, or the latest deadline of the
  // issued operations. Returns an empty string on success. mu held via `lock`.
  std::string drain(std::unique_lock<std::mutex>& lock) {
    State& s = *s_;
    Event last;
    if (cudaError_t e = cudaEventCreateWithFlags(&last.ev, cudaEventDisableTiming); e != cudaSuccess)
      return "cudaEventCreateWithFlags: " + cuda_message(e);
    if (cudaError_t e = cudaEventRecord(last.ev, s.stream); e != cudaSuccess)
      return "cudaEventRecord: " + cuda_message(e);
    Backoff backoff;
    for (;;) {
      if (s.comm == nullptr) return "aborted: " + s.broken;
      cudaError_t q = cudaEventQuery(last.ev);
      if (q == cudaSuccess) return {};
      if (q != cudaErrorNotReady) return "cudaEventQuery: " + cuda_message(q);
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(s.comm, &state);
      if (r != ncclSuccess) return "ncclCommGetAsyncError: " + nccl_message(r);
      if (state != ncclSuccess && state != ncclInProgress) return "NCCL asynchronous error: " + nccl_message(state);
      if (Clock::now() >= s.last_deadline) return "pending operations outlived their timeout";
      lock.unlock();
      backoff.pause();
      lock.lock();
    }
  }

  std::shared_ptr<State> s_;
  const Millis close_timeout_;
  std::atomic<uint64_t> bytes_[static_cast<int>(OpKind::kCount)];
};

}  // namespace detail

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "NCCL (version unknown)";
  // Since 2.9: major x 10000 + minor x 100 + patch.
  return "NCCL " + std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

bool nccl_available(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = "cudaGetDeviceCount: " + detail::cuda_message(e);
    return false;
  }
  if (n == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

namespace {

// The group's ncclUniqueId: rank 0 makes it and publishes it in the store, the others read it.
// Each rank counts the groups it has built on this store; ranks build groups in the same order, so
// they agree on a fresh key (under *prefix) and never read the id of an earlier group. One rank
// needs no store.
ncclUniqueId exchange_unique_id(Store& store, int rank, int size, Millis timeout, const std::string& who,
                                std::string* prefix) {
  auto fail = [&](const std::string& what) { throw CollectiveError(who + " failed: " + what); };
  ncclUniqueId id;
  if (size > 1) {
    const int64_t generation = store.add("nccl/generation/rank" + std::to_string(rank), 1);
    *prefix = "nccl/" + std::to_string(generation) + "/";
  }
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) fail("ncclGetUniqueId: " + detail::nccl_message(r));
    if (size == 1) return id;
    Bytes value(sizeof(id.internal));
    std::memcpy(value.data(), id.internal, sizeof(id.internal));
    store.set(*prefix + "unique_id", value);
    return id;
  }
  const std::string key = *prefix + "unique_id";
  Bytes value;
  try {
    value = store.get(key, timeout);
  } catch (const StoreError& e) {
    throw StoreError(who + ": " + e.what());
  }
  if (value.size() != sizeof(id.internal))
    fail("store key " + key + " holds " + std::to_string(value.size()) + " bytes, not an ncclUniqueId");
  std::memcpy(id.internal, value.data(), sizeof(id.internal));
  return id;
}

// The rank's stream, barrier buffer and communicator (non-blocking, settled by the deadline): ""
// or what failed, in which case what was made is released.
std::string init_state(detail::State& state, std::unique_lock<std::mutex>& lock, const ncclUniqueId& id,
                       detail::Clock::time_point deadline, Millis timeout) {
  using detail::cuda_message;
  std::string why;
  if (cudaError_t e = cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking); e != cudaSuccess) {
    why = "cudaStreamCreateWithFlags: " + cuda_message(e);
  } else if (e = cudaMalloc(reinterpret_cast<void**>(&state.barrier_buf), sizeof(float)); e != cudaSuccess) {
    why = "cudaMalloc: " + cuda_message(e);
  } else if (e = cudaMemsetAsync(state.barrier_buf, 0, sizeof(float), state.stream); e != cudaSuccess) {
    why = "cudaMemsetAsync: " + cuda_message(e);
  } else {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&state.comm, state.size, id, state.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      why = "ncclCommInitRankConfig: " + detail::nccl_message(r);
    } else if (state.comm == nullptr) {
      why = "ncclCommInitRankConfig returned no communicator";
    } else {
      why = state.settle(lock, deadline, timeout, "ncclCommInitRankConfig");
    }
  }
  if (!why.empty()) {
    if (state.comm != nullptr) (void)ncclCommAbort(state.comm);
    state.comm = nullptr;
    if (state.barrier_buf != nullptr) (void)cudaFree(state.barrier_buf);
    state.barrier_buf = nullptr;
    if (state.stream != nullptr) (void)cudaStreamDestroy(state.stream);
    state.stream = nullptr;
  }
  return why;
}

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(Store& store, int rank, int size, int device, Millis timeout) {
  CHECK(size >= 1 && rank >= 0 && rank < size && device >= 0);
  const auto deadline = detail::Clock::now() + timeout;
  const std::string who = "rendezvous of rank " + std::to_string(rank) + " of " + std::to_string(size) +
                          " on CUDA device " + std::to_string(device);
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    throw CollectiveError(who + " failed: cudaSetDevice: " + detail::cuda_message(e));
  }
  std::string prefix;
  const ncclUniqueId id = exchange_unique_id(store, rank, size, timeout, who, &prefix);
  auto state = std::make_shared<detail::State>(rank, size, device);
  std::unique_lock<std::mutex> lock(state->mu);
  if (std::string why = init_state(*state, lock, id, deadline, timeout); !why.empty()) {
    throw CollectiveError(who + " failed: " + why + (prefix.empty() ? "" : " (store prefix " + prefix + ")"));
  }
  lock.unlock();
  return std::make_unique<detail::NcclGroup>(std::move(state), timeout);
}

}  // namespace tessera::comm
