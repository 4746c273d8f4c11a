// Hugging Face Llama interop: names, rotary row permutation, config.json, sharded files.
#include "checkpoint/hf.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "model/layout.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Meta row order to HF (to_hf) or back, per head of D rows: see hf.h.
std::vector<float> permute_rotary_rows(const NamedTensor& t, int64_t n_heads, int64_t D, bool to_hf) {
  const int64_t cols = t.shape[1];
  std::vector<float> out(t.data.size());
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t meta = h * D + 2 * i + j, hf = h * D + j * (D / 2) + i;
        const int64_t from = to_hf ? meta : hf, to = to_hf ? hf : meta;
        std::copy_n(t.data.begin() + from * cols, cols, out.begin() + to * cols);
      }
    }
  }
  return out;
}

// Tessera name -> HF name for every tensor of the layout, in layout order.
std::vector<std::pair<std::string, std::string>> name_map(const model::ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("tok_embeddings.weight", "model.embed_tokens.weight");
  static const std::pair<const char*, const char*> kBlock[] = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},   {"attention.wk.weight", "self_attn.k_proj.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},   {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},   {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},   {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (const auto& [meta, hf] : kBlock) {
      out.emplace_back(fmt::format("layers.{}.{}", l, meta), fmt::format("model.layers.{}.{}", l, hf));
    }
  }
  out.emplace_back("norm.weight", "model.norm.weight");
  if (!c.tied_embeddings) out.emplace_back("output.weight", "lm_head.weight");
  return out;
}

// Shape and layout order of every Tessera tensor.
std::map<std::string, std::vector<int64_t>> tessera_shapes(const model::ModelConfig& c) {
  std::map<std::string, std::vector<int64_t>> shapes;
  const model::ModelLayout layout(c);
  for (const model::UnitLayout& u : layout.units()) {
    for (const model::TensorSpec& t : u.tensors) shapes[t.name] = t.shape;
  }
  return shapes;
}

// Which projection a tensor is, for the rotary permutation: the head count, or 0 for none.
int64_t rotary_heads(const model::ModelConfig& c, const std::string& tessera_name) {
  if (tessera_name.ends_with("attention.wq.weight")) return c.n_heads;
  if (tessera_name.ends_with("attention.wk.weight")) return c.n_kv_heads;
  return 0;
}

std::string show_shape(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

json parse_json_file(const fs::path& path) {
  const FileBytes text = try_read_file(path.string());
  if (!text) throw DataError(fmt::format("{}: cannot read: {}", path.string(), text.reason()));
  try {
    return parse_json_or_throw(text.bytes);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", path.string(), e.what()));
  }
}

// A file name from the index: a plain name inside the directory (no path separators), so a hostile
// index cannot point outside it.
std::string checked_file_name(const json& value, const std::string& index, const std::string& tensor) {
  if (!value.is_string()) throw DataError(fmt::format("{}: weight_map entry {} is not a file name", index, tensor));
  const std::string name = value.get<std::string>();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw DataError(fmt::format("{}: weight_map entry {} names \"{}\", not a file in the directory", index, tensor, name));
  }
  return name;
}

struct LoadedTensor {
  NamedTensor tensor;
  std::string file;  // where it came from, for messages
};

// Every tensor of the directory's weights by HF name, checked against the index when there is one.
std::map<std::string, LoadedTensor> read_weights(const fs::path& dir, std::string* weights_origin) {
  std::map<std::string, LoadedTensor> out;
  const fs::path index_path = dir / kIndexFile, single = dir / kSingleFile;
  if (fs::exists(index_path)) {
    *weights_origin = index_path.string();
    const json index = parse_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw DataError(fmt::format("{}: no weight_map object", index_path.string()));
    }
    std::map<std::string, std::string> weight_map;  // tensor -> file
    std::set<std::string> files;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      weight_map[tensor] = checked_file_name(file, index_path.string(), tensor);
      files.insert(weight_map[tensor]);
    }
    for (const std::string& file : files) {
      if (!fs::exists(dir / file)) {
        throw DataError(fmt::format("{}: names {}, which does not exist", index_path.string(), (dir / file).string()));
      }
    }
    for (const std::string& file : files) {
      const fs::path path = dir / file;
      for (NamedTensor& t : read_safetensors(path.string())) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end() || it->second != file) {
          throw DataError(fmt::format("{}: tensor {} is not listed for this file in {}", path.string(), t.name,
                                      index_path.string()));
        }
        std::string name = t.name;
        out[name] = {std::move(t), path.string()};
      }
    }
    for (const auto& [tensor, file] : weight_map) {
      if (!out.count(tensor)) {
        throw DataError(fmt::format("{}: tensor {} is missing (the index {} places it there)", (dir / file).string(),
                                    tensor, index_path.string()));
      }
    }
    return out;
  }
  if (!fs::exists(single)) {
    throw DataError(fmt::format("{}: neither {} nor {} (only safetensors weights are read){}", dir.string(), kSingleFile,
                                kIndexFile,
                                fs::exists(dir / "pytorch_model.bin") ? "; pytorch_model.bin is not supported" : ""));
  }
  *weights_origin = single.string();
  for (NamedTensor& t : read_safetensors(single.string())) {
    std::string name = t.name;
    out[name] = {std::move(t), single.string()};
  }
  return out;
}

}  // namespace

namespace {

// The rotary scaling as transformers 4 writes it (null when unscaled), and as transformers 5
// writes it with the base.
ordered_json rope_scaling_json(const model::ModelConfig& c) {
  if (c.rope_scaling == model::RopeScaling::kNone) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", c.rope_scaling_factor},
          {"low_freq_factor", c.rope_low_freq_factor},
          {"high_freq_factor", c.rope_high_freq_factor},
          {"original_max_position_embeddings", c.rope_original_seq_len}};
}

ordered_json rope_parameters_json(const model::ModelConfig& c) {
  ordered_json p = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_scaling == model::RopeScaling::kNone) return p;
  const ordered_json scaling = rope_scaling_json(c);
  for (const auto& [key, value] : scaling.items()) p[key] = value;
  return p;
}

}  // namespace

std::string hf_config_json(const model::ModelConfig& c, const HfExportOptions& options) {
  // The keys of transformers' LlamaConfig that fix the computation, spelled out even where they
  // equal its defaults, so that no reader's defaults matter; the rotary base in the spellings of
  // both transformers 4 and 5, so that no reader's conversion of the other matters.
  ordered_json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", c.dim},
      {"intermediate_size", c.ffn_hidden},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim()},
      {"num_hidden_layers", c.n_layers},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},  // transformers 4's spelling,
      {"rope_scaling", rope_scaling_json(c)},
      {"rope_parameters", rope_parameters_json(c)},  // and 5's
      {"attention_bias", false},
      {"mlp_bias", false},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.seq_len},
      {"tie_word_embeddings", c.tied_embeddings},
      {"initializer_range", c.init_std},
      {"torch_dtype", options.dtype == StoredDtype::kBF16 ? "bfloat16" : "float32"},
  };
  if (options.bos_token_id >= 0) j["bos_token_id"] = options.bos_token_id;
  if (options.eos_token_id >= 0) j["eos_token_id"] = options.eos_token_id;
  return dump_json(j, 2) + "\n";
}

namespace {

// Typed reads of config.json's keys; each error names the file and the key (and echoes only
// scalars: dumping an array or object recurses as deep as it nests).
class ConfigKeys {
 public:
  ConfigKeys(const json& j, const std::string& origin, std::string prefix = "")
      : j_(j), origin_(origin), prefix_(std::move(prefix)) {}
  // The keys of the object at `key` (checked to be one), named "key.inner" in errors.
  ConfigKeys nested(const char* key) const {
    if (!j_[key].is_object()) throw fail(key, "must be an object");
    return ConfigKeys(j_[key], origin_, prefix_ + key + ".");
  }
  bool contains(const char* key) const { return j_.contains(key); }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }  // and not null
  const json& operator[](const char* key) const { return j_[key]; }
  DataError fail(const std::string& key, const std::string& why) const {
    const bool echo = j_.contains(key) && j_[key].is_primitive();
    return DataError(
        fmt::format("{}: key {}{}{}: {}", origin_, prefix_, key, echo ? " = " + dump_json(j_[key]) : "", why));
  }
  int64_t integer(const char* key, const int64_t* fallback) const {
    if (!has(key)) {
      if (fallback != nullptr) return *fallback;
      throw fail(key, "missing");
    }
    if (!j_[key].is_number_integer() || j_[key].get<int64_t>() <= 0) throw fail(key, "must be an integer > 0");
    return j_[key].get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_number() || !(j_[key].get<double>() > 0)) throw fail(key, "must be a number > 0");
    return j_[key].get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) throw fail(key, "must be true or false");
    return j_[key].get<bool>();
  }
  // A negative id (conversions write -1 for none) is not said, as the export then leaves it out.
  int64_t token_id(const char* key) const {
    return j_.contains(key) && j_[key].is_number_integer() ? std::max<int64_t>(j_[key].get<int64_t>(), -1) : -1;
  }
  const std::string& origin() const { return origin_; }

 private:
  const json& j_;
  const std::string& origin_;
  std::string prefix_;  // "outer." for a nested object's keys
};

// What Tessera's model does not compute is refused rather than loaded as a model that gives
// other logits.
void refuse_unsupported(const ConfigKeys& k) {
  if (!k.has("model_type") || k["model_type"] != "llama") throw k.fail("model_type", "only \"llama\" is supported");
  if (k.contains("architectures")) {
    const json& a = k["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != "LlamaForCausalLM") {
      throw k.fail("architectures", "only [\"LlamaForCausalLM\"] is supported");
    }
  }
  if (k.flag("attention_bias", false)) throw k.fail("attention_bias", "attention biases are not supported");
  if (k.flag("mlp_bias", false)) throw k.fail("mlp_bias", "MLP biases are not supported");
  if (k.contains("hidden_act") && k["hidden_act"] != "silu")
    throw k.fail("hidden_act", "only silu (SwiGLU) is supported");
}

// Llama 3.1's scaling keys, as both transformers generations spell them inside rope_scaling or
// rope_parameters; factor and original_max_position_embeddings are required, as transformers
// requires them.
void read_llama3_scaling(const ConfigKeys& rope, model::ModelConfig* c) {
  c->rope_scaling = model::RopeScaling::kLlama3;
  if (!rope.has("factor")) throw rope.fail("factor", "missing (rope_type \"llama3\" needs it)");
  c->rope_scaling_factor = rope.number("factor", 0);
  if (c->rope_scaling_factor < 1) throw rope.fail("factor", "must be >= 1");
  c->rope_low_freq_factor = rope.number("low_freq_factor", 1.0);
  c->rope_high_freq_factor = rope.number("high_freq_factor", 4.0);
  if (c->rope_high_freq_factor <= c->rope_low_freq_factor) {
    throw rope.fail("high_freq_factor", "must exceed low_freq_factor");
  }
  c->rope_original_seq_len = rope.integer("original_max_position_embeddings", nullptr);
}

// The rotary scaling of one spelling (rope_scaling, or rope_parameters): its type "default" (or
// absent) or "llama3"; other types (linear, dynamic, YaRN...) and partial rotations are refused.
void read_rope_type(const ConfigKeys& rope, model::ModelConfig* c) {
  for (const char* key : {"rope_type", "type"}) {  // "type": the older spelling
    if (!rope.has(key) || rope[key] == "default") continue;
    if (rope[key] != "llama3") {
      throw rope.fail(key, "this rotary scaling is not supported (\"default\" and Llama 3.1's \"llama3\" are)");
    }
    read_llama3_scaling(rope, c);
  }
  if (rope.number("partial_rotary_factor", 1.0) != 1.0) {
    throw rope.fail("partial_rotary_factor", "partial rotary embeddings are not supported (only 1)");
  }
}

// The rotary base and scaling. transformers 5 writes both into rope_parameters (rope_theta beside
// the rope type and its keys); transformers 4 wrote rope_theta, beside rope_scaling. Where a file
// holds both spellings they must agree (transformers 5 would take rope_parameters').
void read_rope(const ConfigKeys& k, model::ModelConfig* c) {
  c->rope_theta = k.number("rope_theta", 10000.0);  // transformers' default for Llama
  if (k.has("rope_scaling")) read_rope_type(k.nested("rope_scaling"), c);
  if (!k.has("rope_parameters")) return;
  const ConfigKeys rope = k.nested("rope_parameters");
  model::ModelConfig v5 = *c;
  v5.rope_scaling = model::RopeScaling::kNone;
  read_rope_type(rope, &v5);
  v5.rope_theta = rope.number("rope_theta", c->rope_theta);
  if (k.has("rope_theta") && v5.rope_theta != c->rope_theta) {
    throw rope.fail("rope_theta", fmt::format("differs from the key rope_theta = {}", dump_json(k["rope_theta"])));
  }
  if (k.has("rope_scaling") &&
      (v5.rope_scaling != c->rope_scaling || v5.rope_scaling_factor != c->rope_scaling_factor ||
       v5.rope_low_freq_factor != c->rope_low_freq_factor || v5.rope_high_freq_factor != c->rope_high_freq_factor ||
       v5.rope_original_seq_len != c->rope_original_seq_len)) {
    throw rope.fail("rope_type", "and its keys differ from the key rope_scaling's");
  }
  *c = v5;
}

// The shape, with transformers' LlamaConfig defaults where a key is absent, checked as
// config::validate checks [model].
model::ModelConfig read_shape(const ConfigKeys& k) {
  model::ModelConfig c;
  c.dim = k.integer("hidden_size", nullptr);
  c.ffn_hidden = k.integer("intermediate_size", nullptr);
  c.n_heads = k.integer("num_attention_heads", nullptr);
  c.n_kv_heads = k.integer("num_key_value_heads", &c.n_heads);  // MHA when absent
  c.n_layers = k.integer("num_hidden_layers", nullptr);
  c.vocab_size = k.integer("vocab_size", nullptr);
  const int64_t default_positions = 2048;
  c.seq_len = k.integer("max_position_embeddings", &default_positions);
  c.norm_eps = k.number("rms_norm_eps", 1e-6);
  read_rope(k, &c);
  c.tied_embeddings = k.flag("tie_word_embeddings", false);
  if (k.has("initializer_range") && k["initializer_range"].is_number()) {
    const double std = k["initializer_range"].get<double>();
    if (std > 0 && std < 1) c.init_std = std;
  }
  if (c.dim % c.n_heads != 0) {
    throw k.fail("hidden_size", fmt::format("must be divisible by num_attention_heads = {}", c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    throw k.fail("num_attention_heads", fmt::format("must be divisible by num_key_value_heads = {}", c.n_kv_heads));
  }
  if (c.head_dim() % 2 != 0) throw k.fail("hidden_size", "head dim hidden_size/num_attention_heads must be even");
  const int64_t head_dim = c.head_dim();
  if (k.integer("head_dim", &head_dim) != head_dim) {
    throw k.fail("head_dim", fmt::format("must equal hidden_size / num_attention_heads = {}", head_dim));
  }
  if (c.norm_eps >= 1) throw k.fail("rms_norm_eps", "must be < 1");
  if (c.vocab_size > (int64_t{1} << 31) - 1) throw k.fail("vocab_size", "must fit in int32 token ids");
  const model::ShapeTotals totals = model::shape_totals(c);
  if (totals.parameters >= model::kMaxShapeCount) {
    throw DataError(
        fmt::format("{}: {:.3g} parameters (hidden_size, intermediate_size, num_hidden_layers, "
                    "vocab_size): their count must fit in an int64",
                    k.origin(), totals.parameters));
  }
  if (totals.layer_cells >= model::kMaxShapeCount) {
    throw k.fail("max_position_embeddings",
                 "num_hidden_layers x max_position_embeddings x hidden_size must fit in an int64");
  }
  return c;
}

// Tessera's preset whose shape this is, so that logs name it; "default" (every key is stored
// explicitly beside it) otherwise.
std::string matching_preset(const model::ModelConfig& c) {
  for (const std::string& name : model::model_preset_names()) {
    model::ModelConfig p;
    model::model_preset(name, &p);
    if (p.vocab_size == c.vocab_size && p.dim == c.dim && p.n_layers == c.n_layers && p.n_heads == c.n_heads &&
        p.n_kv_heads == c.n_kv_heads && p.ffn_hidden == c.ffn_hidden && p.seq_len == c.seq_len) {
      return name;
    }
  }
  return "default";
}

}  // namespace

HfModel hf_config_from_json(const std::string& json_text, const std::string& origin) {
  json j;
  try {
    j = parse_json_or_throw(json_text);
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
  if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object", origin));
  const ConfigKeys keys(j, origin);
  refuse_unsupported(keys);
  HfModel out;
  out.config = read_shape(keys);
  out.config.preset = matching_preset(out.config);
  out.bos_token_id = keys.token_id("bos_token_id");
  out.eos_token_id = keys.token_id("eos_token_id");
  return out;
}

std::vector<NamedTensor> to_hf_tensors(const model::ModelConfig& c, const std::vector<NamedTensor>& tensors,
                                       const std::string& origin) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t;
  const auto shapes = tessera_shapes(c);
  std::vector<NamedTensor> out;
  for (const auto& [meta, hf] : name_map(c)) {
    auto it = by_name.find(meta);
    if (it == by_name.end()) throw DataError(fmt::format("{}: tensor {} is missing", origin, meta));
    const NamedTensor& t = *it->second;
    const auto& shape = shapes.at(meta);
    const int64_t numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    if (t.shape != shape || static_cast<int64_t>(t.data.size()) != numel) {
      throw DataError(fmt::format("{}: tensor {} has shape {}, the model expects {}", origin, meta,
                                  show_shape(t.shape), show_shape(shape)));
    }
    const int64_t heads = rotary_heads(c, meta);
    out.push_back({hf, t.shape, heads > 0 ? permute_rotary_rows(t, heads, c.head_dim(), true) : t.data});
  }
  return out;
}

void export_hf(const model::ModelConfig& c, const std::vector<NamedTensor>& tensors, const std::string& origin,
               const std::string& dir, const HfExportOptions& options) {
  std::vector<NamedTensor> hf = to_hf_tensors(c, tensors, origin);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
  // An earlier export's files would mix with this one's (a stale index or shard): refuse.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == kConfigFile || (name.starts_with("model") && name.find(".safetensors") != std::string::npos)) {
      throw ConfigError(fmt::format("{} already exists; export into a new or empty directory", entry.path().string()));
    }
  }
  // Greedy in HF's order, as transformers shards: a new file when the next tensor would not fit.
  std::vector<std::vector<NamedTensor>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (NamedTensor& t : hf) {
    const uint64_t bytes = t.data.size() * stored_bytes(options.dtype);
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += bytes;
    total_bytes += bytes;
    shards.back().push_back(std::move(t));
  }
  // transformers refuses safetensors files whose metadata lacks format "pt".
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const fs::path d(dir);
  if (shards.size() == 1) {
    write_safetensors((d / kSingleFile).string(), shards[0], metadata, options.dtype);
  } else {
    ordered_json weight_map = ordered_json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      write_safetensors((d / file).string(), shards[i], metadata, options.dtype);
      for (const NamedTensor& t : shards[i]) weight_map[t.name] = file;
    }
    const ordered_json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomic((d / kIndexFile).string(), dump_json(index, 2) + "\n");
  }
  // config.json last: a directory with it is a complete export.
  write_file_atomic((d / kConfigFile).string(), hf_config_json(c, options));
}

HfModel import_hf(const std::string& dir) {
  const fs::path d(dir);
  const fs::path config_path = d / kConfigFile;
  const FileBytes config_text = try_read_file(config_path.string());
  if (!config_text) {
    throw DataError(fmt::format("{}: cannot read: {} (not a Hugging Face model directory)", config_path.string(),
                                config_text.reason()));
  }
  HfModel out = hf_config_from_json(config_text.bytes, config_path.string());
  const model::ModelConfig& c = out.config;

  std::string weights_origin;
  std::map<std::string, LoadedTensor> weights = read_weights(d, &weights_origin);
  // The layout and the names below grow with num_hidden_layers: the weights must hold that many
  // blocks of 9 tensors before they are built.
  constexpr int64_t kTensorsPerBlock = 9;
  if (c.n_layers > static_cast<int64_t>(weights.size()) / kTensorsPerBlock) {
    throw DataError(fmt::format("{}: key num_hidden_layers = {}: {} holds {} tensors, not {} per layer",
                                config_path.string(), c.n_layers, weights_origin, weights.size(), kTensorsPerBlock));
  }
  const auto shapes = tessera_shapes(c);
  std::set<std::string> used;
  std::map<std::string, NamedTensor> converted;  // by Tessera name
  for (const auto& [meta, hf] : name_map(c)) {
    auto it = weights.find(hf);
    if (it == weights.end()) throw DataError(fmt::format("{}: tensor {} is missing", weights_origin, hf));
    NamedTensor& t = it->second.tensor;
    const auto& shape = shapes.at(meta);
    if (t.shape != shape) {
      throw DataError(fmt::format("{}: tensor {} has shape {}, but {} implies {}", it->second.file, hf,
                                  show_shape(t.shape), config_path.string(), show_shape(shape)));
    }
    const int64_t heads = rotary_heads(c, meta);
    if (heads > 0) t.data = permute_rotary_rows(t, heads, c.head_dim(), false);
    converted[meta] = {meta, t.shape, std::move(t.data)};
    used.insert(hf);
  }
  for (const auto& [name, loaded] : weights) {
    if (used.count(name)) continue;
    // Older conversions saved the rotary frequencies as a buffer; Tessera computes them.
    if (name.ends_with(".rotary_emb.inv_freq")) continue;
    // Some tied checkpoints still store the head: accept it when it is the embedding's copy.
    if (name == "lm_head.weight" && c.tied_embeddings) {
      const NamedTensor& emb = converted.at("tok_embeddings.weight");
      if (loaded.tensor.shape == emb.shape && loaded.tensor.data == emb.data) continue;
      throw DataError(fmt::format("{}: tensor lm_head.weight differs from model.embed_tokens.weight, but {} says "
                                  "tie_word_embeddings = true",
                                  loaded.file, config_path.string()));
    }
    throw DataError(fmt::format("{}: tensor {} has no place in a Llama model as {} describes it", loaded.file, name,
                                config_path.string()));
  }
  const model::ModelLayout layout(c);
  for (const model::UnitLayout& u : layout.units()) {
    for (const model::TensorSpec& spec : u.tensors) out.tensors.push_back(std::move(converted.at(spec.name)));
  }
  return out;
}

}  // namespace tessera::checkpoint
