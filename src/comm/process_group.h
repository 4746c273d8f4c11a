// Layer comm: stores and process groups, the wire between processes. It must not know models,
// parallel dimensions or training.
//
// Collective communication between the ranks of a job (ARCHITECTURE.md, comm). Every operation
// is asynchronous (a Work handle), has a timeout, is numbered per group, and counts the bytes it
// sends; a failure raises CollectiveError naming the operation, its sequence number and the rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"
#include "core/error.h"

namespace tessera::comm {

enum class DType { kF32, kBF16 };
size_t dtype_bytes(DType t);

enum class OpKind { kAllGather = 0, kReduceScatter, kAllReduce, kBroadcast, kBarrier, kSend, kRecv, kSendRecv, kCount };
const char* op_name(OpKind op);

struct CollectiveOptions {
  Millis timeout{std::chrono::seconds(300)};
  // Device groups (NCCL): a cudaStream_t whose work issued so far the collective must follow (the
  // compute stream that wrote its inputs), ordered on the device by an event, the host not
  // waiting. Null: the caller has finished writing the inputs. Gloo ignores it.
  void* after = nullptr;
};

// A lost peer, a timeout or a transport failure. Exit code 12: a restart can cure it.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& what) : Error(what, kExitPeer) {}
};
// A rendezvous key that never appeared, or a refused job token.
class StoreError : public Error {
 public:
  StoreError(const std::string& what) : Error(what, kExitPeer) {}
};

// One transfer of a point-to-point batch (ProcessGroup::send_recv).
struct PointToPoint {
  bool send;   // else a receive
  void* data;  // a send's is only read
  int64_t count;
  DType dtype;
  int peer;  // group rank, not this rank
  uint32_t tag;
};

// Completion of one asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation is done; rethrows its CollectiveError.
  virtual void wait() = 0;
  // Orders the work queued on `stream` (a cudaStream_t) from now on after the operation, on the
  // device, the host not waiting. A failure then surfaces at a later wait() on the group (NCCL:
  // its watchdog aborts an operation past its timeout, which ends the device's wait). Without a
  // device order (Gloo, or a null stream) it waits as wait() does.
  virtual void wait_on_device(void* /*stream*/) { wait(); }
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // out (size x count) = every rank's in (count), in rank order.
  virtual std::unique_ptr<Work> all_gather(const void* in, void* out, int64_t count, DType dtype,
                                           const CollectiveOptions& options) = 0;
  // out (count) = sum over ranks of their in[rank*count, (rank+1)*count); in has size x count.
  virtual std::unique_ptr<Work> reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                               const CollectiveOptions& options) = 0;
  // data (count) = sum over ranks, in place.
  virtual std::unique_ptr<Work> all_reduce(void* data, int64_t count, DType dtype,
                                           const CollectiveOptions& options) = 0;
  // data (count) = root's data, in place.
  virtual std::unique_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root,
                                          const CollectiveOptions& options) = 0;
  virtual std::unique_ptr<Work> barrier(const CollectiveOptions& options) = 0;
  // Point to point (pipeline stages): `count` elements to, or from, group rank `peer` (not this
  // rank). Gloo matches a send with the peer's recv of the same tag, count and dtype, and posts
  // both at once on the calling thread, beside the queued collectives, so two ranks may each send
  // before they receive; a send and a recv that differ in count or dtype never meet and fail at
  // the timeout. NCCL matches the sends and recvs between two ranks in the order they are issued,
  // on the group's one stream: issue every recv before the send it waits on.
  virtual std::unique_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                                     const CollectiveOptions& options) = 0;
  virtual std::unique_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                                     const CollectiveOptions& options) = 0;
  // Several sends and receives at once, done when all are (Megatron-LM's batched isend/irecv):
  // what two ranks need that each send to the other and then receive, as the stages of a 1F1B
  // pipeline do. NCCL runs the batch as one group (ncclGroupStart/End) whose transfers progress
  // together; issued one by one on its one stream, the first send would wait for a receive posted
  // behind the peer's own send, and neither moves. This default issues each transfer on its own
  // (right for Gloo, which posts sends and receives at once) and waits for them all.
  virtual std::unique_ptr<Work> send_recv(const std::vector<PointToPoint>& batch, const CollectiveOptions& options);

  // Seconds the streams given to Work::wait_on_device stood still waiting for this group's
  // operations, summed over the waits whose timing is known (their stream has passed them): the
  // exposed communication a host clock cannot see. 0 for groups that wait on the host.
  virtual double device_wait_seconds() { return 0.0; }

  // Closes every connection so that peers blocked on this rank fail fast; the group is unusable
  // afterwards (build a new one, with a new store round, to continue).
  virtual void abort() = 0;
  // Bytes this rank has sent per kind of operation (payload bytes handed to the transport).
  virtual uint64_t bytes_sent(OpKind op) const = 0;
  // What carries the collectives, for the start-up log ("shared memory", "TCP (Gloo)").
  virtual std::string transport() const { return ""; }
};

// Root's text on every rank of `group` (two broadcasts: its length, then its bytes; a broadcast
// copies elements, so any bytes travel in f32 slots).
std::string broadcast_string(ProcessGroup& group, const std::string& text, int root, const CollectiveOptions& options);

// Gloo over TCP on `interface_host` (e.g. "127.0.0.1"), rendezvous through `store`. Throws
// StoreError or CollectiveError when the peers do not all arrive within `timeout`.
std::unique_ptr<ProcessGroup> make_gloo_group(Store& store, int rank, int size, const std::string& interface_host,
                                              Millis timeout);

// How a host group's ranks exchange data. kAuto: through one shared-memory segment when every
// rank of the group can map it (one host, one IPC namespace, room in /dev/shm), else over TCP;
// kTcp: Gloo over TCP always; kShm: shared memory, or a ConfigError naming each rank that could
// not map the segment and why.
enum class HostTransport { kAuto, kTcp, kShm };
const char* transport_name(HostTransport t);  // "auto", "tcp", "shm"

// Bytes of the shared-memory segment a host group of `size` ranks maps (each rank's RSS holds
// the pages it touches; the memory plan counts them all).
size_t shm_segment_bytes(int size);

// The process group for host memory: Gloo over TCP, with its collectives over shared memory as
// `transport` allows (shm_group.cc; point-to-point transfers stay on Gloo). Every rank must pass
// the same transport.
std::unique_ptr<ProcessGroup> make_host_group(Store& store, int rank, int size, const std::string& interface_host,
                                              Millis timeout, HostTransport transport);

}  // namespace tessera::comm
