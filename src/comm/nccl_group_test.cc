// NCCL process group on real devices. Every CUDA call happens in forked children: a process
// that has initialized CUDA cannot use it after fork, so the gtest process never touches CUDA.
#include <gtest/gtest.h>

#if TESSERA_HAS_NCCL

#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl_group.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/test_util.h"
#include "core/bf16.h"

namespace tessera::comm {
namespace {

using namespace test_util;  // NOLINT: the shared test helpers

#define REQUIRE_CUDA(call) REQUIRE((call) == cudaSuccess)

// The number of CUDA devices, probed in a child; 0 with *why set when there are none.
int device_count(std::string* why) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    ::close(fds[0]);
    std::string reason;
    int n = 0;
    if (nccl_available(&reason) && cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    std::string msg = std::to_string(n) + "\n" + reason;
    ssize_t written = ::write(fds[1], msg.data(), msg.size());
    ::_exit(written == static_cast<ssize_t>(msg.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[256];
  ssize_t got;
  while ((got = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(got));
  ::close(fds[0]);
  int ws = 0;
  ::waitpid(pid, &ws, 0);
  const size_t nl = msg.find('\n');
  if (nl == std::string::npos) {
    *why = "the device probe process failed";
    return 0;
  }
  *why = msg.substr(nl + 1);
  return std::atoi(msg.substr(0, nl).c_str());
}

#define REQUIRE_DEVICES(n)                                                            \
  do {                                                                                \
    std::string why_;                                                                 \
    const int have_ = device_count(&why_);                                            \
    if (have_ == 0) GTEST_SKIP() << "no CUDA device: " << why_;                       \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA devices, has " << have_; \
  } while (0)

constexpr auto kTimeout = std::chrono::seconds(30);


// Host values <-> device buffer of `dtype`.
struct DeviceBuf {
  void* ptr = nullptr;
  ~DeviceBuf() {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
};

bool to_device(const std::vector<float>& v, DType dtype, DeviceBuf* buf) {
  const size_t n = std::max<size_t>(v.size(), 1);
  if (cudaMalloc(&buf->ptr, n * dtype_bytes(dtype)) != cudaSuccess) return false;
  if (v.empty()) return true;
  if (dtype == DType::kF32) return cudaMemcpy(buf->ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  return cudaMemcpy(buf->ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess;
}

bool from_device(const DeviceBuf& buf, size_t n, DType dtype, std::vector<float>* out) {
  out->assign(n, 0.0f);
  if (n == 0) return true;
  if (dtype == DType::kF32) return cudaMemcpy(out->data(), buf.ptr, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
  std::vector<uint16_t> h(n);
  if (cudaMemcpy(h.data(), buf.ptr, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (size_t i = 0; i < n; ++i) (*out)[i] = bf16_to_f32(h[i]);
  return true;
}

// Integer inputs distinct per rank and element, small enough to stay exact in bf16 sums.
float value(int rank, size_t i) { return static_cast<float>(rank * 7 + static_cast<int>(i % 13) - 5); }

// Every collective on `world` ranks (device = rank), both dtypes, counts 0, 1, odd and large.
int run_all_collectives(int rank, int world, const std::string& dir) {
  auto store = make_file_store(dir, "job", "r0");
  auto pg = make_nccl_group(*store, rank, world, rank, kTimeout);
  REQUIRE(pg->rank() == rank && pg->size() == world);
  const CollectiveOptions opts;
  const size_t w = static_cast<size_t>(world);
  uint64_t expect[static_cast<int>(OpKind::kCount)] = {};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const size_t e = dtype_bytes(dtype);
    for (size_t c : {size_t{0}, size_t{1}, size_t{7}, size_t{100003}}) {
      std::vector<float> got;
      // all_gather
      std::vector<float> mine(c);
      for (size_t i = 0; i < c; ++i) mine[i] = value(rank, i);
      DeviceBuf in, out;
      REQUIRE(to_device(mine, dtype, &in));
      REQUIRE(to_device(std::vector<float>(c * w), dtype, &out));
      REQUIRE_CUDA(cudaDeviceSynchronize());  // inputs written before the group's stream reads them
      pg->all_gather(in.ptr, out.ptr, static_cast<int64_t>(c), dtype, opts)->wait();
      REQUIRE(from_device(out, c * w, dtype, &got));
      for (size_t r = 0; r < w; ++r)
        for (size_t i = 0; i < c; ++i) REQUIRE(got[r * c + i] == value(static_cast<int>(r), i));
      expect[int(OpKind::kAllGather)] += (w - 1) * c * e;

      // reduce_scatter: in[r*c + i] = value(rank, r*c + i); out[i] = sum over ranks.
      std::vector<float> rs_in(c * w);
      for (size_t i = 0; i < c * w; ++i) rs_in[i] = value(rank, i);
      DeviceBuf rs, rs_out;
      REQUIRE(to_device(rs_in, dtype, &rs));
      REQUIRE(to_device(std::vector<float>(c), dtype, &rs_out));
      REQUIRE_CUDA(cudaDeviceSynchronize());
      pg->reduce_scatter(rs.ptr, rs_out.ptr, static_cast<int64_t>(c), dtype, opts)->wait();
      REQUIRE(from_device(rs_out, c, dtype, &got));
      for (size_t i = 0; i < c; ++i) {
        float sum = 0;
        for (int r = 0; r < world; ++r) sum += value(r, static_cast<size_t>(rank) * c + i);
        REQUIRE(got[i] == sum);
      }
      expect[int(OpKind::kReduceScatter)] += (w - 1) * c * e;

      // all_reduce in place
      DeviceBuf ar;
      REQUIRE(to_device(mine, dtype, &ar));
      REQUIRE_CUDA(cudaDeviceSynchronize());
      pg->all_reduce(ar.ptr, static_cast<int64_t>(c), dtype, opts)->wait();
      REQUIRE(from_device(ar, c, dtype, &got));
      for (size_t i = 0; i < c; ++i) {
        float sum = 0;
        for (int r = 0; r < world; ++r) sum += value(r, i);
        REQUIRE(got[i] == sum);
      }
      expect[int(OpKind::kAllReduce)] += 2 * (w - 1) * c * e / w;

      // broadcast from the last rank
      const int root = world - 1;
      DeviceBuf bc;
      REQUIRE(to_device(mine, dtype, &bc));
      REQUIRE_CUDA(cudaDeviceSynchronize());
      pg->broadcast(bc.ptr, static_cast<int64_t>(c), dtype, root, opts)->wait();
      REQUIRE(from_device(bc, c, dtype, &got));
      for (size_t i = 0; i < c; ++i) REQUIRE(got[i] == value(root, i));
      if (rank != (root + world - 1) % world) expect[int(OpKind::kBroadcast)] += c * e;
    }
  }
  pg->barrier(opts)->wait();
  expect[int(OpKind::kBarrier)] += 2 * (w - 1) * 4 / w;
  for (int k = 0; k < int(OpKind::kCount); ++k) REQUIRE(pg->bytes_sent(static_cast<OpKind>(k)) == expect[k]);
  return 0;
}

TEST(NcclGroup, WorldOneAllCollectives) {
  REQUIRE_DEVICES(1);
  TempDir dir;
  expect_all_ok(run_ranks(1, [&](int rank) { return run_all_collectives(rank, 1, dir.path); }));
}

TEST(NcclGroup, TwoRanksAllCollectives) {
  REQUIRE_DEVICES(2);
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](int rank) { return run_all_collectives(rank, 2, dir.path); }));
}

// Point to point on `world` ranks, both dtypes, counts 1, odd and large (far past NCCL's buffers,
// so a send moves only as its receiver takes it): a ring where every rank sends to the next and
// receives from the previous in one batch (issued one by one, every rank's first send would wait
// for a receive queued behind its receiver's own send); two messages to the same peer in a row,
// which meet their receives in issue order; and lone sends and receives, ordered so that they
// cannot wait on each other. Values exact; bytes counted as sent.
int run_point_to_point(int rank, int world, const std::string& dir) {
  auto store = make_file_store(dir, "job", "r0");
  auto pg = make_nccl_group(*store, rank, world, rank, kTimeout);
  const CollectiveOptions opts;
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  uint64_t batched = 0, alone = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (size_t c : {size_t{1}, size_t{7}, size_t{1} << 22}) {
      std::vector<float> mine(c), other(c), got;
      for (size_t i = 0; i < c; ++i) mine[i] = value(rank, i), other[i] = value(rank + world, i);
      DeviceBuf a, b, ra, rb;
      REQUIRE(to_device(mine, dtype, &a) && to_device(other, dtype, &b));
      REQUIRE(to_device(std::vector<float>(c), dtype, &ra) && to_device(std::vector<float>(c), dtype, &rb));
      REQUIRE_CUDA(cudaDeviceSynchronize());
      const auto n = static_cast<int64_t>(c);
      // The ring, then two messages in a row to the next rank: a to a's slot, b to b's.
      pg->send_recv({{true, a.ptr, n, dtype, next, 0}, {false, ra.ptr, n, dtype, prev, 0}}, opts)->wait();
      REQUIRE(from_device(ra, c, dtype, &got));
      for (size_t i = 0; i < c; ++i) REQUIRE(got[i] == value(prev, i));
      pg->send_recv({{false, ra.ptr, n, dtype, prev, 1},
                     {false, rb.ptr, n, dtype, prev, 2},
                     {true, a.ptr, n, dtype, next, 1},
                     {true, b.ptr, n, dtype, next, 2}},
                    opts)
          ->wait();
      REQUIRE(from_device(ra, c, dtype, &got));
      for (size_t i = 0; i < c; ++i) REQUIRE(got[i] == value(prev, i));
      REQUIRE(from_device(rb, c, dtype, &got));
      for (size_t i = 0; i < c; ++i) REQUIRE(got[i] == value(prev + world, i));
      batched += 3 * c * dtype_bytes(dtype);
      // Alone: rank 0 sends to rank 1 and waits for its reply; rank 1 receives, then replies.
      if (rank == 0) {
        pg->send(a.ptr, n, dtype, 1, 3, opts)->wait();
        pg->recv(rb.ptr, n, dtype, 1, 4, opts)->wait();
        REQUIRE(from_device(rb, c, dtype, &got));
        for (size_t i = 0; i < c; ++i) REQUIRE(got[i] == value(1 + world, i));
        alone += c * dtype_bytes(dtype);
      } else if (rank == 1) {
        pg->recv(ra.ptr, n, dtype, 0, 3, opts)->wait();
        pg->send(b.ptr, n, dtype, 0, 4, opts)->wait();
        REQUIRE(from_device(ra, c, dtype, &got));
        for (size_t i = 0; i < c; ++i) REQUIRE(got[i] == value(0, i));
        alone += c * dtype_bytes(dtype);
      }
    }
  }
  REQUIRE(pg->bytes_sent(OpKind::kSendRecv) == batched && pg->bytes_sent(OpKind::kSend) == alone);
  return 0;
}

TEST(NcclGroup, ThreeRanksPointToPoint) {
  REQUIRE_DEVICES(3);
  TempDir dir;
  expect_all_ok(run_ranks(3, [&](int rank) { return run_point_to_point(rank, 3, dir.path); }));
}

// Rank 0 of 2 publishes the id and waits in ncclCommInitRankConfig for a rank 1 that never
// comes: CollectiveError at the timeout, not a hang. Rank 1 alone finds no id: StoreError.
TEST(NcclGroup, PeerThatNeverJoinsTimesOut) {
  REQUIRE_DEVICES(1);
  TempDir dir;
  expect_all_ok(run_ranks(1, [&](int rank) {
    auto store = make_file_store(dir.path, "job", "r0");
    auto t0 = Clock::now();
    try {
      make_nccl_group(*store, 0, 2, 0, std::chrono::milliseconds(2000));
      REQUIRE(false);
    } catch (const CollectiveError& e) {
      std::string what = e.what();
      REQUIRE(what.find("rank 0 of 2") != std::string::npos);
      REQUIRE(what.find("timed out") != std::string::npos);
    }
    REQUIRE(seconds_since(t0) >= 1.9);
    REQUIRE(seconds_since(t0) < 20.0);

    auto other = make_file_store(dir.path, "job", "r1");
    t0 = Clock::now();
    try {
      make_nccl_group(*other, 1, 2, 0, std::chrono::milliseconds(500));
      REQUIRE(false);
    } catch (const StoreError& e) {
      REQUIRE(std::string(e.what()).find("rank 1 of 2") != std::string::npos);
    }
    REQUIRE(seconds_since(t0) >= 0.45);
    return 0;
  }));
}

// Rank 1 joins but never calls all_reduce: rank 0's wait() throws at the timeout naming the
// operation, aborts the communicator, and later operations fail at once.
TEST(NcclGroup, CollectiveTimeoutAborts) {
  REQUIRE_DEVICES(2);
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](int rank) {
    auto store = make_file_store(dir.path, "job", "r0");
    auto pg = make_nccl_group(*store, rank, 2, rank, kTimeout);
    pg->barrier({})->wait();  // connected
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(4));
      pg->abort();
      return 0;
    }
    DeviceBuf buf;
    REQUIRE(to_device(std::vector<float>(1024, 1.0f), DType::kF32, &buf));
    REQUIRE_CUDA(cudaDeviceSynchronize());
    CollectiveOptions opts;
    opts.timeout = std::chrono::milliseconds(1000);
    auto t0 = Clock::now();
    try {
      pg->all_reduce(buf.ptr, 1024, DType::kF32, opts)->wait();
      REQUIRE(false);
    } catch (const CollectiveError& e) {
      std::string what = e.what();
      REQUIRE(what.find("all_reduce #1 on rank 0 of 2 failed") != std::string::npos);
      REQUIRE(e.exit_code() == kExitPeer);
    }
    REQUIRE(seconds_since(t0) >= 0.95);
    REQUIRE(seconds_since(t0) < 3.5);
    t0 = Clock::now();
    try {
      pg->barrier(opts)->wait();
      REQUIRE(false);
    } catch (const CollectiveError& e) {
      REQUIRE(std::string(e.what()).find("barrier #2 on rank 0 of 2 failed") != std::string::npos);
    }
    REQUIRE(seconds_since(t0) < 0.5);
    return 0;
  }));
}

}  // namespace
}  // namespace tessera::comm

#else  // !TESSERA_HAS_NCCL

TEST(NcclGroup, Skipped) { GTEST_SKIP() << "built without CUDA (TESSERA_CUDA off): no NCCL backend"; }

#endif
