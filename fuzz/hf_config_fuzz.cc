// Fuzzes the Hugging Face config.json reader (checkpoint::hf_config_from_json), and import_hf with
// that config.json beside a small model's weights (written once per process). An accepted config
// has the shape hf.h promises (positive sizes, heads dividing hidden_size, an even head dim,
// rms_norm_eps in (0, 1), a vocabulary of int32 token ids), sizes computable in int64 (UBSan
// watches the products) and survives hf_config_json unchanged, as an export of the imported model writes
// it; an accepted import is exactly the model the weights hold; a value nested 100000 deep
// (each key, once per process) is refused without being echoed. Each input is tried as the file
// and as a recipe: the model's own config.json with a few keys set to edge-case values.
#include <fmt/format.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "checkpoint/hf.h"
#include "core/file_io.h"
#include "harness.h"
#include "hf_fixture.h"
#include "model/layout.h"

namespace tessera::fuzz {
namespace {

checkpoint::HfExportOptions fixture_options() {
  checkpoint::HfExportOptions o;
  o.bos_token_id = 1;
  o.eos_token_id = 2;
  return o;
}

// The fixture model exported into scratch_dir()/model (config.json is replaced by each input),
// and what importing it gives.
struct Fixture {
  std::string dir;
  checkpoint::HfModel imported;
};
const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    out.dir = scratch_dir() + "/model";
    export_hf_fixture(out.dir, fixture_options());
    out.imported = checkpoint::import_hf(out.dir);
    return out;
  }();
  return f;
}

bool same_shape(const model::ModelConfig& a, const model::ModelConfig& b) {
  return a.vocab_size == b.vocab_size && a.dim == b.dim && a.n_layers == b.n_layers && a.n_heads == b.n_heads &&
         a.n_kv_heads == b.n_kv_heads && a.ffn_hidden == b.ffn_hidden && a.tied_embeddings == b.tied_embeddings;
}

bool same_model(const checkpoint::HfModel& a, const checkpoint::HfModel& b) {
  const model::ModelConfig &x = a.config, &y = b.config;
  return same_shape(x, y) && x.preset == y.preset && x.seq_len == y.seq_len && x.rope_theta == y.rope_theta &&
         x.norm_eps == y.norm_eps && x.init_std == y.init_std && a.bos_token_id == b.bos_token_id &&
         a.eos_token_id == b.eos_token_id;
}

void check_config(const std::string& text) {
  checkpoint::HfModel m;
  if (!parses([&] { m = checkpoint::hf_config_from_json(text, "config.json"); })) return;
  const model::ModelConfig& c = m.config;
  FUZZ_CHECK(c.vocab_size > 0 && c.dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0);
  FUZZ_CHECK(c.ffn_hidden > 0 && c.seq_len > 0 && c.vocab_size <= (int64_t{1} << 31) - 1);
  FUZZ_CHECK(c.dim % c.n_heads == 0 && c.n_heads % c.n_kv_heads == 0 && c.head_dim() % 2 == 0);
  FUZZ_CHECK(c.norm_eps > 0 && c.norm_eps < 1 && c.rope_theta > 0 && c.init_std > 0 && c.init_std < 1);
  FUZZ_CHECK(model::parameter_count(c) > 0 && model::flops_per_token(c) > 0);
  checkpoint::HfExportOptions o;
  o.bos_token_id = m.bos_token_id;
  o.eos_token_id = m.eos_token_id;
  const std::string exported = checkpoint::hf_config_json(c, o);
  checkpoint::HfModel again;
  try {
    again = checkpoint::hf_config_from_json(exported, "exported config.json");
  } catch (const Error& e) {
    finding(std::string("the export of an accepted config.json does not import: ") + e.what() + "\n" + exported);
  }
  if (!same_model(again, m)) finding("an accepted config.json reads back otherwise from its export:\n" + exported);
}

void check_import(const std::string& text) {
  const Fixture& f = fixture();
  write_input("model/config.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  checkpoint::HfModel m;
  if (!parses([&] { m = checkpoint::import_hf(f.dir); })) return;
  FUZZ_CHECK(same_shape(m.config, f.imported.config));
  check_same_tensors(m.tensors, f.imported.tensors);
}

// The keys of transformers' LlamaConfig that hf_config_from_json reads.
// clang-format off
constexpr const char* kKeys[] = {
    "model_type", "architectures", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size", "max_position_embeddings",
    "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias", "mlp_bias", "hidden_act",
    "tie_word_embeddings", "initializer_range", "bos_token_id", "eos_token_id", "torch_dtype"};
// clang-format on

// The fixture's config.json with `key` set to `value` (appended: the last of a repeated key wins).
std::string with_key(std::string text, const char* key, const std::string& value) {
  text.erase(text.rfind('}'));
  return text + fmt::format(",\n  \"{}\": {}\n}}\n", key, value);
}

// The fixture's config.json with a few keys set (appended: the last of a repeated key wins).
std::string recipe_config(FuzzedDataProvider& p) {
  // clang-format off
  static constexpr const char* kValues[] = {
      "0", "1", "2", "3", "4", "8", "12", "16", "-1", "-2", "2147483647", "2147483648", "4294967296",
      "1099511627776", "4611686018427387904", "9223372036854775807", "9223372036854775808",
      "18446744073709551615", "1e-6", "0.5", "1.0", "2.0", "1e300", "1e999", "-1e999", "5e-324", "-0.0",
      "true", "false", "null", "\"llama\"", "\"silu\"", "\"gelu\"", "[\"LlamaForCausalLM\"]", "[]", "{}",
      "{\"type\": \"linear\", \"factor\": 2.0}", "\"8\"", "\"\\u0000\""};
  // clang-format on
  std::string text = checkpoint::hf_config_json(hf_fixture_config(), fixture_options());
  for (int i = 0, n = p.ConsumeIntegralInRange(1, 6); i < n; ++i) {
    text = with_key(text, p.PickValueInArray(kKeys), p.PickValueInArray(kValues));
  }
  return text;
}

}  // namespace

void write_seeds(const std::string& dir) {
  const Fixture& f = fixture();
  std::ofstream(dir + "/fixture.json", std::ios::binary) << read_file(f.dir + "/config.json");
  // Meta's Llama-2-7b as transformers 4.31 wrote it (keys in its order, no head_dim).
  std::ofstream(dir + "/llama-2-7b.json", std::ios::binary) << R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": [
    "LlamaForCausalLM"
  ],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}
)";
  // TinyLlama-1.1B: grouped-query attention, rope_theta and attention_bias spelled out.
  std::ofstream(dir + "/tinyllama.json", std::ios::binary) << R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
}
)";
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  // Once per process: each key set to a value nested deeper than any recursive walk of it
  // survives (100000 levels; dump() overflowed the stack near 20000 in one build, 30000 passed in
  // another). Too slow to be one of the recipe's picks.
  static const bool deep_checked = [] {
    const std::string base = checkpoint::hf_config_json(fuzz::hf_fixture_config(), fuzz::fixture_options());
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    for (const char* key : fuzz::kKeys) fuzz::check_config(fuzz::with_key(base, key, deep));
    return true;
  }();
  (void)deep_checked;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::check_config(text);
  fuzz::check_import(text);
  FuzzedDataProvider provider(data, size);
  const std::string recipe = fuzz::recipe_config(provider);
  fuzz::check_config(recipe);
  fuzz::check_import(recipe);
  return 0;
}
