// What the process groups for host memory share (Gloo's TCP transport, gloo_group.cc, and shared
// memory, shm_group.cc): one worker thread per group runs the collectives in the order they were
// issued; each takes a sequence number and a signature (kind, count, dtype, root); a failure
// becomes a CollectiveError naming the operation, its sequence number, its shape and the rank,
// and breaks the group, whose later operations then fail at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/process_group.h"

namespace tessera::comm::detail {

// One queued collective, as its body sees it.
struct OpInfo {
  OpKind kind;
  uint64_t seq;  // this group's count of collectives issued before it (count-0 ones too)
  int64_t count;
  DType dtype;
  int root;            // broadcast's, else 0
  uint64_t signature;  // a hash of (kind, count, dtype, root): calls that differ differ here
  std::string shape;   // e.g. "1000 x f32", for messages
};

// A call's shape for messages: "1000 x f32", "1000 x bf16 from rank 2" (broadcast), "no data"
// (barrier).
std::string shape_text(OpKind kind, int64_t count, DType dtype, int root);

// FNV-1a over the bytes of `values`: the signature of a call (kind, count, dtype, root), or of a
// point-to-point transfer's shape.
uint64_t fnv1a(std::initializer_list<uint64_t> values);

// "all_reduce #1 on rank 0 of 2 failed (1000 x f32): WHAT", with a hint where WHAT is a timeout.
std::string failure_message(const OpInfo& op, int rank, int size, const std::string& what);

// Bytes this rank reports in bytes_sent for a collective: what Gloo's algorithms hand to TCP
// (the table in gloo_group.cc). The shared-memory group reports the same figures, so that the
// step's communication volume, its metrics and the planner do not depend on the transport.
uint64_t ring_bytes(OpKind kind, int64_t count, DType dtype, int root, int rank, int size);

// out[i] = sum over j < w of in[j][i], accumulated in fp32 in rank order (so every rank computes
// bit-identical sums), bf16 rounded once. out may alias any in[j].
void sum_ranks(const uint8_t* const* in, int w, void* out, size_t count, DType dtype);

// Collectives on a worker thread, in FIFO order. A derived group implements each collective as
// a body run by enqueue(); count-0 calls complete at once but still take a sequence number.
class HostGroup : public ProcessGroup {
 public:
  HostGroup(int rank, int size);
  ~HostGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Queued operations fail now; then on_broken() tells the peers (an operation already running
  // fails as its transport allows).
  void abort() override;
  uint64_t bytes_sent(OpKind op) const override;

 protected:
  using Body = std::function<void(const OpInfo&)>;
  std::unique_ptr<Work> enqueue(OpKind kind, int64_t count, DType dtype, int root, Body body);
  // Derived destructors call this first: pending bodies run (or fail) while the derived members
  // they use are alive, then the worker is joined.
  void stop_worker();
  // The first failure of the group, or "" while it is usable.
  std::string broken() const;
  // Records `error` as the group's failure (the first one stays) and calls on_broken().
  void mark_broken(const std::string& error);
  void add_bytes(OpKind op, uint64_t n) { bytes_[static_cast<int>(op)].fetch_add(n, std::memory_order_relaxed); }
  // Makes the peers blocked on this rank fail fast (Gloo: close the connections). Called once
  // the group is broken, from any thread.
  virtual void on_broken() = 0;

  const int rank_;
  const int size_;

 private:
  struct Queued;
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Queued>> queue_;
  uint64_t next_seq_ = 0;
  bool stop_ = false;
  std::string broken_;
  std::atomic<uint64_t> bytes_[static_cast<int>(OpKind::kCount)];
  std::thread worker_;
};

}  // namespace tessera::comm::detail
