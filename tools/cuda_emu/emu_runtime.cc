// The CUDA runtime and cuBLASLt entry points tessera uses, emulated on the CPU (emu_device.h says
// how kernels run). Declarations come from the real CUDA headers, so every signature and enum value
// is the toolkit's. Device memory is host memory from posix_memalign, exactly the bytes asked for
// (ASan sees overruns), registered so that copies, memsets and kernel pointer arguments outside a
// live allocation are reported. Kernels, copies and memsets run synchronously at the call, after
// the stream's asynchronous work (emu_async.h: the emulated NCCL's collectives) is done.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <barrier>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_async.h"
#include "emu_device.h"
#include "emu_warp.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

namespace emu {

thread_local uint3 tid, bid;
thread_local Block* cur = nullptr;
dim3 bdim, gdim;

void fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "CUDA EMULATION ERROR: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::fflush(stderr);
  std::abort();
}

namespace {

thread_local cudaError_t last_error = cudaSuccess;
cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// ---- device memory registry -----------------------------------------------------------------
std::mutex mem_mu;
std::map<uintptr_t, size_t> allocations;  // base -> bytes

// The allocation holding [p, p + n) (n may be 0: p may then be one past the end), or false.
bool in_allocation(const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mem_mu);
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

std::mutex stream_mu;
std::map<cudaStream_t, unsigned> streams;  // created streams and their flags
// Per stream (the legacy stream under nullptr): asynchronous work issued, not known to be done.
std::map<cudaStream_t, std::vector<PendingPtr>> in_flight;
cudaStream_t stream_key(cudaStream_t s) { return s == cudaStreamLegacy || s == cudaStreamPerThread ? nullptr : s; }
bool valid_stream(cudaStream_t s) {
  if (stream_key(s) == nullptr) return true;
  std::lock_guard<std::mutex> lock(stream_mu);
  return streams.count(s) != 0;
}

std::mutex attr_mu;
std::map<const void*, int> max_dynamic_smem;  // per kernel, from cudaFuncSetAttribute
constexpr size_t kDefaultSmem = 48 * 1024;
constexpr size_t kMaxOptinSmem = 227 * 1024;  // sm_90: 227 KB per block with the opt-in

// ---- blocks -------------------------------------------------------------------------------
enum class Mode { kFiber, kThreads };
Mode mode() {
  static const Mode m = [] {
    const char* e = std::getenv("EMU_MODE");
    if (e == nullptr || std::strcmp(e, "fiber") == 0) return Mode::kFiber;
    if (std::strcmp(e, "threads") == 0) return Mode::kThreads;
    fatal("EMU_MODE must be fiber or threads, not %s", e);
  }();
  return m;
}
enum class Order { kForward, kReverse, kRandom };
Order order() {
  static const Order o = [] {
    const char* e = std::getenv("EMU_ORDER");
    if (e == nullptr || std::strcmp(e, "forward") == 0) return Order::kForward;
    if (std::strcmp(e, "reverse") == 0) return Order::kReverse;
    if (std::strcmp(e, "random") == 0) return Order::kRandom;
    fatal("EMU_ORDER must be forward, reverse or random, not %s", e);
  }();
  return o;
}

}  // namespace

struct Fiber;

struct Block {
  unsigned n = 0;                 // threads
  std::vector<uint8_t> gathered;  // warp_gather's slots: kGatherBytes a thread
  char* dyn = nullptr;
  size_t dyn_bytes = 0;
  std::mutex mu;
  std::map<const void*, char*> statics;
  // Threads mode.
  std::unique_ptr<std::barrier<>> block_bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
  ~Block() {
    std::free(dyn);
    for (auto& [k, p] : statics) std::free(p);
  }
};

namespace {
thread_local unsigned lin = 0;  // linear thread index in the block

unsigned warp_size_of(const Block& b, unsigned warp) { return std::min(32u, b.n - 32 * warp); }

// ---- fibers -------------------------------------------------------------------------------
// On x86-64 fibers switch with emu_switch_stack below (ASan told of each switch, as around
// swapcontext): swapcontext saves and restores the signal mask, a system call per switch that took
// ~85% of an emulated training step. Elsewhere, ucontext.
#if defined(__x86_64__)
#define EMU_FAST_SWITCH 1
// Saves the callee-saved registers on the current stack and its pointer to *save, then resumes the
// stack at `load` (one that it saved, or one set up by start_stack).
extern "C" void emu_switch_stack(void** save, void* load);
asm(R"(
  .text
  .globl emu_switch_stack
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");
#else
#define EMU_FAST_SWITCH 0
#endif

enum class St { kReady, kAtBlock, kAtWarp, kDone };
struct FiberState {
  ucontext_t ctx;
  void* sp = nullptr;  // EMU_FAST_SWITCH: the saved stack pointer
  St st = St::kReady;
  char* stack = nullptr;
#if EMU_ASAN
  void* fake = nullptr;
#endif
};

// Small under ASan: each block unpoisons its fibers' whole stacks (frames of the block before).
constexpr size_t kStack = EMU_ASAN ? size_t{64} << 10 : size_t{512} << 10;
constexpr size_t kGuard = 4096;

struct Scheduler {
  std::vector<FiberState> f;
  ucontext_t main;
  void* main_sp = nullptr;
  unsigned current = 0;
  unsigned block_arrived = 0;
  std::vector<unsigned> warp_arrived;
  Body body = nullptr;
  void* ctx = nullptr;
  char* stacks = nullptr;
  size_t stacks_count = 0;
#if EMU_ASAN
  void* main_fake = nullptr;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
#endif
};
Scheduler sched;  // fibers run on the launching thread, one block at a time

void ensure_stacks(unsigned n) {
  if (sched.stacks_count >= n) return;
  if (sched.stacks) munmap(sched.stacks, sched.stacks_count * (kStack + kGuard));
  void* p =
      mmap(nullptr, n * (kStack + kGuard), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fatal("cannot map fiber stacks");
  sched.stacks = static_cast<char*>(p);
  sched.stacks_count = n;
  for (unsigned i = 0; i < n; ++i) mprotect(sched.stacks + i * (kStack + kGuard), kGuard, PROT_NONE);  // overflow
}

void set_thread_ids(unsigned t) {
  lin = t;
  tid = uint3{t % bdim.x, t / bdim.x % bdim.y, t / (bdim.x * bdim.y)};
}

// From a fiber back to the scheduler.
void yield() {
  FiberState& me = sched.f[sched.current];
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&me.fake, sched.main_bottom, sched.main_size);
#endif
#if EMU_FAST_SWITCH
  emu_switch_stack(&me.sp, sched.main_sp);
#else
  swapcontext(&me.ctx, &sched.main);
#endif
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(me.fake, &sched.main_bottom, &sched.main_size);
#endif
}

void fiber_entry() {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sched.main_bottom, &sched.main_size);
#endif
  sched.body(sched.ctx);
  sched.f[sched.current].st = St::kDone;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, sched.main_bottom, sched.main_size);
#endif
#if EMU_FAST_SWITCH
  void* discarded = nullptr;  // this fiber's stack is never resumed
  emu_switch_stack(&discarded, sched.main_sp);
  __builtin_unreachable();
#else
  setcontext(&sched.main);
#endif
}

#if EMU_FAST_SWITCH
// A fresh stack that emu_switch_stack enters at fiber_entry: six zero registers to pop, then
// fiber_entry's address to return to, then a slot standing for fiber_entry's own return address,
// so that it starts with the stack pointer 8 past a 16-byte boundary, as after a call.
void* start_stack(char* stack, size_t size) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top);
  *--slot = nullptr;                                // fiber_entry's return address: never used
  *--slot = reinterpret_cast<void*>(&fiber_entry);  // where the first switch returns
  for (int r = 0; r < 6; ++r) *--slot = nullptr;    // r15 .. rbp
  return slot;
}
#endif

const char* state_name(St s) {
  switch (s) {
    case St::kReady:
      return "running";
    case St::kAtBlock:
      return "at __syncthreads";
    case St::kAtWarp:
      return "at a warp barrier (__syncwarp or a shuffle)";
    case St::kDone:
      return "exited";
  }
  return "?";
}

[[noreturn]] void deadlock(const void* kernel) {
  std::string what;
  St last = St::kReady;
  unsigned from = 0;
  for (unsigned t = 0; t <= sched.f.size(); ++t) {
    const St s = t < sched.f.size() ? sched.f[t].st : St::kReady;
    if (t == sched.f.size() || (t > 0 && s != last)) {
      what += " threads " + std::to_string(from) + ".." + std::to_string(t - 1) + " " + state_name(last) + ";";
      from = t;
    }
    last = s;
  }
  fatal(
      "deadlock in kernel %p block (%u,%u,%u): no thread can proceed:%s (a barrier not reached by every thread "
      "of its block or warp)",
      kernel, bid.x, bid.y, bid.z, what.c_str());
}

void run_block_fibers(Block& b, const void* kernel, Body body, void* ctx) {
  const unsigned n = b.n;
  ensure_stacks(n);
  sched.f.assign(n, FiberState{});
  sched.block_arrived = 0;
  sched.warp_arrived.assign((n + 31) / 32, 0);
  sched.body = body;
  sched.ctx = ctx;
  for (unsigned t = 0; t < n; ++t) {
    FiberState& fs = sched.f[t];
    fs.stack = sched.stacks + t * (kStack + kGuard) + kGuard;
#if EMU_ASAN
    __asan_unpoison_memory_region(fs.stack, kStack);  // frames left by the previous block's fibers
#endif
#if EMU_FAST_SWITCH
    fs.sp = start_stack(fs.stack, kStack);
#else
    getcontext(&fs.ctx);
    fs.ctx.uc_stack.ss_sp = fs.stack;
    fs.ctx.uc_stack.ss_size = kStack;
    fs.ctx.uc_link = nullptr;
    makecontext(&fs.ctx, fiber_entry, 0);
#endif
  }
  std::vector<unsigned> order_v(n);
  for (unsigned t = 0; t < n; ++t) order_v[t] = order() == Order::kReverse ? n - 1 - t : t;
  static std::mt19937 rng([] {
    const char* e = std::getenv("EMU_SEED");
    return e ? static_cast<unsigned>(std::atoi(e)) : 1u;
  }());
  unsigned done = 0;
  while (done < n) {
    if (order() == Order::kRandom) std::shuffle(order_v.begin(), order_v.end(), rng);
    bool progress = false;
    for (unsigned t : order_v) {
      FiberState& fs = sched.f[t];
      if (fs.st != St::kReady) continue;
      progress = true;
      sched.current = t;
      set_thread_ids(t);
#if EMU_ASAN
      __sanitizer_start_switch_fiber(&sched.main_fake, fs.stack, kStack);
#endif
#if EMU_FAST_SWITCH
      emu_switch_stack(&sched.main_sp, fs.sp);
#else
      swapcontext(&sched.main, &fs.ctx);
#endif
#if EMU_ASAN
      __sanitizer_finish_switch_fiber(sched.main_fake, nullptr, nullptr);
#endif
      if (fs.st == St::kDone) ++done;
    }
    if (!progress) deadlock(kernel);
  }
}

void run_block_threads(Block& b, Body body, void* ctx) {
  const unsigned n = b.n;
  b.block_bar = std::make_unique<std::barrier<>>(n);
  for (unsigned w = 0; w < (n + 31) / 32; ++w)
    b.warp_bars.push_back(std::make_unique<std::barrier<>>(warp_size_of(b, w)));
  const uint3 block_id = bid;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (unsigned t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      cur = &b;
      bid = block_id;
      set_thread_ids(t);
      body(ctx);
    });
  }
  for (auto& th : threads) th.join();
}

}  // namespace

void block_sync() {
  Block& b = *cur;
  if (mode() == Mode::kThreads) {
    b.block_bar->arrive_and_wait();
    return;
  }
  FiberState& me = sched.f[sched.current];
  if (++sched.block_arrived == b.n) {
    sched.block_arrived = 0;
    for (auto& f : sched.f)
      if (f.st == St::kAtBlock) f.st = St::kReady;
  } else {
    me.st = St::kAtBlock;
  }
  yield();
}

void warp_sync(unsigned mask) {
  if (mask != 0xffffffffu) fatal("__syncwarp: only the full-warp mask is emulated (mask %#x)", mask);
  Block& b = *cur;
  const unsigned w = lin / 32;
  if (mode() == Mode::kThreads) {
    b.warp_bars[w]->arrive_and_wait();
    return;
  }
  FiberState& me = sched.f[sched.current];
  if (++sched.warp_arrived[w] == warp_size_of(b, w)) {
    sched.warp_arrived[w] = 0;
    for (unsigned t = 32 * w; t < 32 * w + warp_size_of(b, w); ++t)
      if (sched.f[t].st == St::kAtWarp) sched.f[t].st = St::kReady;
  } else {
    me.st = St::kAtWarp;
  }
  yield();
}

uint32_t warp_exchange(uint32_t v, unsigned src_lane) {
  uint32_t all[32];
  const unsigned lanes = warp_gather(&v, sizeof v, all);
  if (src_lane >= lanes) fatal("shuffle from lane %u, past the warp's last thread", src_lane);
  return all[src_lane];
}

unsigned warp_gather(const void* mine, size_t bytes, void* all) {
  Block& b = *cur;
  const unsigned w = lin / 32, lanes = warp_size_of(b, w);
  if (bytes > kGatherBytes) fatal("warp_gather: %zu bytes a lane, at most %zu", bytes, kGatherBytes);
  std::memcpy(&b.gathered[lin * kGatherBytes], mine, bytes);
  warp_sync(0xffffffffu);
  for (unsigned l = 0; l < lanes; ++l)
    std::memcpy(static_cast<char*>(all) + l * bytes, &b.gathered[(32 * w + l) * kGatherBytes], bytes);
  warp_sync(0xffffffffu);  // every lane has read before the next gather writes
  return lanes;
}

unsigned lane_id() { return lin % 32; }

void check_dynamic_smem(const void* p, size_t bytes, const char* what) {
  const Block& b = *cur;
  const char* c = static_cast<const char*>(p);
  if (b.dyn == nullptr || c < b.dyn || c + bytes > b.dyn + b.dyn_bytes)
    fatal("%s: %p is not in the block's dynamic shared memory (%zu bytes at %p)", what, p, b.dyn_bytes,
          static_cast<const void*>(b.dyn));
}

void* dynamic_smem() { return cur->dyn; }

void* static_smem(const void* key, size_t bytes, size_t align) {
  Block& b = *cur;
  std::lock_guard<std::mutex> lock(b.mu);
  auto it = b.statics.find(key);
  if (it != b.statics.end()) return it->second;
  void* p = nullptr;
  if (posix_memalign(&p, std::max<size_t>(align, 16), bytes) != 0) fatal("out of memory for static shared memory");
  std::memset(p, 0xff, bytes);
  b.statics.emplace(key, static_cast<char*>(p));
  return p;
}

void check_kernel_pointer(const void* kernel, int index, const void* p) {
  if (p == nullptr || in_allocation(p, 0)) return;
  fatal("kernel %p: pointer argument %d (%p) is not in device memory (not from cudaMalloc, or freed)", kernel, index,
        p);
}

std::vector<PendingPtr> stream_dependencies(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(stream_mu);
  return in_flight[stream_key(stream)];
}

void stream_push(cudaStream_t stream, PendingPtr work) {
  std::lock_guard<std::mutex> lock(stream_mu);
  in_flight[stream_key(stream)] = {std::move(work)};
}

// The legacy stream (nullptr) also waits for the streams created without cudaStreamNonBlocking,
// as CUDA's implicit synchronization does; all = true: every stream (cudaDeviceSynchronize).
void drain(cudaStream_t stream, bool all) {
  std::vector<PendingPtr> wait_for;
  {
    std::lock_guard<std::mutex> lock(stream_mu);
    const cudaStream_t key = stream_key(stream);
    for (auto& [s, list] : in_flight) {
      const bool blocking = s == nullptr || (streams.count(s) != 0 && (streams[s] & cudaStreamNonBlocking) == 0);
      if (s == key || all || (key == nullptr && blocking)) wait_for.insert(wait_for.end(), list.begin(), list.end());
    }
  }
  for (const PendingPtr& p : wait_for) p->wait();
  std::lock_guard<std::mutex> lock(stream_mu);
  for (auto& [s, list] : in_flight) std::erase_if(list, [](const PendingPtr& p) { return p->done(); });
}

void stream_drain(cudaStream_t stream) { drain(stream, false); }

long launches = 0;

cudaError_t launch(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Body body, void* ctx) {
  ++launches;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    return set_error(cudaErrorInvalidConfiguration);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return set_error(cudaErrorInvalidConfiguration);
  if (!valid_stream(stream)) return set_error(cudaErrorInvalidResourceHandle);
  if (smem > kDefaultSmem) {
    std::lock_guard<std::mutex> lock(attr_mu);
    auto it = max_dynamic_smem.find(kernel);
    if (it == max_dynamic_smem.end() || static_cast<size_t>(it->second) < smem) return set_error(cudaErrorInvalidValue);
  }
  if (cur != nullptr) fatal("kernel launched from device code (dynamic parallelism is not emulated)");
  stream_drain(stream);
  bdim = block;
  gdim = grid;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b;
        b.n = static_cast<unsigned>(threads);
        b.gathered.assign(size_t{b.n} * kGatherBytes, 0xff);
        b.dyn_bytes = smem;
        if (smem > 0) {
          void* p = nullptr;
          if (posix_memalign(&p, 128, smem) != 0) fatal("out of memory for dynamic shared memory");
          std::memset(p, 0xff, smem);
          b.dyn = static_cast<char*>(p);
        }
        bid = uint3{x, y, z};
        if (mode() == Mode::kFiber) {
          cur = &b;
          run_block_fibers(b, kernel, body, ctx);
          cur = nullptr;
        } else {
          run_block_threads(b, body, ctx);
        }
      }
    }
  }
  return cudaSuccess;
}

}  // namespace emu

// ---- the runtime API ------------------------------------------------------------------------
using emu::set_error;

extern "C" {

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    default:
      return "cudaError (emulated)";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    default:
      return cudaGetErrorName(e);
  }
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return emu::last_error; }

// EMU_DEVICES devices (default 4: hybrid sharding's test has four ranks, each on its own), all
// of them this process's memory; the current one is per thread, as in CUDA.
namespace emu {
int device_count() {
  static const int n = [] {
    const char* e = std::getenv("EMU_DEVICES");
    return e == nullptr ? 4 : std::max(1, std::atoi(e));
  }();
  return n;
}
bool valid_device(int d) { return d >= 0 && d < device_count(); }
thread_local int current_device = 0;
}  // namespace emu

cudaError_t cudaGetDeviceCount(int* count) {
  *count = emu::device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (!emu::valid_device(device)) return set_error(cudaErrorInvalidDevice);
  emu::current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = emu::current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  emu::drain(nullptr, true);
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (!emu::valid_device(device)) return set_error(cudaErrorInvalidDevice);
  std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", device);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!emu::valid_device(device)) return set_error(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "CPU emulation of an sm_90 device");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = size_t{16} << 30;
  p->multiProcessorCount = 1;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = emu::kDefaultSmem;
  p->sharedMemPerBlockOptin = emu::kMaxOptinSmem;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return set_error(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || static_cast<size_t>(value) > emu::kMaxOptinSmem) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(emu::attr_mu);
    emu::max_dynamic_smem[func] = value;
    return cudaSuccess;
  }
  return cudaSuccess;
}

// The emulated device's capacity: cudaMalloc refuses what would exceed it, as a full GPU does.
constexpr size_t kDeviceBytes = size_t{80} << 30;

size_t device_bytes_in_use() {
  std::lock_guard<std::mutex> lock(emu::mem_mu);
  size_t used = 0;
  for (const auto& [p, bytes] : emu::allocations) used += bytes;
  return used;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return set_error(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;  // the runtime returns null for 0 bytes
  if (bytes > kDeviceBytes - device_bytes_in_use()) return set_error(cudaErrorMemoryAllocation);
  void* q = nullptr;
  if (posix_memalign(&q, 256, bytes) != 0) return set_error(cudaErrorMemoryAllocation);
  std::memset(q, 0xa5, bytes);  // garbage, as fresh device memory (NaN-free; the NaN tests fill their own)
  std::lock_guard<std::mutex> lock(emu::mem_mu);
  emu::allocations[reinterpret_cast<uintptr_t>(q)] = bytes;
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(emu::mem_mu);
    auto it = emu::allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == emu::allocations.end()) return set_error(cudaErrorInvalidValue);
    emu::allocations.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  *total = kDeviceBytes;
  *free = kDeviceBytes - device_bytes_in_use();
  return cudaSuccess;
}

// Pinned host memory is host memory: a device pointer never points into it.
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (p == nullptr) return set_error(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (posix_memalign(p, 256, bytes) != 0) return set_error(cudaErrorMemoryAllocation);
  std::memset(*p, 0x5a, bytes);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

namespace emu {
cudaError_t memset_now(void* p, int value, size_t n);
cudaError_t memcpy_now(void* dst, const void* src, size_t n, cudaMemcpyKind kind);
}  // namespace emu

cudaError_t cudaMemset(void* p, int value, size_t n) {
  emu::stream_drain(nullptr);
  return emu::memset_now(p, value, n);
}

cudaError_t emu::memset_now(void* p, int value, size_t n) {
  if (n == 0) return cudaSuccess;
  if (!emu::in_allocation(p, n)) {
    std::fprintf(stderr, "CUDA EMULATION: cudaMemset of %zu bytes at %p outside device memory\n", n, p);
    return set_error(cudaErrorInvalidValue);
  }
  std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  if (!emu::valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
  emu::stream_drain(s);
  return emu::memset_now(p, value, n);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  emu::stream_drain(nullptr);
  return emu::memcpy_now(dst, src, n, kind);
}

cudaError_t emu::memcpy_now(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  const bool dst_dev = emu::in_allocation(dst, n), src_dev = emu::in_allocation(src, n);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dst_dev;
      break;
    case cudaMemcpyDeviceToHost:
      ok = src_dev;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dst_dev && src_dev;
      break;
    case cudaMemcpyHostToHost:
      break;
    case cudaMemcpyDefault:
      break;
    default:
      ok = false;
  }
  if (!ok) {
    std::fprintf(stderr,
                 "CUDA EMULATION: cudaMemcpy kind %d of %zu bytes %p -> %p: a device side outside device memory\n",
                 static_cast<int>(kind), n, src, dst);
    return set_error(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  if (!emu::valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
  emu::stream_drain(s);
  return emu::memcpy_now(dst, src, n, kind);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t s) {
  if (width > dpitch || width > spitch) return set_error(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; ++r) {
    const cudaError_t e = cudaMemcpyAsync(static_cast<char*>(dst) + r * dpitch,
                                          static_cast<const char*>(src) + r * spitch, width, kind, s);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr || (flags & ~1u) != 0) return set_error(cudaErrorInvalidValue);
  *s = reinterpret_cast<cudaStream_t>(new char);
  std::lock_guard<std::mutex> lock(emu::stream_mu);
  emu::streams[*s] = flags;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!emu::valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
  emu::stream_drain(s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!emu::valid_stream(s) || s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  emu::stream_drain(s);  // CUDA lets the work finish before releasing the stream
  std::lock_guard<std::mutex> lock(emu::stream_mu);
  emu::streams.erase(s);
  emu::in_flight.erase(s);
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}

// Events: what the stream had in flight when the event was recorded. The stream passes the event
// when that work is done, or at the record itself (kernels and copies run at their call): the
// later of the two is the event's time, for cudaEventElapsedTime.
struct EmuEvent {
  std::vector<emu::PendingPtr> work;
  bool timing = true;  // not created with cudaEventDisableTiming
  bool recorded = false;
  std::chrono::steady_clock::time_point recorded_at;
};
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (e == nullptr || (flags & ~0xfu) != 0) return set_error(cudaErrorInvalidValue);
  auto* ev = new EmuEvent;
  ev->timing = (flags & cudaEventDisableTiming) == 0;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<EmuEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr || !emu::valid_stream(s)) return set_error(cudaErrorInvalidResourceHandle);
  auto* ev = reinterpret_cast<EmuEvent*>(e);
  ev->work = emu::stream_dependencies(s);
  ev->recorded = true;
  ev->recorded_at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto* a = reinterpret_cast<EmuEvent*>(start);
  auto* b = reinterpret_cast<EmuEvent*>(end);
  if (ms == nullptr || a == nullptr || b == nullptr) return set_error(cudaErrorInvalidValue);
  if (!a->timing || !b->timing || !a->recorded || !b->recorded) return set_error(cudaErrorInvalidResourceHandle);
  std::chrono::steady_clock::time_point t[2];
  for (int i = 0; i < 2; ++i) {
    const EmuEvent* ev = i == 0 ? a : b;
    t[i] = ev->recorded_at;
    for (const emu::PendingPtr& p : ev->work) {
      if (!p->done()) return cudaErrorNotReady;  // as CUDA: not an error, the last error left alone
      t[i] = std::max(t[i], p->finished_at());
    }
  }
  *ms = std::chrono::duration<float, std::milli>(t[1] - t[0]).count();
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  for (const emu::PendingPtr& p : reinterpret_cast<EmuEvent*>(e)->work)
    if (!p->done()) return cudaErrorNotReady;  // not an error: the last error is left alone
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  for (const emu::PendingPtr& p : reinterpret_cast<EmuEvent*>(e)->work) p->wait();
  return cudaSuccess;
}
// Later work on s waits for the event's work: it joins what s has in flight.
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  if (e == nullptr || !emu::valid_stream(s) || flags != 0) return set_error(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(emu::stream_mu);
  std::vector<emu::PendingPtr>& list = emu::in_flight[emu::stream_key(s)];
  for (const emu::PendingPtr& p : reinterpret_cast<EmuEvent*>(e)->work) list.push_back(p);
  return cudaSuccess;
}

}  // extern "C"

// ---- cuBLASLt ---------------------------------------------------------------------------------
// Documented semantics, column-major: D = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n,
// C and D m x n; element (i, j) of a matrix with leading dimension ld at [i + j * ld]. Products
// summed in double, then rounded to the output type once; with beta == 0 C is not read.
struct cublasLtContext {
  int magic = 0x6c74;
};

namespace emu {
namespace {
constexpr uint64_t kDescMagic = 0xde5c, kLayoutMagic = 0x1a70, kPrefMagic = 0x9ef, kAlgoMagic = 0xa190;

struct DescData {
  uint64_t magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa, transb;
};
struct LayoutData {
  uint64_t magic;
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct PrefData {
  uint64_t magic;
  uint64_t max_workspace;
  uint32_t reduction_mask;
  uint32_t align[4];  // A, B, C, D
};
struct AlgoData {
  uint64_t magic;
  uint64_t problem;  // hash of the description and layouts it was chosen for
  uint32_t align[4];
};
static_assert(sizeof(DescData) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(LayoutData) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(PrefData) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(AlgoData) <= sizeof(cublasLtMatmulAlgo_t));

template <typename D, typename O>
D* data(O* o, uint64_t magic) {
  if (o == nullptr) return nullptr;
  auto* d = reinterpret_cast<D*>(o);
  return d->magic == magic ? d : nullptr;
}

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL; }
uint64_t problem_hash(const DescData& d, const LayoutData* const (&l)[4]) {
  uint64_t h = mix(mix(mix(0, d.compute), d.transa), d.transb);
  for (const LayoutData* x : l) h = mix(mix(mix(mix(h, x->type), x->rows), x->cols), static_cast<uint64_t>(x->ld));
  return h;
}

int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

size_t type_size(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

float tf32(float x) {  // round to nearest even on the 13 low mantissa bits
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

double load(const void* base, cudaDataType t, int64_t idx, bool round_tf32) {
  if (t == CUDA_R_16BF) {
    const uint16_t h = static_cast<const uint16_t*>(base)[idx];
    return static_cast<double>(__uint_as_float(static_cast<uint32_t>(h) << 16));
  }
  const float f = static_cast<const float*>(base)[idx];
  return round_tf32 ? tf32(f) : f;
}

// Problem sizes implied by the description and layouts, or false if they disagree.
struct Problem {
  uint64_t m, n, k;
};
cublasStatus_t check_problem(const DescData& d, const LayoutData& a, const LayoutData& b, const LayoutData& c,
                             const LayoutData& dd, Problem* out) {
  const bool ta = d.transa != CUBLAS_OP_N, tb = d.transb != CUBLAS_OP_N;
  if ((d.transa != CUBLAS_OP_N && d.transa != CUBLAS_OP_T) || (d.transb != CUBLAS_OP_N && d.transb != CUBLAS_OP_T))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t m = ta ? a.cols : a.rows, ka = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows, n = tb ? b.rows : b.cols;
  if (ka != kb || c.rows != m || c.cols != n || dd.rows != m || dd.cols != n) {
    std::fprintf(stderr,
                 "cuBLASLt emulation: inconsistent sizes: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu\n",
                 (unsigned long long)m, (unsigned long long)ka, (unsigned long long)kb, (unsigned long long)n,
                 (unsigned long long)c.rows, (unsigned long long)c.cols, (unsigned long long)dd.rows,
                 (unsigned long long)dd.cols);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (const LayoutData* l : {&a, &b, &c, &dd}) {
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(1, l->rows))) {
      std::fprintf(stderr, "cuBLASLt emulation: ld %lld below the layout's %llu rows\n", (long long)l->ld,
                   (unsigned long long)l->rows);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (c.type != dd.type || c.ld != dd.ld) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Type combinations of cuBLASLt's table for fp32 compute and scale: A/B fp32 with C/D fp32,
  // A/B bf16 with C/D bf16 or fp32; TF32 fast compute on fp32 inputs only.
  if (d.scale != CUDA_R_32F || a.type != b.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d.compute == CUBLAS_COMPUTE_32F) {
    if (a.type == CUDA_R_32F && c.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a.type == CUDA_R_16BF && c.type != CUDA_R_32F && c.type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a.type != CUDA_R_32F && a.type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
    if (a.type != CUDA_R_32F || c.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  *out = Problem{m, n, ka};
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace
}  // namespace emu

extern "C" {

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (h == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* o = new cublasLtMatmulDescOpaque_t{};
  auto* d = reinterpret_cast<emu::DescData*>(o);
  *d = emu::DescData{emu::kDescMagic, compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  *desc = o;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (desc != nullptr && emu::data<emu::DescData>(desc, emu::kDescMagic) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  auto* d = emu::data<emu::DescData>(desc, emu::kDescMagic);
  if (d == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      int32_t v;
      std::memcpy(&v, buf, 4);
      if (v != CUBLAS_OP_N && v != CUBLAS_OP_T && v != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
      if (v == CUBLAS_OP_C) v = CUBLAS_OP_T;  // real types: the conjugate transpose is the transpose
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      std::fprintf(stderr, "cuBLASLt emulation: matmul desc attribute %d not emulated\n", static_cast<int>(attr));
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* o = new cublasLtMatrixLayoutOpaque_t{};
  *reinterpret_cast<emu::LayoutData*>(o) = emu::LayoutData{emu::kLayoutMagic, type, rows, cols, ld};
  *layout = o;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (layout != nullptr && emu::data<emu::LayoutData>(layout, emu::kLayoutMagic) == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* o = new cublasLtMatmulPreferenceOpaque_t{};
  *reinterpret_cast<emu::PrefData*>(o) =
      emu::PrefData{emu::kPrefMagic, 0, CUBLASLT_REDUCTION_SCHEME_MASK, {256, 256, 256, 256}};
  *pref = o;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (pref != nullptr && emu::data<emu::PrefData>(pref, emu::kPrefMagic) == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  auto* p = emu::data<emu::PrefData>(pref, emu::kPrefMagic);
  if (p == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&p->max_workspace, buf, 8);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&p->reduction_mask, buf, 4);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      uint32_t v;
      std::memcpy(&v, buf, 4);
      p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      std::fprintf(stderr, "cuBLASLt emulation: preference attribute %d not emulated\n", static_cast<int>(attr));
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* count) {
  auto* dd = emu::data<emu::DescData>(desc, emu::kDescMagic);
  auto* la = emu::data<emu::LayoutData>(a, emu::kLayoutMagic);
  auto* lb = emu::data<emu::LayoutData>(b, emu::kLayoutMagic);
  auto* lc = emu::data<emu::LayoutData>(c, emu::kLayoutMagic);
  auto* ld = emu::data<emu::LayoutData>(d, emu::kLayoutMagic);
  auto* p = emu::data<emu::PrefData>(pref, emu::kPrefMagic);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!dd || !la || !lb || !lc || !ld || !p || requested < 1 || results == nullptr || count == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  emu::Problem prob;
  const cublasStatus_t st = emu::check_problem(*dd, *la, *lb, *lc, *ld, &prob);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  for (uint32_t al : p->align) {
    if (al == 0 || (al & (al - 1)) != 0) return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Elements must be aligned to their own size at least: an algorithm needs that much.
  const uint32_t need[4] = {
      static_cast<uint32_t>(emu::type_size(la->type)), static_cast<uint32_t>(emu::type_size(lb->type)),
      static_cast<uint32_t>(emu::type_size(lc->type)), static_cast<uint32_t>(emu::type_size(ld->type))};
  *count = 0;
  for (int i = 0; i < 4; ++i) {
    if (p->align[i] < need[i]) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  cublasLtMatmulHeuristicResult_t r{};
  auto* algo = reinterpret_cast<emu::AlgoData*>(&r.algo);
  const emu::LayoutData* const ls[4] = {la, lb, lc, ld};
  *algo =
      emu::AlgoData{emu::kAlgoMagic, emu::problem_hash(*dd, ls), {p->align[0], p->align[1], p->align[2], p->align[3]}};
  r.workspaceSize = 0;  // the emulated algorithm needs none (and never reduces split-K in place)
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha_p, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta_p,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo_p, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  auto* dd = emu::data<emu::DescData>(desc, emu::kDescMagic);
  auto* la = emu::data<emu::LayoutData>(a, emu::kLayoutMagic);
  auto* lb = emu::data<emu::LayoutData>(b, emu::kLayoutMagic);
  auto* lc = emu::data<emu::LayoutData>(c, emu::kLayoutMagic);
  auto* ld = emu::data<emu::LayoutData>(d, emu::kLayoutMagic);
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!dd || !la || !lb || !lc || !ld || alpha_p == nullptr || beta_p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!emu::valid_stream(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  emu::stream_drain(stream);  // after what the stream has in flight, as every launch on it
  emu::Problem prob;
  const cublasStatus_t st = emu::check_problem(*dd, *la, *lb, *lc, *ld, &prob);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const uint64_t m = prob.m, n = prob.n, k = prob.k;
  if (algo_p != nullptr) {
    const auto* algo = reinterpret_cast<const emu::AlgoData*>(algo_p);
    const emu::LayoutData* const ls[4] = {la, lb, lc, ld};
    if (algo->magic != emu::kAlgoMagic || algo->problem != emu::problem_hash(*dd, ls)) {
      std::fprintf(stderr, "cuBLASLt emulation: the algorithm was chosen for another problem than this matmul's\n");
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    const void* ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; ++i) {
      if (static_cast<uint32_t>(emu::alignment_of(ptrs[i])) < algo->align[i]) {
        std::fprintf(stderr,
                     "cuBLASLt emulation: operand %c at %p is less aligned than the %u bytes its algorithm assumes\n",
                     "ABCD"[i], ptrs[i], algo -> align[i]);
        return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
  }
  (void)workspace;
  (void)workspace_bytes;
  // Every element each operand's layout covers must be device memory.
  auto extent = [](const emu::LayoutData& l) -> size_t {
    return l.cols == 0 ? 0 : ((l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows) * emu::type_size(l.type);
  };
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);
  if ((k > 0 && ((m > 0 && n > 0 && !emu::in_allocation(A, extent(*la))) ||
                 (m > 0 && n > 0 && !emu::in_allocation(B, extent(*lb))))) ||
      (beta != 0.0f && !emu::in_allocation(C, extent(*lc))) || !emu::in_allocation(D, extent(*ld))) {
    std::fprintf(stderr, "cuBLASLt emulation: an operand's layout reaches outside device memory\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = dd->transa != CUBLAS_OP_N, tb = dd->transb != CUBLAS_OP_N;
  const bool round_tf32 = dd->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  std::vector<double> out(m * n);
  for (uint64_t j = 0; j < n; ++j) {
    for (uint64_t i = 0; i < m; ++i) {
      double s = 0.0;
      for (uint64_t p = 0; p < k; ++p) {
        // op(A)(i, p) and op(B)(p, j), column-major.
        const int64_t ia = ta ? static_cast<int64_t>(p + i * la->ld) : static_cast<int64_t>(i + p * la->ld);
        const int64_t ib = tb ? static_cast<int64_t>(j + p * lb->ld) : static_cast<int64_t>(p + j * lb->ld);
        s += emu::load(A, la->type, ia, round_tf32) * emu::load(B, lb->type, ib, round_tf32);
      }
      double v = static_cast<double>(alpha) * s;
      if (beta != 0.0f) v += static_cast<double>(beta) * emu::load(C, lc->type, i + j * lc->ld, false);
      out[i + j * m] = v;
    }
  }
  // Written after every read: D may be C.
  for (uint64_t j = 0; j < n; ++j) {
    for (uint64_t i = 0; i < m; ++i) {
      const float f = static_cast<float>(out[i + j * m]);
      const int64_t idx = static_cast<int64_t>(i + j * ld->ld);
      if (ld->type == CUDA_R_16BF) {
        uint32_t u = __float_as_uint(f);
        const uint16_t hbits = (u & 0x7fffffffu) > 0x7f800000u
                                   ? static_cast<uint16_t>((u >> 16) | 0x40)
                                   : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        static_cast<uint16_t*>(D)[idx] = hbits;
      } else {
        static_cast<float*>(D)[idx] = f;
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
