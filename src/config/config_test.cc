// Configuration: presets, overrides, types, ranges, consistency, and the shipped configs.
#include "config/config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tessera::config {
namespace {

std::string temp_toml(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The message of the ConfigError that load() throws, or "" when it does not throw.
std::string load_error(const std::string& path, const Overrides& overrides) {
  try {
    load(path, overrides);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), kExitConfig);
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreValidAndMatchTheDefaultPreset) {
  const Config c = load("", {});
  EXPECT_EQ(c.model.preset, "default");
  EXPECT_EQ(c.model.dim, 256);
  EXPECT_EQ(c.micro_batch(), c.train.batch_size);
  EXPECT_EQ(c.accumulation_steps(), 1);
}

TEST(Config, PresetAppliesBeforeOtherModelKeysWhereverItAppears) {
  const std::string path = temp_toml("preset.toml", "[model]\nn_layers = 3\npreset = \"bench\"\n");
  const Config c = load(path, {{"train.lr", "1e-3"}});
  EXPECT_EQ(c.model.vocab_size, 32000);
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  const Config d = load(path, {{"model.preset", "tiny"}});
  EXPECT_EQ(d.model.dim, 64);
  EXPECT_EQ(d.model.n_layers, 3);
}

TEST(Config, LaterOverridesWin) {
  const Config c = load("", {{"train.max_steps", "5"}, {"train.max_steps", "7"}});
  EXPECT_EQ(c.train.max_steps, 7);
}

TEST(Config, AccumulationDerivesFromGlobalBatch) {
  const Config c = load("", {{"train.batch_size", "12"}, {"train.micro_batch_size", "4"}});
  EXPECT_EQ(c.micro_batch(), 4);
  EXPECT_EQ(c.accumulation_steps(), 3);
  EXPECT_EQ(c.tokens_per_step(), 12 * c.model.seq_len);
}

// Tensor-parallel ranks share their batch: the data-parallel ranks, nproc / tensor, cut it.
TEST(Config, TensorParallelRanksShareTheirBatch) {
  const Config c = load("", {{"parallel.nproc", "4"}, {"parallel.tensor", "2"}, {"train.batch_size", "12"},
                             {"train.micro_batch_size", "2"}});
  EXPECT_EQ(c.data_parallel(), 2);
  EXPECT_EQ(c.micro_batch(), 2);
  EXPECT_EQ(c.accumulation_steps(), 3);
  EXPECT_EQ(load("", {{"parallel.nproc", "4"}, {"parallel.tensor", "4"}, {"train.batch_size", "6"}}).micro_batch(), 6);
  // The default model: 8 heads, 4 key/value heads, 688 hidden units, 4096 tokens.
  EXPECT_NE(load_error("", {{"parallel.nproc", "3"}, {"parallel.tensor", "2"}})
                .find("parallel.tensor = 2: must divide parallel.nproc = 3"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.nproc", "8"}, {"parallel.tensor", "8"}})
                .find("config key model.n_kv_heads = 4: must be divisible by parallel.tensor = 8"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.nproc", "2"}, {"parallel.tensor", "2"}, {"model.ffn_hidden", "689"}})
                .find("model.ffn_hidden = 689: must be divisible by parallel.tensor = 2"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.nproc", "2"}, {"parallel.tensor", "2"}, {"model.vocab_size", "4097"}})
                .find("model.vocab_size = 4097: must be divisible by parallel.tensor = 2"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.nproc", "2"}, {"parallel.tensor", "2"}, {"model.n_heads", "2"},
                            {"model.n_kv_heads", "1"}, {"model.dim", "64"}})
                .find("model.n_kv_heads = 1: must be divisible by parallel.tensor = 2"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.nproc", "6"}, {"parallel.tensor", "2"}, {"train.batch_size", "16"}})
                .find("train.batch_size = 16: must be divisible by (parallel.nproc / parallel.tensor) = 3"),
            std::string::npos);
}

// Pipeline stages share their batch like tensor-parallel ranks; tied embeddings are allowed.
TEST(Config, PipelineStagesShareTheirBatch) {
  const Config c = load("", {{"parallel.nproc", "8"},
                             {"parallel.pipeline", "2"},
                             {"parallel.tensor", "2"},
                             {"train.batch_size", "16"},
                             {"train.micro_batch_size", "2"},
                             {"parallel.pipeline_schedule", "gpipe"}});
  EXPECT_EQ(c.data_parallel(), 2);
  EXPECT_EQ(c.accumulation_steps(), 4);
  EXPECT_EQ(c.parallel.pipeline_schedule, PipelineSchedule::kGPipe);
  EXPECT_NE(load_error("", {{"parallel.nproc", "6"}, {"parallel.pipeline", "4"}})
                .find("parallel.pipeline = 4: x parallel.tensor = 1 must divide parallel.nproc = 6"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.nproc", "8"}, {"parallel.pipeline", "8"}})
                .find("parallel.pipeline = 8: must be <= model.n_layers = 4"),
            std::string::npos);
  EXPECT_TRUE(load("", {{"parallel.nproc", "2"}, {"parallel.pipeline", "2"}, {"model.tied_embeddings", "true"}})
                  .model.tied_embeddings);
  EXPECT_NE(load_error("", {{"parallel.pipeline_schedule", "interleaved"}}).find("must be one of 1f1b, gpipe"),
            std::string::npos);
}

// Blocks per stage by hand: a TOML array or a list on the command line, one count per stage
// adding up to model.n_layers, written back as an array.
TEST(Config, PipelineLayersAreAListOfBlockCounts) {
  const Config c =
      load(temp_toml("layers.toml", "[parallel]\nnproc = 2\npipeline = 2\npipeline_layers = [3, 1]\n"), {});
  EXPECT_EQ(c.parallel.pipeline_layers, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(load_text(to_toml(c), "round trip", {}).parallel.pipeline_layers, c.parallel.pipeline_layers);
  for (const char* text : {"[1, 3]", "1,3"}) {
    EXPECT_EQ(load("", {{"parallel.nproc", "2"}, {"parallel.pipeline", "2"}, {"parallel.pipeline_layers", text}})
                  .parallel.pipeline_layers,
              (std::vector<int64_t>{1, 3}));
  }
  auto error = [](const char* layers) {
    return load_error("", {{"parallel.nproc", "2"}, {"parallel.pipeline", "2"}, {"parallel.pipeline_layers", layers}});
  };
  EXPECT_NE(
      error("[4]").find("parallel.pipeline_layers = [4]: needs one block count per stage: 2 for parallel.pipeline = 2"),
      std::string::npos);
  EXPECT_NE(error("[4, 0]").find("every stage needs a block at least"), std::string::npos);
  EXPECT_NE(error("[2, 1]").find("must add up to model.n_layers = 4"), std::string::npos);
  EXPECT_NE(error("[2, x]").find("expected a list of integers such as [6, 2]"), std::string::npos);
  EXPECT_TRUE(load("", {{"parallel.pipeline_layers", "[]"}}).parallel.pipeline_layers.empty());
}

// Sequence parallelism cuts each micro-batch's tokens among the tensor-parallel ranks.
TEST(Config, SequenceParallelNeedsTokensDivisibleByTheTensorRanks) {
  const Config c =
      load("", {{"parallel.nproc", "2"}, {"parallel.tensor", "2"}, {"parallel.sequence_parallel", "true"}});
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_NE(load_error("", {{"parallel.nproc", "2"},
                            {"parallel.tensor", "2"},
                            {"parallel.sequence_parallel", "true"},
                            {"model.seq_len", "65"},
                            {"train.batch_size", "3"}})
                .find("parallel.sequence_parallel = true: needs train.micro_batch_size x model.seq_len = 3 x 65 "
                      "divisible by parallel.tensor = 2"),
            std::string::npos);
  // Without tensor parallelism it changes nothing, and any size is fine.
  EXPECT_NO_THROW(
      load("", {{"parallel.sequence_parallel", "true"}, {"model.seq_len", "65"}, {"train.batch_size", "3"}}));
}

TEST(Config, UnknownKeysAreNamedWithASuggestion) {
  EXPECT_NE(load_error("", {{"train.lrr", "1"}}).find("unknown config key train.lrr (--set); did you mean train.lr?"),
            std::string::npos);
  const std::string path = temp_toml("unknown.toml", "[optimizer]\nlr = 1.0\n");
  EXPECT_NE(load_error(path, {}).find("optimizer.lr"), std::string::npos);
  const std::string top = temp_toml("top.toml", "lr = 1.0\n");
  EXPECT_NE(load_error(top, {}).find("top-level key lr"), std::string::npos);
}

TEST(Config, WrongTypesAreNamed) {
  EXPECT_NE(load_error("", {{"train.batch_size", "eight"}}).find("train.batch_size"), std::string::npos);
  EXPECT_NE(load_error("", {{"train.batch_size", "8.5"}}).find("expected an integer"), std::string::npos);
  EXPECT_NE(load_error("", {{"model.tied_embeddings", "yes"}}).find("expected true or false"), std::string::npos);
  const std::string path = temp_toml("types.toml", "[train]\nlr = \"fast\"\n");
  EXPECT_NE(load_error(path, {}).find("train.lr = \"fast\""), std::string::npos);
  // An integer is a fine number.
  const std::string ok = temp_toml("int_as_float.toml", "[train]\nlr = 1\n");
  EXPECT_DOUBLE_EQ(load(ok, {}).train.lr, 1.0);
}

TEST(Config, RangesAndConsistencyAreChecked) {
  EXPECT_NE(load_error("", {{"train.lr", "-1"}}).find("train.lr = -1"), std::string::npos);
  EXPECT_NE(load_error("", {{"model.dim", "100"}}).find("must be divisible by model.n_heads = 8"), std::string::npos);
  EXPECT_NE(load_error("", {{"model.n_kv_heads", "3"}}).find("model.n_heads = 8"), std::string::npos);
  EXPECT_NE(load_error("", {{"train.batch_size", "10"}, {"train.micro_batch_size", "4"}}).find("train.batch_size = 10"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"model.preset", "gpt5"}}).find("unknown preset"), std::string::npos);
  EXPECT_NE(load_error("", {{"train.beta2", "1"}}).find("train.beta2"), std::string::npos);
  EXPECT_NE(load_error("", {{"metrics.log_level", "loud"}}).find("metrics.log_level"), std::string::npos);
  EXPECT_NE(load_error("", {{"model.dim", "0"}}).find("model.dim = 0: must be > 0"), std::string::npos);
  EXPECT_NE(load_error("", {{"train.on_nonfinite", "ignore"}})
                .find("train.on_nonfinite = \"ignore\" (--set): must be one of stop, skip"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"train.max_skipped_steps", "0"}}).find("train.max_skipped_steps = 0"), std::string::npos);
  EXPECT_EQ(load_error("", {{"train.on_nonfinite", "skip"}}), "");
  EXPECT_NE(load_error("", {{"train.lr_decay", "exponential"}})
                .find("train.lr_decay = \"exponential\" (--set): must be one of cosine, linear, sqrt, none"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"train.lr_decay", "none"}, {"train.lr_decay_steps", "100"}})
                .find("train.lr_decay_steps = 100: has no effect with train.lr_decay = \"none\""),
            std::string::npos);
  EXPECT_EQ(load_error("", {{"train.lr_decay", "linear"}, {"train.lr_decay_steps", "100"}}), "");
  EXPECT_NE(load_error("", {{"model.rope_scaling", "yarn"}})
                .find("model.rope_scaling = \"yarn\" (--set): must be one of none, llama3"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"model.rope_scaling", "llama3"}, {"model.rope_high_freq_factor", "1"}})
                .find("model.rope_high_freq_factor = 1: must exceed model.rope_low_freq_factor = 1"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"model.rope_scaling_factor", "0.5"}}).find("model.rope_scaling_factor = 0.5"),
            std::string::npos);
  EXPECT_EQ(load_error("", {{"model.rope_scaling", "llama3"}, {"model.rope_scaling_factor", "32"}}), "");
}

// Every numeric key's range, as the schema states it, is enforced at both ends: just outside is
// refused naming the key, the nearest valid value inside a finite end is accepted where the other
// keys allow it, and a floating-point key refuses nan.
TEST(Config, EveryKeyRangeIsEnforced) {
  const auto bounds = numeric_key_bounds();
  ASSERT_GE(bounds.size(), 30u);
  const auto text = [](double v) { return fmt::format("{}", v); };
  for (const auto& [key, b] : bounds) {
    SCOPED_TRACE(key);
    std::vector<double> outside;
    if (std::isfinite(b.lo)) outside.push_back(b.lo_open ? b.lo : b.lo - 1);
    if (std::isfinite(b.hi)) outside.push_back(b.hi_open ? b.hi : b.hi + 1);
    for (const double v : outside) {
      EXPECT_NE(load_error("", {{key, text(v)}}).find("config key " + key + " = "), std::string::npos) << v;
    }
  }
  EXPECT_NE(load_error("", {{"train.lr", "nan"}}).find("train.lr = nan: must be a finite number > 0"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"metrics.peak_flops", "inf"}}).find("must be a finite number (FLOP/s"), std::string::npos);
  EXPECT_NE(load_error("", {{"train.beta1", "1"}}).find("train.beta1 = 1.0: must be a finite number in [0, 1)"),
            std::string::npos);
  EXPECT_NE(load_error("", {{"train.threads", "1025"}}).find("must be in [0, 1024] (0: one per core)"),
            std::string::npos);
  EXPECT_EQ(load_error("", {{"train.threads", "1024"}, {"train.beta1", "0"}, {"model.init_std", "0.999"}}), "");
}

TEST(Config, MalformedTomlNamesFileAndLine) {
  const std::string path = temp_toml("broken.toml", "[train]\nlr = = 3\n");
  const std::string e = load_error(path, {});
  EXPECT_NE(e.find("broken.toml"), std::string::npos);
  EXPECT_NE(e.find("line 2"), std::string::npos);
}

TEST(Config, OverrideSyntax) {
  EXPECT_EQ(parse_override("train.lr=1e-3"), std::make_pair(std::string("train.lr"), std::string("1e-3")));
  EXPECT_EQ(parse_override("a.b=x=y").second, "x=y");
  EXPECT_THROW(parse_override("train.lr"), ConfigError);
}

TEST(Config, ResolvedTomlRoundTrips) {
  const Config c = load("", {{"model.preset", "tiny"}, {"train.lr", "0.00123"}, {"model.tied_embeddings", "true"}});
  const std::string path = temp_toml("roundtrip.toml", to_toml(c));
  EXPECT_EQ(to_toml(load(path, {})), to_toml(c));
}

// Enum-like keys are typed once loaded, and spelled back by name (to_toml reads back the same).
TEST(Config, EnumKeysAreTypedAndRoundTripByName) {
  const Config c = load("", {{"parallel.strategy", "hybrid_shard"},
                             {"parallel.param_dtype", "bf16"},
                             {"parallel.reduce_dtype", "bf16"},
                             {"train.on_nonfinite", "skip"},
                             {"train.lr_decay", "sqrt"},
                             {"checkpoint.on_failure", "stop"},
                             {"metrics.log_level", "warn"}});
  EXPECT_EQ(c.parallel.strategy, Strategy::kHybridShard);
  EXPECT_EQ(c.parallel.param_dtype, Precision::kBf16);
  EXPECT_EQ(c.parallel.reduce_dtype, Precision::kBf16);
  EXPECT_EQ(c.train.on_nonfinite, OnNonFinite::kSkip);
  EXPECT_EQ(c.train.lr_decay, LrDecay::kSqrt);
  EXPECT_EQ(c.checkpoint.on_failure, OnFailure::kStop);
  EXPECT_EQ(c.metrics.log_level, log::Level::kWarn);
  const std::string toml = to_toml(c);
  for (const char* line : {"strategy = \"hybrid_shard\"", "param_dtype = \"bf16\"", "on_nonfinite = \"skip\"",
                           "lr_decay = \"sqrt\"", "on_failure = \"stop\"", "log_level = \"warn\""}) {
    EXPECT_NE(toml.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(to_toml(load_text(toml, "resolved", {})), toml);
  EXPECT_NE(load_error("", {{"parallel.param_dtype", "fp16"}}).find("must be one of fp32, bf16"), std::string::npos);
  EXPECT_NE(load_error("", {{"parallel.strategy", "zero3"}})
                .find("must be one of full_shard, shard_grad_op, hybrid_shard, no_shard"),
            std::string::npos);
}

// Found by fuzz/config_fuzz: to_toml wrote lr = 1e300 as "1e+300.0", which does not parse, so
// the config a checkpoint saved could not be loaded back; strings were not escaped either.
TEST(Config, ResolvedTomlRoundTripsEdgeValues) {
  const std::string text =
      "[train]\nlr = 1e300\nmin_lr = 2.0\n"
      "[model]\nrope_theta = 1.7976931348623157e308\ninit_std = 5e-324\n"
      "[data]\ndataset = \"dir \\\"q\\\" \\\\ back\\nslash \\u0007 \u00e9\"\n";
  const Config c = load_text(text, "edge.toml", {});
  EXPECT_EQ(c.train.lr, 1e300);
  EXPECT_EQ(c.data.dataset, "dir \"q\" \\ back\nslash \a \u00e9");
  const std::string resolved = to_toml(c);
  const Config again = load_text(resolved, "resolved.toml", {});
  EXPECT_EQ(again.train.lr, 1e300);
  EXPECT_EQ(again.train.min_lr, 2.0);
  EXPECT_EQ(again.model.rope_theta, c.model.rope_theta);
  EXPECT_EQ(again.model.init_std, 5e-324);
  EXPECT_EQ(again.data.dataset, c.data.dataset);
  EXPECT_EQ(to_toml(again), resolved);
}

// Found by fuzz/config_fuzz (UBSan): nproc x micro_batch_size overflowed int64 in validate().
// Sizes derived from the model shape are bounded the same way.
TEST(Config, DerivedSizesCannotOverflow) {
  EXPECT_NE(
      load_error(
          "", {{"parallel.nproc", "2"}, {"train.batch_size", "16"}, {"train.micro_batch_size", "9223372036854775807"}})
          .find("train.micro_batch_size = 9223372036854775807: must be <= train.batch_size / parallel.nproc = 8"),
      std::string::npos);
  EXPECT_NE(load_error("", {{"model.dim", "1099511627776"}}).find("too many to count in an int64"), std::string::npos);
  EXPECT_NE(load_error("", {{"model.seq_len", "4611686018427387904"}}).find("model.seq_len"), std::string::npos);
  EXPECT_NE(load_error("", {{"train.batch_size", "4611686018427387904"}}).find("tokens per step"), std::string::npos);
  const Config big = load("", {{"model.preset", "llama2-70b"}});  // the largest preset stays valid
  EXPECT_GT(model::parameter_count(big.model), 0);
}

TEST(Config, ShippedConfigsLoad) {
  const std::filesystem::path dir = std::filesystem::path(TESSERA_SOURCE_DIR) / "configs";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load(entry.path().string(), {}));
    ++n;
  }
  EXPECT_GE(n, 3);
  EXPECT_EQ(to_toml(load((dir / "default.toml").string(), {})), to_toml(load("", {})));
}

}  // namespace
}  // namespace tessera::config
