// Fuzzes the TOML configuration loader (load_text): every input is a validated Config or a
// ConfigError; an accepted Config's derived sizes are computable (UBSan watches the int64
// products) and it survives its own to_toml unchanged, as a checkpoint saves it. Each input is
// tried as TOML text and as a recipe for a few known keys with edge-case values, which byte
// mutations of text rarely reach.
#include <fmt/format.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <fstream>
#include <iterator>
#include <string>

#include "config/config.h"
#include "harness.h"

namespace tessera::fuzz {

void write_seeds(const std::string& dir) {
  std::ofstream(dir + "/resolved.toml") << config::to_toml(config::load_text("", "defaults", {}));
  std::ofstream(dir + "/small.toml") << "[model]\npreset = \"tiny\"\nseq_len = 64\n\n"
                                        "[train]\nbatch_size = 8\nlr = 1e-3\nmax_steps = 20\n\n"
                                        "[data]\nsynthetic = true\n\n"
                                        "[parallel]\nnproc = 2\nstrategy = \"hybrid_shard\"\nshard_group_size = 1\n";
}

namespace {

void check(const std::string& text) {
  config::Config c;
  if (!parses([&] { c = config::load_text(text, "fuzz.toml", {}); })) return;
  FUZZ_CHECK(c.micro_batch() > 0 && c.accumulation_steps() > 0 && c.tokens_per_step() > 0);
  FUZZ_CHECK(model::parameter_count(c.model) > 0 && model::flops_per_token(c.model) > 0);
  const std::string resolved = config::to_toml(c);
  config::Config again;
  try {
    again = config::load_text(resolved, "resolved.toml", {});
  } catch (const Error& e) {
    finding(std::string("the resolved TOML of an accepted config does not load: ") + e.what() + "\n" + resolved);
  }
  FUZZ_CHECK(config::to_toml(again) == resolved);
}

std::string recipe_text(FuzzedDataProvider& p) {
  // clang-format off
  static constexpr const char* kKeys[][2] = {
      {"model", "vocab_size"}, {"model", "dim"},        {"model", "n_layers"},      {"model", "n_heads"},
      {"model", "n_kv_heads"}, {"model", "ffn_hidden"}, {"model", "seq_len"},       {"model", "rope_theta"},
      {"model", "norm_eps"},   {"model", "init_std"},   {"train", "batch_size"},    {"train", "micro_batch_size"},
      {"train", "lr"},         {"train", "min_lr"},     {"train", "weight_decay"},  {"train", "grad_clip"},
      {"train", "max_tokens"}, {"data", "dataset"},     {"data", "cache_dir"},      {"parallel", "nproc"},
      {"parallel", "shard_group_size"}, {"parallel", "timeout_ms"}, {"metrics", "log_interval"}};
  static constexpr const char* kValues[] = {
      "0", "1", "2", "3", "8", "64", "1024", "4096", "2147483647", "2147483648", "4611686018427387904",
      "9223372036854775807", "-9223372036854775808", "0.5", "1e-3", "2.0", "1e20", "1e300", "5e-324", "inf",
      "-0.0", "nan", "\"x\"", "\"a\\\"b\"", "\"c:\\\\d\"", "\"line\\nbreak\"", "'''\nraw\"'''", "\"\\u0007\""};
  // clang-format on
  std::string out;
  for (int i = 0, n = p.ConsumeIntegralInRange(1, 6); i < n; ++i) {
    const auto& key = kKeys[p.ConsumeIntegralInRange<size_t>(0, std::size(kKeys) - 1)];
    out += fmt::format("{}.{} = {}\n", key[0], key[1], p.PickValueInArray(kValues));  // dotted: no section headers
  }
  return out;
}

}  // namespace
}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::check(std::string(reinterpret_cast<const char*>(data), size));
  FuzzedDataProvider provider(data, size);
  fuzz::check(fuzz::recipe_text(provider));
  return 0;
}
