// Collectives over one shared-memory segment, for the ranks of a group on one host (NCCL's SHM
// transport and MPI's shared-memory collectives do the same): Gloo over loopback TCP copies every
// byte into the kernel and out again, on the same cores that compute. Here a rank copies its data
// into its slot of the segment once, and its peers read it from there.
//
// The segment (created by rank 0 with mode 0600, mapped by every rank, unlinked as soon as all
// have answered, so that nothing is left in /dev/shm when a rank dies): a header, one area per
// rank (its arrival counter, its pid, the collective it runs) and two buffers of one slot per
// rank. A collective moves its data in chunks of at most a slot; per chunk a rank writes its slot
// of buffer g % 2 (g counts chunks over the group's life), passes a sync point (bumps its arrival
// counter and waits until every peer's has reached the same count), and reads its peers' slots:
//   all_gather      write its chunk; sync; copy every rank's slot out
//   broadcast       the root writes; sync; the others copy the root's slot out
//   reduce_scatter  write the chunk's piece of each of the W blocks; sync; sum piece `rank` of
//                   every slot into the output
//   all_reduce      write the chunk; sync; sum segment `rank` of every slot into its own slot;
//                   sync; copy every rank's segment out
//   barrier         sync
// Sums run in rank order with fp32 accumulation (bf16 rounded once), so every rank computes the
// same bits. Two buffers make a chunk's sync point also the proof that every peer has finished
// reading the chunk before last, whose buffer this rank is about to overwrite.
//
// A sync point spins briefly, then sleeps on the peer's counter (a futex shared between the
// processes) in slices of 50 ms, after each of which it checks that the group was not broken
// by a peer and that the peer's process still exists (a dead rank fails its peers within a slice,
// not at the timeout). A rank whose collective fails, or that aborts the group, marks the header,
// and its peers fail at their next check. Before its first sync point each rank writes what it is
// about to run (sequence number, kind, count, dtype, root) and after it compares with every peer:
// ranks whose collectives are out of step fail at once, each naming what the other called.
//
// Point-to-point transfers (pipeline stages) stay on the group's Gloo TCP connections, which are
// built first in any case: auto falls back to them when the segment cannot be shared.
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "comm/host_group.h"
#include "comm/job_auth.h"
#include "core/check.h"
#include "core/fault.h"
#include "core/log.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera::comm {

const char* transport_name(HostTransport t) {
  switch (t) {
    case HostTransport::kAuto:
      return "auto";
    case HostTransport::kTcp:
      return "tcp";
    case HostTransport::kShm:
      return "shm";
  }
  return "?";
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x316d68732d737374ull;  // "tss-shm1"
constexpr size_t kPage = 4096;
constexpr int kSpins = 1000;                            // ~20-40 us of pause before a sync point sleeps
constexpr auto kSlice = std::chrono::milliseconds(50);  // between checks for a broken group or a dead peer

// Bytes of one rank's slot in one buffer: 1 MiB, less where many ranks share the host, so that
// the segment stays within 16 MiB (Docker's default /dev/shm is 64 MiB, and a job has a segment
// per group).
size_t slot_bytes(int size) {
  const size_t s = std::clamp((size_t{16} << 20) / (2 * static_cast<size_t>(size)), size_t{64} << 10, size_t{1} << 20);
  return s / kPage * kPage;
}

// What a rank runs, in two entries used in turn by the collectives that pass sync points (count-0
// calls complete without one): a rank can be at most one such collective ahead of a peer that
// has yet to read its entry.
struct Call {
  uint64_t seq;
  uint64_t signature;
  int64_t count;
  int32_t kind, dtype, root;
};

struct alignas(64) RankArea {
  std::atomic<uint32_t> arrived;  // sync points passed: the futex word its peers sleep on
  int32_t pid;
  uint64_t pid_namespace;  // inode of /proc/self/ns/pid (a pid means nothing in another namespace)
  Call call[2];
};

struct Header {
  uint64_t magic;
  uint64_t nonce;
  int32_t size;
  uint32_t slot_bytes;
  alignas(64) std::atomic<uint32_t> broken_by;  // 0, or 1 + the rank that broke the group
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

size_t header_bytes(int size) {
  const size_t raw = sizeof(Header) + static_cast<size_t>(size) * sizeof(RankArea);
  return (raw + kPage - 1) / kPage * kPage;
}

size_t segment_bytes(int size) { return header_bytes(size) + 2 * static_cast<size_t>(size) * slot_bytes(size); }

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A process that exited: gone from the table, or a zombie its parent has not reaped.
bool process_gone(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  const size_t p = text.rfind(')');
  if (p == std::string::npos || p + 2 >= text.size()) return false;
  return text[p + 2] == 'Z' || text[p + 2] == 'X';
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while *word == seen, at most `limit` (returns early on a wake, a change or a signal).
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::nanoseconds limit) {
  const auto ns = std::max<int64_t>(limit.count(), 1000);
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// One mapping of the group's segment.
class Segment {
 public:
  // Rank 0: creates, reserves (a /dev/shm too small fails here, not with SIGBUS at first touch)
  // and maps `name`. Null with *error set on failure, nothing left behind.
  static std::unique_ptr<Segment> create(const std::string& name, int size, uint64_t nonce, std::string* error) {
    const size_t bytes = segment_bytes(size);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      *error = errno_text("cannot create " + name + " in /dev/shm");
      return nullptr;
    }
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      *error = "cannot reserve " + std::to_string(bytes >> 20) + " MiB for " + name +
               " in /dev/shm: " + std::strerror(rc) +
               " (a container's /dev/shm may be too small: raise it, or set parallel.host_transport = tcp)";
      ::close(fd);
      ::shm_unlink(name.c_str());
      return nullptr;
    }
    auto segment = map(fd, bytes, name, error);
    if (segment == nullptr) {
      ::shm_unlink(name.c_str());
      return nullptr;
    }
    Header* h = new (segment->base_) Header{};
    h->magic = kMagic;
    h->nonce = nonce;
    h->size = size;
    h->slot_bytes = static_cast<uint32_t>(slot_bytes(size));
    for (int r = 0; r < size; ++r) new (&segment->rank(r)) RankArea{};
    return segment;
  }

  // Another rank: maps `name` and checks that it is this group's (the nonce rank 0 posted).
  static std::unique_ptr<Segment> open(const std::string& name, int size, uint64_t nonce, std::string* error) {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      *error = errno_text("cannot open " + name + " in /dev/shm (another host, or another IPC namespace?)");
      return nullptr;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != segment_bytes(size)) {
      *error = name + " has " + std::to_string(st.st_size) + " bytes, not the " + std::to_string(segment_bytes(size)) +
               " a group of " + std::to_string(size) + " needs";
      ::close(fd);
      return nullptr;
    }
    auto segment = map(fd, segment_bytes(size), name, error);
    if (segment == nullptr) return nullptr;
    const Header& h = segment->header();
    if (h.magic != kMagic || h.nonce != nonce || h.size != size || h.slot_bytes != slot_bytes(size)) {
      *error = name + " is not this group's segment (its header differs)";
      return nullptr;
    }
    return segment;
  }

  ~Segment() { ::munmap(base_, bytes_); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankArea& rank(int r) const { return reinterpret_cast<RankArea*>(base_ + sizeof(Header))[r]; }
  size_t slot_size() const { return header().slot_bytes; }
  uint8_t* slot(uint64_t chunk, int r) const {
    const size_t size = static_cast<size_t>(header().size);
    return base_ + header_bytes(static_cast<int>(size)) + ((chunk & 1) * size + static_cast<size_t>(r)) * slot_size();
  }

 private:
  Segment(uint8_t* base, size_t bytes) : base_(base), bytes_(bytes) {}

  static std::unique_ptr<Segment> map(int fd, size_t bytes, const std::string& name, std::string* error) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int saved = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      errno = saved;
      *error = errno_text("cannot map " + name);
      return nullptr;
    }
    return std::unique_ptr<Segment>(new Segment(static_cast<uint8_t*>(p), bytes));
  }

  uint8_t* base_;
  size_t bytes_;
};

std::string describe(const Call& c) {
  const OpKind kind = static_cast<OpKind>(c.kind);
  return std::string(op_name(kind)) + " #" + std::to_string(c.seq) + " (" +
         shape_text(kind, c.count, static_cast<DType>(c.dtype), c.root) + ")";
}

class ShmGroup final : public HostGroup {
 public:
  ShmGroup(int rank, int size, std::unique_ptr<Segment> segment, std::unique_ptr<ProcessGroup> tcp)
      : HostGroup(rank, size), segment_(std::move(segment)), tcp_(std::move(tcp)) {}
  ~ShmGroup() override { stop_worker(); }

  std::string transport() const override { return "shared memory"; }

  std::unique_ptr<Work> all_gather(const void* in, void* out, int64_t count, DType dtype,
                                   const CollectiveOptions& options) override {
    return enqueue(OpKind::kAllGather, count, dtype, 0, [=, this](const OpInfo& op) {
      const auto deadline = Clock::now() + options.timeout;
      const size_t total = static_cast<size_t>(count) * dtype_bytes(dtype), step = segment_->slot_size();
      const uint8_t* src = static_cast<const uint8_t*>(in);
      uint8_t* dst = static_cast<uint8_t*>(out);
      for (size_t off = 0; off < total; off += step, ++chunk_) {
        const size_t n = std::min(step, total - off);
        std::memcpy(segment_->slot(chunk_, rank_), src + off, n);
        sync(op, deadline, off == 0);
        for (int p = 0; p < size_; ++p) {
          uint8_t* to = dst + static_cast<size_t>(p) * total + off;
          if (p != rank_) {
            std::memcpy(to, segment_->slot(chunk_, p), n);
          } else if (to != src + off) {
            std::memcpy(to, src + off, n);
          }
        }
      }
    });
  }

  std::unique_ptr<Work> reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                       const CollectiveOptions& options) override {
    return enqueue(OpKind::kReduceScatter, count, dtype, 0, [=, this](const OpInfo& op) {
      const auto deadline = Clock::now() + options.timeout;
      const size_t elem = dtype_bytes(dtype), c = static_cast<size_t>(count);
      const size_t step = segment_->slot_size() / (elem * static_cast<size_t>(size_));
      const uint8_t* src = static_cast<const uint8_t*>(in);
      std::vector<const uint8_t*> pieces(static_cast<size_t>(size_));
      for (size_t off = 0; off < c; off += step, ++chunk_) {
        const size_t n = std::min(step, c - off);
        uint8_t* mine = segment_->slot(chunk_, rank_);
        for (int j = 0; j < size_; ++j)
          std::memcpy(mine + static_cast<size_t>(j) * n * elem, src + (static_cast<size_t>(j) * c + off) * elem,
                      n * elem);
        sync(op, deadline, off == 0);
        for (int p = 0; p < size_; ++p) pieces[p] = segment_->slot(chunk_, p) + static_cast<size_t>(rank_) * n * elem;
        sum_ranks(pieces.data(), size_, static_cast<uint8_t*>(out) + off * elem, n, dtype);
      }
    });
  }

  std::unique_ptr<Work> all_reduce(void* data, int64_t count, DType dtype, const CollectiveOptions& options) override {
    return enqueue(OpKind::kAllReduce, count, dtype, 0, [=, this](const OpInfo& op) {
      const auto deadline = Clock::now() + options.timeout;
      const size_t elem = dtype_bytes(dtype), c = static_cast<size_t>(count), step = segment_->slot_size() / elem;
      uint8_t* buf = static_cast<uint8_t*>(data);
      std::vector<const uint8_t*> pieces(static_cast<size_t>(size_));
      for (size_t off = 0; off < c; off += step, ++chunk_) {
        const size_t n = std::min(step, c - off);
        auto segment_begin = [&](int p) { return n * static_cast<size_t>(p) / static_cast<size_t>(size_) * elem; };
        std::memcpy(segment_->slot(chunk_, rank_), buf + off * elem, n * elem);
        sync(op, deadline, off == 0);
        const size_t begin = segment_begin(rank_), end = segment_begin(rank_ + 1);
        for (int p = 0; p < size_; ++p) pieces[p] = segment_->slot(chunk_, p) + begin;
        sum_ranks(pieces.data(), size_, segment_->slot(chunk_, rank_) + begin, (end - begin) / elem, dtype);
        sync(op, deadline, false);
        for (int p = 0; p < size_; ++p) {
          const size_t b = segment_begin(p), e = segment_begin(p + 1);
          std::memcpy(buf + off * elem + b, segment_->slot(chunk_, p) + b, e - b);
        }
      }
    });
  }

  std::unique_ptr<Work> broadcast(void* data, int64_t count, DType dtype, int root,
                                  const CollectiveOptions& options) override {
    CHECK(root >= 0 && root < size_);
    return enqueue(OpKind::kBroadcast, count, dtype, root, [=, this](const OpInfo& op) {
      const auto deadline = Clock::now() + options.timeout;
      const size_t total = static_cast<size_t>(count) * dtype_bytes(dtype), step = segment_->slot_size();
      uint8_t* buf = static_cast<uint8_t*>(data);
      for (size_t off = 0; off < total; off += step, ++chunk_) {
        const size_t n = std::min(step, total - off);
        if (rank_ == root) std::memcpy(segment_->slot(chunk_, root), buf + off, n);
        sync(op, deadline, off == 0);
        if (rank_ != root) std::memcpy(buf + off, segment_->slot(chunk_, root), n);
      }
    });
  }

  std::unique_ptr<Work> barrier(const CollectiveOptions& options) override {
    return enqueue(OpKind::kBarrier, 0, DType::kF32, 0,
                   [=, this](const OpInfo& op) { sync(op, Clock::now() + options.timeout, true); });
  }

  std::unique_ptr<Work> send(const void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                             const CollectiveOptions& options) override {
    throw_if_broken(OpKind::kSend, peer, tag);
    return tcp_->send(data, count, dtype, peer, tag, options);
  }
  std::unique_ptr<Work> recv(void* data, int64_t count, DType dtype, int peer, uint32_t tag,
                             const CollectiveOptions& options) override {
    throw_if_broken(OpKind::kRecv, peer, tag);
    return tcp_->recv(data, count, dtype, peer, tag, options);
  }
  uint64_t bytes_sent(OpKind op) const override {
    return op == OpKind::kSend ? tcp_->bytes_sent(op) : HostGroup::bytes_sent(op);
  }

 private:
  // Peers learn at their next check (a spin, or a slice of sleep); the TCP connections close.
  void on_broken() override {
    uint32_t none = 0;
    Header& h = segment_->header();
    h.broken_by.compare_exchange_strong(none, static_cast<uint32_t>(rank_ + 1));
    for (int p = 0; p < size_; ++p) futex_wake_all(&segment_->rank(p).arrived);
    tcp_->abort();
  }

  void throw_if_broken(OpKind kind, int peer, uint32_t tag) const {
    const std::string earlier = broken();
    if (earlier.empty()) return;
    throw CollectiveError(std::string(op_name(kind)) + " tag " + std::to_string(tag) + " with rank " +
                          std::to_string(peer) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                          " failed: group unusable after an earlier failure: " + earlier);
  }

  // A sync point: this rank has written its slot (and, at an operation's first, its call); it
  // returns once every peer has passed as many sync points. `first`: compare the peers' calls.
  void sync(const OpInfo& op, Clock::time_point deadline, bool first) {
    RankArea& me = segment_->rank(rank_);
    const uint64_t slot = calls_ & 1;
    if (first) {
      me.call[slot] =
          Call{op.seq, op.signature, op.count, static_cast<int32_t>(op.kind), static_cast<int32_t>(op.dtype), op.root};
    }
    const uint32_t target = ++arrivals_;
    me.arrived.store(target, std::memory_order_release);
    futex_wake_all(&me.arrived);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) wait_for(p, target, deadline);
    }
    if (!first) return;
    ++calls_;
    for (int p = 0; p < size_; ++p) {
      const Call& theirs = segment_->rank(p).call[slot];
      if (theirs.seq != op.seq || theirs.signature != op.signature) {
        throw CollectiveError("rank " + std::to_string(p) + " called " + describe(theirs) +
                              " here: the ranks' collectives are out of step (compare the operation and sequence "
                              "number each rank names)");
      }
    }
  }

  void wait_for(int peer, uint32_t target, Clock::time_point deadline) {
    RankArea& area = segment_->rank(peer);
    for (int spin = 0;; ++spin) {
      const uint32_t seen = area.arrived.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - target) >= 0) return;
      if (spin < kSpins) {
        cpu_relax();
        continue;
      }
      const uint32_t by = segment_->header().broken_by.load(std::memory_order_acquire);
      if (by != 0) {
        throw CollectiveError("rank " + std::to_string(by - 1) +
                              " broke the group (it aborted or its collective failed: its log says why)");
      }
      if (area.pid_namespace == pid_namespace_ && process_gone(area.pid)) {
        throw CollectiveError("rank " + std::to_string(peer) + " (pid " + std::to_string(area.pid) +
                              ") is gone: its process exited while the group waited for it");
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        throw CollectiveError("timed out waiting for rank " + std::to_string(peer) + " (shared memory, pid " +
                              std::to_string(area.pid) + ")");
      }
      futex_wait(&area.arrived, seen, std::min<std::chrono::nanoseconds>(kSlice, deadline - now));
    }
  }

  std::unique_ptr<Segment> segment_;
  std::unique_ptr<ProcessGroup> tcp_;  // point to point, and what the segment replaced
  const uint64_t pid_namespace_ = pid_namespace();
  uint32_t arrivals_ = 0;  // sync points this rank has passed (worker only)
  uint64_t calls_ = 0;     // collectives that reached their first sync point (count-0 ones do not)
  uint64_t chunk_ = 0;     // chunks moved over the group's life: chunk_ % 2 is the buffer (worker only)
};

// Every rank of the group maps one segment, or none does: null, with *why naming each rank that
// could not and its reason.
std::unique_ptr<Segment> share_segment(Store& store, int rank, int size, Millis timeout, std::string* why) {
  const int64_t generation = store.add("shm/generation/rank" + std::to_string(rank), 1);
  const std::string prefix = "shm/" + std::to_string(generation) + "/";
  std::unique_ptr<Segment> segment;
  std::string error, name;
  if (rank == 0) {
    name = "/tessera-" + auth::random_hex(12);
    const std::string nonce = auth::random_hex(8);
    segment = Segment::create(name, size, std::stoull(nonce, nullptr, 16), &error);
    const std::string posted = segment != nullptr ? name + " " + nonce : "";
    store.set(prefix + "name", Bytes(posted.begin(), posted.end()));
  } else {
    const Bytes posted = store.get(prefix + "name", timeout);
    const std::string text(posted.begin(), posted.end());
    const size_t space = text.find(' ');
    if (space == std::string::npos) {
      error = "rank 0 could not create the segment";
    } else {
      name = text.substr(0, space);
      segment = Segment::open(name, size, std::stoull(text.substr(space + 1), nullptr, 16), &error);
    }
  }
  if (segment != nullptr && fault::point("shm.attach", rank, 0) == fault::Kind::kIo) {
    segment.reset();
    error = "cannot map the segment (TESSERA_FAULT shm.attach:io)";
  }
  if (segment != nullptr) {  // before the answer, so that no peer ever waits on a rank without a pid
    segment->rank(rank).pid = static_cast<int32_t>(::getpid());
    segment->rank(rank).pid_namespace = pid_namespace();
  }
  const std::string answer = segment != nullptr ? "ok" : error;
  store.set(prefix + "answer/" + std::to_string(rank), Bytes(answer.begin(), answer.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + "answer/" + std::to_string(r));
  store.wait(keys, timeout);
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());  // every rank that could map it has
  why->clear();
  for (int r = 0; r < size; ++r) {
    const Bytes b = store.get(keys[r], timeout);
    const std::string text(b.begin(), b.end());
    if (text != "ok") *why += (why->empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + text);
  }
  if (!why->empty()) return nullptr;
  return segment;
}

}  // namespace
}  // namespace detail

size_t shm_segment_bytes(int size) { return detail::segment_bytes(size); }

std::unique_ptr<ProcessGroup> make_host_group(Store& store, int rank, int size, const std::string& interface_host,
                                              Millis timeout, HostTransport transport) {
  std::unique_ptr<ProcessGroup> tcp = make_gloo_group(store, rank, size, interface_host, timeout);
  if (size == 1 || transport == HostTransport::kTcp) return tcp;
  std::string why;
  std::unique_ptr<detail::Segment> segment = detail::share_segment(store, rank, size, timeout, &why);
  if (segment == nullptr) {
    if (transport == HostTransport::kShm) {
      throw ConfigError("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                        ": parallel.host_transport = shm, but the group's ranks cannot share memory: " + why +
                        " (set it to auto or tcp)");
    }
    log::warn("a group of {} ranks keeps its collectives on TCP: its ranks cannot share memory ({})", size, why);
    return tcp;
  }
  return std::make_unique<detail::ShmGroup>(rank, size, std::move(segment), std::move(tcp));
}

}  // namespace tessera::comm
