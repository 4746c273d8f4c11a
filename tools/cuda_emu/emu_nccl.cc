// The NCCL entry points tessera's process group uses (comm/nccl_group.cc), emulated between
// processes on one machine, so the NCCL path of FSDP runs here as it would between GPUs.
// Declarations come from the toolkit's nccl.h.
//
// Wire: the unique id names a TCP port on 127.0.0.1 that ncclGetUniqueId's process listens on;
// rank 0 of the communicator accepts one connection from every other rank (a star). A collective
// gathers every rank's input at rank 0, which computes each rank's output and sends it back: sums
// in rank order in fp32 (bf16 rounded once at the end; real NCCL rounds per ring step, so only
// exact sums compare bitwise), gathers and broadcasts by copy.
//
// Asynchrony: each communicator has a thread that runs its operations in issue order. An
// operation waits for what its stream had in flight (emu_async.h), and becomes the stream's tail:
// an event recorded after it completes when the collective has, and kernels or copies issued on
// that stream afterwards wait for it. Reading or writing a collective's buffers from another
// stream before it completes races with that thread, as on a GPU.
//
// Faults, as NCCL reports them: a peer that closes its connection (it exited, or aborted) makes
// the communicator's asynchronous error ncclRemoteError and leaves the operation incomplete (its
// kernel would spin); ncclCommAbort stops the thread, closes the connections and ends every
// operation still in flight. Non-blocking communicators (config.blocking = 0) return
// ncclInProgress from init until every rank has connected; blocking ones wait.
//
// Not emulated (ncclInvalidUsage, with ncclGetLastError saying so): send/recv, reductions other
// than sum, types other than fp32 and bf16.
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/bf16.h"  // the project's rounding (round to nearest even, NaN kept)
#include "emu_async.h"

struct ncclComm {
  int rank = 0, nranks = 1;
  uint16_t port = 0;
  std::vector<int> fds;  // rank 0: one per other rank (index = rank); others: fds[0], to rank 0
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<bool()>> queue;  // operations; false: the communicator failed
  bool stop = false;
  std::atomic<ncclResult_t> state{ncclInProgress};
  std::vector<emu::PendingPtr> unfinished;  // issued, not completed (ended by abort)
};

namespace {

constexpr uint64_t kIdMagic = 0x656d752d6e63636cULL;  // "emu-nccl"
constexpr uint32_t kHelloMagic = 0x68656c6fu;

std::mutex global_mu;
std::map<uint16_t, int> listeners;  // port -> listening socket, in the process that made the id
thread_local std::string last_error;

ncclResult_t fail(ncclResult_t r, const std::string& what) {
  last_error = what;
  return r;
}

size_t type_bytes(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }

float load(const char* p, ncclDataType_t t, size_t i) {
  if (t == ncclFloat32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return tessera::bf16_to_f32(h);
}
void store(char* p, ncclDataType_t t, size_t i, float v) {
  if (t == ncclFloat32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t h = tessera::f32_to_bf16(v);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Rank 0 accepts the other ranks' connections (polling, so abort or destroy can stop it); the
// others connect. False when stopped or on a socket error.
bool connect_ranks(ncclComm* c, int listen_fd) {
  c->fds.assign(static_cast<size_t>(c->nranks), -1);
  if (c->rank != 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(c->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      if (fd >= 0) ::close(fd);
      return false;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const uint32_t hello[3] = {kHelloMagic, static_cast<uint32_t>(c->rank), static_cast<uint32_t>(c->nranks)};
    c->fds[0] = fd;
    return write_all(fd, hello, sizeof hello);
  }
  for (int joined = 1; joined < c->nranks;) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->stop) return false;
    }
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return false;
    uint32_t hello[3];
    if (!read_all(fd, hello, sizeof hello) || hello[0] != kHelloMagic || hello[1] == 0 ||
        hello[1] >= static_cast<uint32_t>(c->nranks) || hello[2] != static_cast<uint32_t>(c->nranks) ||
        c->fds[hello[1]] >= 0) {
      ::close(fd);
      continue;  // not one of ours
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fds[hello[1]] = fd;
    ++joined;
  }
  return true;
}

void worker_main(ncclComm* c, int listen_fd) {
  if (!connect_ranks(c, listen_fd)) {
    c->state = ncclSystemError;
    return;
  }
  c->state = ncclSuccess;
  for (;;) {
    std::function<bool()> op;
    {
      std::unique_lock<std::mutex> lock(c->mu);
      c->cv.wait(lock, [&] { return c->stop || !c->queue.empty(); });
      if (c->stop) return;
      op = std::move(c->queue.front());
      c->queue.pop_front();
    }
    if (!op()) {
      c->state = ncclRemoteError;  // a peer left: later operations never run, as on a GPU
      return;
    }
  }
}

enum class Kind { kAllGather, kReduceScatter, kAllReduce, kBroadcast };

// One collective, run on the communicator's thread. in_bytes: what each rank contributes;
// out_bytes: what each rank receives.
bool run_collective(ncclComm* c, Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type, int root) {
  const size_t e = type_bytes(type), W = static_cast<size_t>(c->nranks);
  const size_t in_bytes = (kind == Kind::kReduceScatter ? W * count : count) * e;
  const size_t out_bytes = (kind == Kind::kAllGather ? W * count : count) * e;
  const bool contributes = kind != Kind::kBroadcast || c->rank == root;
  if (c->rank != 0) {
    if (contributes && !write_all(c->fds[0], send, in_bytes)) return false;
    std::vector<char> result(out_bytes);
    if (!read_all(c->fds[0], result.data(), out_bytes)) return false;
    std::memcpy(recv, result.data(), out_bytes);
    return true;
  }
  std::vector<std::vector<char>> in(W);
  for (size_t r = 0; r < W; ++r) {
    if (kind == Kind::kBroadcast && static_cast<int>(r) != root) continue;
    in[r].resize(in_bytes);
    if (r == 0) {
      std::memcpy(in[0].data(), send, in_bytes);
    } else if (!read_all(c->fds[r], in[r].data(), in_bytes)) {
      return false;
    }
  }
  for (size_t r = 0; r < W; ++r) {
    std::vector<char> out(out_bytes);
    switch (kind) {
      case Kind::kAllGather:
        for (size_t q = 0; q < W; ++q) std::memcpy(out.data() + q * in_bytes, in[q].data(), in_bytes);
        break;
      case Kind::kBroadcast:
        out = in[static_cast<size_t>(root)];
        break;
      case Kind::kAllReduce:
      case Kind::kReduceScatter: {
        const size_t base = kind == Kind::kReduceScatter ? r * count : 0;
        for (size_t i = 0; i < count; ++i) {
          float sum = 0.0f;
          for (size_t q = 0; q < W; ++q) sum += load(in[q].data(), type, base + i);
          store(out.data(), type, i, sum);
        }
        break;
      }
    }
    if (r == 0) {
      std::memcpy(recv, out.data(), out_bytes);
    } else if (!write_all(c->fds[r], out.data(), out_bytes)) {
      return false;
    }
  }
  return true;
}

ncclResult_t enqueue(ncclComm* c, Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
                     ncclRedOp_t op, int root, cudaStream_t stream) {
  if (c == nullptr) return fail(ncclInvalidArgument, "null communicator");
  if (type != ncclFloat32 && type != ncclBfloat16)
    return fail(ncclInvalidUsage, "the emulation sums fp32 and bf16 only");
  if (op != ncclSum) return fail(ncclInvalidUsage, "the emulation reduces with ncclSum only");
  if (root < 0 || root >= c->nranks) return fail(ncclInvalidArgument, "root out of range");
  if (const ncclResult_t st = c->state; st != ncclSuccess)
    return fail(st == ncclInProgress ? ncclInvalidUsage : st, "the communicator is not ready, or has failed");
  auto done = std::make_shared<emu::Pending>();
  std::vector<emu::PendingPtr> before = emu::stream_dependencies(stream);
  emu::stream_push(stream, done);
  std::lock_guard<std::mutex> lock(c->mu);
  std::erase_if(c->unfinished, [](const emu::PendingPtr& p) { return p->done(); });  // completed long ago
  c->unfinished.push_back(done);
  c->queue.push_back([=] {
    for (const emu::PendingPtr& p : before) p->wait();
    if (count > 0 && c->nranks > 1 && !run_collective(c, kind, send, recv, count, type, root)) return false;
    if (count > 0 && c->nranks == 1 && send != recv) {
      std::memmove(recv, send, count * type_bytes(type));  // one rank: every collective is a copy
    }
    done->finish();
    return true;
  });
  c->cv.notify_all();
  return ncclSuccess;
}

// Stops the thread and closes the sockets; ends what was in flight.
void shut_down(ncclComm* c) {
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->stop = true;
    c->cv.notify_all();
  }
  for (int fd : c->fds)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // wakes a blocked send or recv
  if (c->worker.joinable()) c->worker.join();
  for (int fd : c->fds)
    if (fd >= 0) ::close(fd);
  c->fds.clear();
  for (const emu::PendingPtr& p : c->unfinished) p->finish();
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return fail(ncclSystemError, std::string("cannot listen on 127.0.0.1: ") + std::strerror(errno));
  }
  std::memset(id->internal, 0, sizeof id->internal);
  const uint16_t port = ntohs(addr.sin_port);
  std::memcpy(id->internal, &kIdMagic, 8);
  std::memcpy(id->internal + 8, &port, 2);
  std::lock_guard<std::mutex> lock(global_mu);
  listeners[port] = fd;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  uint64_t magic;
  std::memcpy(&magic, id.internal, 8);
  if (magic != kIdMagic) return fail(ncclInvalidArgument, "not a unique id from ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "rank or nranks out of range");
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  std::memcpy(&c->port, id.internal + 8, 2);
  int listen_fd = -1;
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(global_mu);
    auto it = listeners.find(c->port);
    if (it == listeners.end()) {
      delete c;
      return fail(ncclInvalidUsage, "rank 0 must run in the process that called ncclGetUniqueId");
    }
    listen_fd = it->second;
  }
  c->worker = std::thread(worker_main, c, listen_fd);
  *comm = c;
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) return ncclInProgress;
  while (c->state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return c->state;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "null communicator");
  *state = comm->state;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

// Operations already issued complete first (the queue drains), as NCCL's finalize flushes them.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "null communicator");
  std::vector<emu::PendingPtr> issued;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    issued = comm->unfinished;
  }
  if (comm->state == ncclSuccess)
    for (const emu::PendingPtr& p : issued) p->wait();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  shut_down(comm);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return enqueue(comm, Kind::kAllGather, send, recv, count, type, ncclSum, 0, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, Kind::kReduceScatter, send, recv, count, type, op, 0, stream);
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, Kind::kAllReduce, send, recv, count, type, op, 0, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return enqueue(comm, Kind::kBroadcast, send, recv, count, type, ncclSum, root, stream);
}
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return fail(ncclInvalidUsage, "ncclSend is not emulated");
}
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return fail(ncclInvalidUsage, "ncclRecv is not emulated");
}

}  // extern "C"
