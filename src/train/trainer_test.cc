// The optimizer step: no allocation after start-up, accumulation equivalence, determinism,
// schedule and clipping.
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <numbers>
#include <utility>

#include "kernels/profiling_backend.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

// Counts operator new calls in this test binary by size, so a test can assert that a region
// allocates no buffers. (oneDNN's sgemm makes a few small bookkeeping allocations per call; they
// are below the threshold and cost neither page faults nor measurable time.)
// AddressSanitizer owns the allocator (and its shadow memory takes page faults of its own), so
// the replacement and the test that needs it are left out of sanitizer builds.
#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_COUNTS_ALLOCATIONS 0
#else
#define TESSERA_COUNTS_ALLOCATIONS 1
namespace {
constexpr size_t kBufferBytes = 1024;
std::atomic<int64_t> g_allocations{0};
}  // namespace
void* operator new(size_t n) {
  if (n >= kBufferBytes) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// GCC at -O1 (how test files build) sees the replaced new and delete as a mismatched pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace tessera::train {
namespace {

config::Config tiny(const config::Overrides& extra = {}) {
  config::Overrides o = {{"model.preset", "tiny"},
                         {"train.batch_size", "8"},
                         {"train.threads", "2"},
                         {"train.max_steps", "10"},
                         {"data.synthetic", "true"}};
  o.insert(o.end(), extra.begin(), extra.end());
  return config::load("", o);
}

[[maybe_unused]] int64_t minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

void expect_steps_do_not_allocate(const char* param_dtype) {
#if !TESSERA_COUNTS_ALLOCATIONS
  (void)param_dtype;
  GTEST_SKIP() << "allocation counting is not possible under AddressSanitizer";
#else
  Trainer t(tiny({{"train.micro_batch_size", "4"}, {"parallel.param_dtype", param_dtype}}), "");
  t.step();
  const int64_t allocations = g_allocations.load(), faults = minor_page_faults();
  for (int i = 0; i < 3; ++i) t.step();
  EXPECT_EQ(g_allocations.load() - allocations, 0);
  // Memory returned to the OS and touched again would fault once per page (PyTorch on CPU takes
  // ~800k faults per bench step); a planned step takes none beyond noise.
  EXPECT_LT(minor_page_faults() - faults, 50);
#endif
}
TEST(Trainer, StepDoesNotAllocateAfterStartup) { expect_steps_do_not_allocate("fp32"); }
// bf16 compute builds its oneDNN primitives (and allocates their scratchpads) in the first step.
TEST(Trainer, Bf16StepDoesNotAllocateAfterStartup) { expect_steps_do_not_allocate("bf16"); }

TEST(Trainer, RunsAreBitwiseIdenticalForTheSameThreads) {
  Trainer a(tiny(), ""), b(tiny(), "");
  for (int i = 0; i < 3; ++i) {
    const StepStats sa = a.step(), sb = b.step();
    EXPECT_EQ(sa.loss, sb.loss);
    EXPECT_EQ(sa.grad_norm, sb.grad_norm);
  }
  const auto ta = a.params().gather_named_tensors(), tb = b.params().gather_named_tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) EXPECT_EQ(ta[i].data, tb[i].data) << ta[i].name;
}

// `bench --profile-ops` trains through the profiling backend: every op forwarded unchanged (the
// same bits as the plain CPU backend's, fp32 and bf16) and counted under its name.
TEST(Trainer, ProfiledStepsAreBitwiseThePlainOnes) {
  for (const char* dtype : {"fp32", "bf16"}) {
    kernels::OpProfile profile;
    const auto profiled = kernels::make_profiling_backend(kernels::cpu_backend(), profile);
    const config::Config c = tiny({{"parallel.param_dtype", dtype}});
    Trainer plain(c, ""), timed(c, "", {}, *profiled);
    for (int i = 0; i < 3; ++i) {
      const StepStats a = plain.step(), b = timed.step();
      EXPECT_EQ(a.loss, b.loss) << dtype;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << dtype;
    }
    const auto ta = plain.params().gather_named_tensors(), tb = timed.params().gather_named_tensors();
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t i = 0; i < ta.size(); ++i) EXPECT_EQ(ta[i].data, tb[i].data) << dtype << " " << ta[i].name;
    const auto ops = profile.totals();
    const int64_t attention_calls = 3 * c.model.n_layers * c.accumulation_steps();
    for (const char* op : {"attention_forward", "attention_backward"}) {
      ASSERT_TRUE(ops.count(op)) << dtype << " " << op;
      EXPECT_EQ(ops.at(op).calls, attention_calls) << dtype << " " << op;
      EXPECT_GT(ops.at(op).seconds, 0.0) << dtype << " " << op;
    }
    EXPECT_TRUE(ops.count("adamw_update") && ops.count(std::string(dtype) == "bf16" ? "linear_bf16" : "linear"))
        << dtype;
  }
}

TEST(Trainer, AccumulationMatchesOneLargeMicroBatch) {
  // Same global batch of 8 as one micro-batch or as 4 x 2: equal up to float summation order.
  Trainer whole(tiny({{"train.micro_batch_size", "8"}}), ""), split(tiny({{"train.micro_batch_size", "2"}}), "");
  for (int i = 0; i < 3; ++i) {
    const StepStats a = whole.step(), b = split.step();
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * a.loss);
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * a.grad_norm);
  }
  const auto ta = whole.params().gather_named_tensors(), tb = split.params().gather_named_tensors();
  for (size_t i = 0; i < ta.size(); ++i) {
    double diff = 0, norm = 0;
    for (size_t j = 0; j < ta[i].data.size(); ++j) {
      diff += std::pow(ta[i].data[j] - tb[i].data[j], 2);
      norm += std::pow(ta[i].data[j], 2);
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << ta[i].name;
  }
}

TEST(Trainer, ActivationCheckpointingIsBitwiseIdenticalAndSavesMemory) {
  // Four blocks, so that every-other-block checkpointing recomputes two blocks through one shared
  // set of buffers.
  const config::Overrides four = {{"model.n_layers", "4"}};
  Trainer off(tiny(four), "");
  for (const char* every : {"1", "2"}) {
    SCOPED_TRACE(every);
    config::Overrides o = four;
    o.emplace_back("parallel.activation_checkpointing", every);
    Trainer on(tiny(o), "");
    EXPECT_LT(on.activation_bytes(), off.activation_bytes());
    Trainer reference(tiny(four), "");
    for (int i = 0; i < 3; ++i) {
      const StepStats a = reference.step(), b = on.step();
      EXPECT_EQ(a.loss, b.loss);
      EXPECT_EQ(a.grad_norm, b.grad_norm);
    }
    EXPECT_EQ(reference.evaluate().loss, on.evaluate().loss);
    const auto ta = reference.params().gather_named_tensors(), tb = on.params().gather_named_tensors();
    for (size_t i = 0; i < ta.size(); ++i) EXPECT_EQ(ta[i].data, tb[i].data) << ta[i].name;
  }
}

TEST(Trainer, Bf16ComputeIsDeterministicWithAndWithoutCheckpointing) {
  // bf16 compute rounds activations afresh in recomputation and backward: the same inputs give
  // the same bits, so a run with recompute is the plain run, bit for bit.
  const config::Overrides bf16 = {{"model.n_layers", "4"}, {"parallel.param_dtype", "bf16"}};
  config::Overrides o = bf16;
  o.emplace_back("parallel.activation_checkpointing", "2");
  Trainer plain(tiny(bf16), ""), recomputed(tiny(o), "");
  for (int i = 0; i < 3; ++i) {
    const StepStats a = plain.step(), b = recomputed.step();
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  EXPECT_EQ(plain.evaluate().loss, recomputed.evaluate().loss);
  const auto ta = plain.params().gather_named_tensors(), tb = recomputed.params().gather_named_tensors();
  for (size_t i = 0; i < ta.size(); ++i) EXPECT_EQ(ta[i].data, tb[i].data) << ta[i].name;
}

TEST(Trainer, ClippingBoundsTheUpdate) {
  // With a tiny clip threshold the first AdamW step is unchanged in direction but the moments
  // see clipped gradients: m = (1 - beta1) * g * clip.
  Trainer t(tiny({{"train.grad_clip", "0.01"}, {"train.weight_decay", "0"}}), "");
  const StepStats s = t.step();
  ASSERT_GT(s.grad_norm, 0.01);
  double m2 = 0;
  for (int u = 0; u < t.layout().num_units(); ++u) {
    for (int64_t i = 0; i < t.params().shard_range(u).size; ++i) m2 += std::pow(t.optimizer().exp_avg(u)[i], 2);
  }
  EXPECT_NEAR(std::sqrt(m2), (1 - 0.9) * 0.01, 1e-6);
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  optim::Schedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // halfway through the decay
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  optim::Schedule no_warmup{1.0, 0.0, 0, 2};
  EXPECT_DOUBLE_EQ(no_warmup.at(1), 0.5);
}

// The decay's shapes, over every step after the warmup and over the last few (WSD), against their
// closed forms: fraction of (peak - floor) left at progress p = (step - start) / (total - start).
TEST(Schedule, DecayShapesAndTheStablePhase) {
  using optim::LrDecay;
  const auto schedule = [](LrDecay decay, int64_t decay_steps) {
    optim::Schedule s{1.0, 0.1, 10, 110};
    s.decay = decay;
    s.decay_steps = decay_steps;
    return s;
  };
  const std::pair<LrDecay, double (*)(double)> shapes[] = {
      {LrDecay::kCosine, [](double p) { return 0.5 * (1 + std::cos(std::numbers::pi * p)); }},
      {LrDecay::kLinear, [](double p) { return 1 - p; }},
      {LrDecay::kSqrt, [](double p) { return 1 - std::sqrt(p); }},
  };
  for (const auto& [decay, left] : shapes) {
    SCOPED_TRACE(static_cast<int>(decay));
    for (const int64_t decay_steps : {int64_t{0}, int64_t{40}, int64_t{1000}}) {
      const optim::Schedule s = schedule(decay, decay_steps);
      const int64_t start = decay_steps == 40 ? 70 : 10;  // 1000 steps of decay: from the warmup's end
      EXPECT_EQ(s.decay_start(), start);
      EXPECT_DOUBLE_EQ(s.at(5), 0.5);  // the warmup, whatever the decay
      for (int64_t step = 10; step <= start; ++step) EXPECT_DOUBLE_EQ(s.at(step), 1.0) << step;
      for (int64_t step = start + 1; step <= 110; ++step) {
        const double p = static_cast<double>(step - start) / static_cast<double>(110 - start);
        EXPECT_NEAR(s.at(step), 0.1 + 0.9 * left(p), 1e-12) << step;
      }
      EXPECT_DOUBLE_EQ(s.at(110), 0.1);
      EXPECT_DOUBLE_EQ(s.at(200), 0.1);  // past the end: the floor
    }
  }
  const optim::Schedule none = schedule(LrDecay::kNone, 0);
  EXPECT_DOUBLE_EQ(none.at(5), 0.5);
  EXPECT_DOUBLE_EQ(none.at(110), 1.0);
}

TEST(Clip, FactorMatchesTorch) {
  EXPECT_DOUBLE_EQ(optim::clip_factor(0.5, 1.0), 1.0);
  EXPECT_NEAR(optim::clip_factor(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  EXPECT_DOUBLE_EQ(optim::clip_factor(1e9, 0.0), 1.0);
}

}  // namespace
}  // namespace tessera::train
