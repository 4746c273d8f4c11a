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
// Point to point (ncclSend, ncclRecv) goes over a second set of sockets, one between every two
// ranks, with NCCL's matching: the sends from one rank to another meet that rank's receives in
// issue order, and a send moves no data until its receiver has posted the receive (a token on the
// wire), so a schedule that deadlocks NCCL (two ranks each sending before receiving, on one
// stream each) deadlocks here too. Between ncclGroupStart and ncclGroupEnd the point-to-point
// calls become one operation whose transfers all progress at once, as NCCL fuses a group into one
// kernel; collectives inside a group are issued at their call.
//
// Not emulated (ncclInvalidUsage, with ncclGetLastError saying so): reductions other than sum,
// types other than fp32 and bf16, a group spanning several communicators or streams.
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <fcntl.h>
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
#include <utility>
#include <vector>

#include "core/bf16.h"  // the project's rounding (round to nearest even, NaN kept)
#include "emu_async.h"

struct ncclComm {
  int rank = 0, nranks = 1;
  uint16_t port = 0;
  std::vector<int> fds;  // rank 0: one per other rank (index = rank); others: fds[0], to rank 0
  std::vector<int> peer_fds;  // point to point: one non-blocking socket per other rank (index = rank)
  // Per peer: the byte counts of the receives it posted (tokens) that no send of ours has met yet.
  std::vector<std::deque<uint64_t>> tokens;
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
constexpr uint32_t kPeerMagic = 0x70656572u;  // "peer": a point-to-point connection

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

// A socket listening on an ephemeral port of 127.0.0.1 (its port in *port); -1 on failure.
int listen_loopback(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

int connect_loopback(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Accepts a connection on listen_fd, polling so that abort or destroy can stop it: -1 when
// stopped or on a socket error.
int accept_unless_stopped(ncclComm* c, int listen_fd) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->stop) return -1;
    }
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
  }
}

// The star for collectives: rank 0 accepts the other ranks' connections, each of which names the
// port of its point-to-point listener; rank 0 sends every rank the table of those ports. Then
// the mesh for point to point: each rank connects to the ranks below it and accepts the ranks
// above. False when stopped or on a socket error.
bool connect_ranks(ncclComm* c, int listen_fd) {
  const size_t W = static_cast<size_t>(c->nranks);
  c->fds.assign(W, -1);
  c->peer_fds.assign(W, -1);
  c->tokens.assign(W, {});
  std::vector<uint32_t> ports(W, 0);
  uint16_t my_port = 0;
  const int peer_listen = listen_loopback(&my_port);
  if (peer_listen < 0) return false;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{peer_listen};
  if (c->rank != 0) {
    const int fd = connect_loopback(c->port);
    if (fd < 0) return false;
    c->fds[0] = fd;
    const uint32_t hello[4] = {kHelloMagic, static_cast<uint32_t>(c->rank), static_cast<uint32_t>(c->nranks), my_port};
    if (!write_all(fd, hello, sizeof hello) || !read_all(fd, ports.data(), W * sizeof(uint32_t))) return false;
  } else {
    ports[0] = my_port;
    for (size_t joined = 1; joined < W;) {
      const int fd = accept_unless_stopped(c, listen_fd);
      if (fd < 0) return false;
      uint32_t hello[4];
      if (!read_all(fd, hello, sizeof hello) || hello[0] != kHelloMagic || hello[1] == 0 || hello[1] >= W ||
          hello[2] != W || c->fds[hello[1]] >= 0) {
        ::close(fd);
        continue;  // not one of ours
      }
      c->fds[hello[1]] = fd;
      ports[hello[1]] = hello[3];
      ++joined;
    }
    for (size_t r = 1; r < W; ++r)
      if (!write_all(c->fds[r], ports.data(), W * sizeof(uint32_t))) return false;
  }
  for (int r = 0; r < c->rank; ++r) {
    const int fd = connect_loopback(static_cast<uint16_t>(ports[static_cast<size_t>(r)]));
    const uint32_t hello[2] = {kPeerMagic, static_cast<uint32_t>(c->rank)};
    if (fd < 0 || !write_all(fd, hello, sizeof hello)) return false;
    c->peer_fds[static_cast<size_t>(r)] = fd;
  }
  for (int joined = c->rank + 1; joined < c->nranks;) {
    const int fd = accept_unless_stopped(c, peer_listen);
    if (fd < 0) return false;
    uint32_t hello[2];
    if (!read_all(fd, hello, sizeof hello) || hello[0] != kPeerMagic || hello[1] <= static_cast<uint32_t>(c->rank) ||
        hello[1] >= W || c->peer_fds[hello[1]] >= 0) {
      ::close(fd);
      continue;
    }
    c->peer_fds[hello[1]] = fd;
    ++joined;
  }
  for (int fd : c->peer_fds)
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
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

// Queues `run` on the communicator's thread, after what `stream` has in flight; it becomes the
// stream's tail. run returns false when the communicator failed.
ncclResult_t enqueue_op(ncclComm* c, cudaStream_t stream, std::function<bool()> run) {
  if (const ncclResult_t st = c->state; st != ncclSuccess)
    return fail(st == ncclInProgress ? ncclInvalidUsage : st, "the communicator is not ready, or has failed");
  auto done = std::make_shared<emu::Pending>();
  std::vector<emu::PendingPtr> before = emu::stream_dependencies(stream);
  emu::stream_push(stream, done);
  std::lock_guard<std::mutex> lock(c->mu);
  std::erase_if(c->unfinished, [](const emu::PendingPtr& p) { return p->done(); });  // completed long ago
  c->unfinished.push_back(done);
  c->queue.push_back([=, run = std::move(run)] {
    for (const emu::PendingPtr& p : before) p->wait();
    if (!run()) return false;
    done->finish();
    return true;
  });
  c->cv.notify_all();
  return ncclSuccess;
}

ncclResult_t enqueue(ncclComm* c, Kind kind, const void* send, void* recv, size_t count, ncclDataType_t type,
                     ncclRedOp_t op, int root, cudaStream_t stream) {
  if (c == nullptr) return fail(ncclInvalidArgument, "null communicator");
  if (type != ncclFloat32 && type != ncclBfloat16)
    return fail(ncclInvalidUsage, "the emulation sums fp32 and bf16 only");
  if (op != ncclSum) return fail(ncclInvalidUsage, "the emulation reduces with ncclSum only");
  if (root < 0 || root >= c->nranks) return fail(ncclInvalidArgument, "root out of range");
  return enqueue_op(c, stream, [=] {
    if (count > 0 && c->nranks > 1) return run_collective(c, kind, send, recv, count, type, root);
    if (count > 0 && send != recv) std::memmove(recv, send, count * type_bytes(type));  // one rank: a copy
    return true;
  });
}

// One point-to-point transfer of a group.
struct Transfer {
  bool send;
  char* data;  // a send's buffer is only read
  size_t bytes;
  int peer;
};

// What goes over a point-to-point socket: a receiver's token (it posted a receive of `bytes`), or
// a sender's data (`bytes` of payload follow).
struct Header {
  uint32_t kind;
  uint32_t unused = 0;
  uint64_t bytes;
};
constexpr uint32_t kToken = 1, kData = 2;

// One peer's side of a group's transfers, on the communicator's thread: our transfers with it in
// issue order, the header or payload being read from it, and the send being written to it.
struct PeerLink {
  std::deque<size_t> sends, recvs;  // indexes into the group
  Header in_header{};
  size_t header_got = 0;   // bytes of in_header read
  size_t payload_got = 0;  // bytes of the head receive's payload read (after its header)
  std::vector<char> out;   // the head send's header and payload being written
  size_t out_sent = 0;
  bool sending = false;  // the head send met its token: out holds it

  // The head send, once the peer's token for it has come (tokens: the peer's, in order), into
  // `out`. False when the sizes differ (undefined in NCCL; a failure here).
  bool start_send(const std::vector<Transfer>& group, std::deque<uint64_t>& tokens) {
    if (sending || sends.empty() || tokens.empty()) return true;
    const Transfer& t = group[sends.front()];
    if (tokens.front() != t.bytes) return false;
    tokens.pop_front();
    const Header h{kData, 0, t.bytes};
    out.assign(reinterpret_cast<const char*>(&h), reinterpret_cast<const char*>(&h) + sizeof h);
    out.insert(out.end(), t.data, t.data + t.bytes);
    out_sent = 0;
    sending = true;
    return true;
  }
  // What to poll the socket for: reading while a receive, or a send's token, is due; writing while
  // a send is under way. 0: done with this peer.
  short events() const {
    return static_cast<short>(((!recvs.empty() || (!sends.empty() && !sending)) ? POLLIN : 0) |
                              (sending ? POLLOUT : 0));
  }
  // Writes what the socket takes of the head send. False when the peer is gone.
  bool write_some(int fd) {
    const ssize_t w = ::send(fd, out.data() + out_sent, out.size() - out_sent, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN) return false;
    if (w > 0 && (out_sent += static_cast<size_t>(w)) == out.size()) {
      sends.pop_front();
      sending = false;
    }
    return true;
  }
  // Reads what has come: a header (a token for one of our sends, queued in `tokens`, or the data
  // of our head receive) or the head receive's payload. False when the peer closed (it exited or
  // aborted) or sent what no receive of ours expects.
  bool read_some(int fd, const std::vector<Transfer>& group, std::deque<uint64_t>& tokens) {
    const bool in_payload = header_got == sizeof(Header);
    char* dst = in_payload ? group[recvs.front()].data + payload_got : reinterpret_cast<char*>(&in_header) + header_got;
    const size_t want = in_payload ? in_header.bytes - payload_got : sizeof(Header) - header_got;
    const ssize_t got = want == 0 ? 0 : ::recv(fd, dst, want, 0);
    if (want > 0 && got == 0) return false;
    if (got < 0 && errno != EAGAIN) return false;
    if (got > 0) (in_payload ? payload_got : header_got) += static_cast<size_t>(got);
    if (!in_payload && header_got == sizeof(Header)) {
      if (in_header.kind == kToken) {
        tokens.push_back(in_header.bytes);
        header_got = 0;
      } else if (in_header.kind != kData || recvs.empty() || in_header.bytes != group[recvs.front()].bytes) {
        return false;
      }
    }
    if (header_got == sizeof(Header) && payload_got == in_header.bytes) {  // the head receive is done
      recvs.pop_front();
      header_got = payload_got = 0;
    }
    return true;
  }
};

// A receive's token to its peer: 16 bytes, which the socket takes at once unless our earlier data
// still fills it. False when the communicator stops or the peer is gone.
bool post_token(ncclComm* c, const Transfer& t) {
  const Header token{kToken, 0, t.bytes};
  const int fd = c->peer_fds[static_cast<size_t>(t.peer)];
  for (pollfd w{fd, POLLOUT, 0}; ::poll(&w, 1, 50) != 1;) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->stop) return false;
  }
  return write_all(fd, &token, sizeof token);
}

// A group's transfers, run on the communicator's thread: every receive posts its token, then
// sends go out as their tokens arrive and receives fill as their data does, all at once. False
// when a peer left, a sizes mismatch, or the communicator stops.
bool run_transfers(ncclComm* c, const std::vector<Transfer>& group) {
  const size_t W = static_cast<size_t>(c->nranks);
  std::vector<PeerLink> peers(W);
  for (size_t i = 0; i < group.size(); ++i) {
    const Transfer& t = group[i];
    PeerLink& p = peers[static_cast<size_t>(t.peer)];
    (t.send ? p.sends : p.recvs).push_back(i);
    if (!t.send && !post_token(c, t)) return false;
  }
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> who;
    for (size_t r = 0; r < W; ++r) {
      if (!peers[r].start_send(group, c->tokens[r])) return false;
      if (const short events = peers[r].events(); events != 0) {
        fds.push_back({c->peer_fds[r], events, 0});
        who.push_back(r);
      }
    }
    if (fds.empty()) return true;  // every transfer is done
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->stop) return false;
    }
    if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) return false;
    for (size_t k = 0; k < fds.size(); ++k) {
      PeerLink& p = peers[who[k]];
      const short got = fds[k].revents;
      if (got & (POLLERR | POLLNVAL)) return false;
      if ((got & POLLOUT) && !p.write_some(fds[k].fd)) return false;
      if ((got & (POLLIN | POLLHUP)) && !p.read_some(fds[k].fd, group, c->tokens[who[k]])) return false;
    }
  }
}

// Queues a group of transfers as one operation.
ncclResult_t enqueue_transfers(ncclComm* c, std::vector<Transfer> group, cudaStream_t stream) {
  return enqueue_op(c, stream, [c, group = std::move(group)] { return run_transfers(c, group); });
}

// The calling thread's open group (ncclGroupStart ... ncclGroupEnd): its transfers so far.
struct OpenGroup {
  int depth = 0;
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<Transfer> transfers;
};
thread_local OpenGroup open_group;

ncclResult_t point_to_point(bool send, const void* data, size_t count, ncclDataType_t type, int peer, ncclComm_t c,
                            cudaStream_t stream) {
  if (c == nullptr) return fail(ncclInvalidArgument, "null communicator");
  if (type != ncclFloat32 && type != ncclBfloat16)
    return fail(ncclInvalidUsage, "the emulation moves fp32 and bf16 only");
  if (peer < 0 || peer >= c->nranks || peer == c->rank) return fail(ncclInvalidArgument, "peer out of range");
  Transfer t{send, const_cast<char*>(static_cast<const char*>(data)), count * type_bytes(type), peer};
  if (open_group.depth == 0) return enqueue_transfers(c, {t}, stream);
  if (open_group.comm != nullptr && (open_group.comm != c || open_group.stream != stream))
    return fail(ncclInvalidUsage, "the emulation groups one communicator on one stream");
  open_group.comm = c;
  open_group.stream = stream;
  open_group.transfers.push_back(t);
  return ncclSuccess;
}

// Stops the thread and closes the sockets; ends what was in flight.
void shut_down(ncclComm* c) {
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->stop = true;
    c->cv.notify_all();
  }
  for (const std::vector<int>* fds : {&c->fds, &c->peer_fds})
    for (int fd : *fds)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // wakes a blocked send or recv
  if (c->worker.joinable()) c->worker.join();
  for (std::vector<int>* fds : {&c->fds, &c->peer_fds}) {
    for (int fd : *fds)
      if (fd >= 0) ::close(fd);
    fds->clear();
  }
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
  uint16_t port = 0;
  const int fd = listen_loopback(&port);
  if (fd < 0) return fail(ncclSystemError, std::string("cannot listen on 127.0.0.1: ") + std::strerror(errno));
  std::memset(id->internal, 0, sizeof id->internal);
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

ncclResult_t ncclGroupStart() {
  ++open_group.depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (open_group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--open_group.depth > 0 || open_group.comm == nullptr) return ncclSuccess;
  OpenGroup g = std::exchange(open_group, {});
  return enqueue_transfers(g.comm, std::move(g.transfers), g.stream);
}

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
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point(true, send, count, type, peer, comm, stream);
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(false, recv, count, type, peer, comm, stream);
}

}  // extern "C"
