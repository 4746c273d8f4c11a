// Hugging Face interop: exact round trips, the rotary permutation against both rotations,
// 16-bit weights, and broken directories rejected with the file and tensor or key named.
#include "checkpoint/hf.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <tuple>

#include "checkpoint/safetensors_test_util.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/rng.h"
#include "kernels/ref/rope.h"
#include "model/layout.h"

namespace tessera::checkpoint {
namespace {

using test_util::write_16bit;

namespace fs = std::filesystem;

model::ModelConfig small_config(int64_t n_kv_heads, bool tied) {
  model::ModelConfig c;
  c.vocab_size = 37;
  c.dim = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = n_kv_heads;
  c.ffn_hidden = 24;
  c.seq_len = 8;
  c.rope_theta = 500000.0;
  c.norm_eps = 1e-6;
  c.tied_embeddings = tied;
  return c;
}

// Every tensor of the layout, random (never zeros), including values fp32 only can hold.
std::vector<NamedTensor> random_tensors(const model::ModelConfig& c, uint64_t seed) {
  std::vector<NamedTensor> out;
  uint64_t stream = 0;
  const model::ModelLayout layout(c);
  for (const model::UnitLayout& u : layout.units()) {
    for (const model::TensorSpec& s : u.tensors) {
      NamedTensor t{s.name, s.shape, std::vector<float>(s.numel())};
      for (int64_t i = 0; i < s.numel(); ++i) t.data[i] = static_cast<float>(rng::normal(seed, stream, i)) * 0.37f;
      ++stream;
      out.push_back(std::move(t));
    }
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / fmt::format("hf_{}_{}", name, ::getpid());
  fs::remove_all(d);
  return d;
}

std::string import_error(const fs::path& dir) {
  try {
    import_hf(dir.string());
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

void expect_bitwise_equal(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    ASSERT_EQ(a[i].data.size(), b[i].data.size()) << a[i].name;
    EXPECT_EQ(std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size() * sizeof(float)), 0) << a[i].name;
  }
}

struct Variant {
  const char* name;
  int64_t n_kv_heads;
  bool tied;
  uint64_t max_shard_bytes;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class HfRoundTrip : public ::testing::TestWithParam<Variant> {};

TEST_P(HfRoundTrip, ExportThenImportIsExact) {
  const Variant& v = GetParam();
  const model::ModelConfig c = small_config(v.n_kv_heads, v.tied);
  const auto tensors = random_tensors(c, 11);
  const fs::path dir = fresh_dir(v.name);
  HfExportOptions options;
  options.max_shard_bytes = v.max_shard_bytes;
  options.bos_token_id = 1;
  options.eos_token_id = 2;
  export_hf(c, tensors, "test", dir.string(), options);

  const bool sharded = v.max_shard_bytes < 1000000;
  EXPECT_EQ(fs::exists(dir / "model.safetensors.index.json"), sharded);
  EXPECT_EQ(fs::exists(dir / "model.safetensors"), !sharded);
  if (sharded) {
    const auto index = parse_json_or_throw(read_file(dir / "model.safetensors.index.json"));
    uint64_t total = 0;
    for (const auto& t : tensors) total += t.data.size() * sizeof(float);
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
    EXPECT_GT(files.size(), 2u);
  }
  // The head is absent when tied, as transformers expects.
  const auto hf = to_hf_tensors(c, tensors, "test");
  EXPECT_EQ(std::count_if(hf.begin(), hf.end(), [](const NamedTensor& t) { return t.name == "lm_head.weight"; }),
            v.tied ? 0 : 1);

  const HfModel back = import_hf(dir.string());
  expect_bitwise_equal(back.tensors, tensors);
  EXPECT_EQ(back.config.dim, c.dim);
  EXPECT_EQ(back.config.n_layers, c.n_layers);
  EXPECT_EQ(back.config.n_heads, c.n_heads);
  EXPECT_EQ(back.config.n_kv_heads, c.n_kv_heads);
  EXPECT_EQ(back.config.ffn_hidden, c.ffn_hidden);
  EXPECT_EQ(back.config.vocab_size, c.vocab_size);
  EXPECT_EQ(back.config.seq_len, c.seq_len);
  EXPECT_EQ(back.config.rope_theta, c.rope_theta);
  EXPECT_EQ(back.config.norm_eps, c.norm_eps);
  EXPECT_EQ(back.config.tied_embeddings, c.tied_embeddings);
  EXPECT_EQ(back.bos_token_id, 1);
  EXPECT_EQ(back.eos_token_id, 2);
  fs::remove_all(dir);
}

// A bf16 export holds each weight rounded to nearest even (after the rotary permutation, which
// moves values without changing them), in half the bytes, and says so in config.json.
TEST(HfExport, Bfloat16ExportImportsAsTheRoundedWeights) {
  const model::ModelConfig c = small_config(2, false);
  const auto tensors = random_tensors(c, 13);
  const fs::path fp32 = fresh_dir("fp32"), bf16 = fresh_dir("bf16");
  export_hf(c, tensors, "test", fp32.string());
  HfExportOptions options;
  options.dtype = StoredDtype::kBF16;
  export_hf(c, tensors, "test", bf16.string(), options);

  auto rounded = tensors;
  for (NamedTensor& t : rounded) {
    for (float& x : t.data) x = bf16_to_f32(f32_to_bf16(x));
  }
  expect_bitwise_equal(import_hf(bf16.string()).tensors, rounded);
  EXPECT_EQ(parse_json_or_throw(read_file(bf16 / "config.json"))["torch_dtype"], "bfloat16");
  EXPECT_EQ(parse_json_or_throw(read_file(fp32 / "config.json"))["torch_dtype"], "float32");
  const auto weights = [](const fs::path& d) { return fs::file_size(d / "model.safetensors"); };
  EXPECT_LT(weights(bf16), weights(fp32) / 2 + 4096);  // the headers are alike
  fs::remove_all(fp32);
  fs::remove_all(bf16);
}

INSTANTIATE_TEST_SUITE_P(Variants, HfRoundTrip,
                         ::testing::Values(Variant{"gqa_untied_single", 2, false, 5'000'000'000},
                                           Variant{"mha_untied_single", 4, false, 5'000'000'000},
                                           Variant{"gqa_tied_single", 2, true, 5'000'000'000},
                                           Variant{"mha_tied_sharded", 4, true, 4096},
                                           Variant{"gqa_untied_sharded", 2, false, 4096}),
                         [](const auto& p) { return std::string(p.param.name); });

// The exported q and k rows, rotated the way transformers rotates (channel i with i + D/2), give
// Tessera's rotated q and k (pairs 2i, 2i+1) in HF's row order: what makes the logits agree.
TEST(HfExport, RotaryPermutationTurnsInterleavedIntoRotateHalf) {
  const model::ModelConfig c = small_config(2, false);
  const auto tensors = random_tensors(c, 5);
  const auto hf = to_hf_tensors(c, tensors, "test");
  auto find = [](const std::vector<NamedTensor>& ts, const std::string& name) {
    for (const auto& t : ts) {
      if (t.name == name) return t;
    }
    ADD_FAILURE() << name;
    return NamedTensor{};
  };
  const int64_t C = c.dim, D = c.head_dim(), T = 7;
  std::vector<float> x(T * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rng::normal(3, 0, i));
  for (const auto& [meta_name, hf_name, heads] :
       {std::tuple{"layers.1.attention.wq.weight", "model.layers.1.self_attn.q_proj.weight", c.n_heads},
        std::tuple{"layers.1.attention.wk.weight", "model.layers.1.self_attn.k_proj.weight", c.n_kv_heads}}) {
    const NamedTensor meta = find(tensors, meta_name), conv = find(hf, hf_name);
    const int64_t rows = heads * D;
    std::vector<float> q_meta(T * rows), q_hf(T * rows);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double a = 0, b = 0;
        for (int64_t k = 0; k < C; ++k) {
          a += static_cast<double>(meta.data[r * C + k]) * x[t * C + k];
          b += static_cast<double>(conv.data[r * C + k]) * x[t * C + k];
        }
        q_meta[t * rows + r] = static_cast<float>(a);
        q_hf[t * rows + r] = static_cast<float>(b);
      }
    }
    kernels::ref::rope_forward(q_meta.data(), 1, T, heads, D, rows, static_cast<float>(c.rope_theta));
    // transformers' apply_rotary_pos_emb: q * cos + rotate_half(q) * sin.
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        float* q = q_hf.data() + t * rows + h * D;
        std::vector<double> rotated(D);
        for (int64_t i = 0; i < D; ++i) {
          const int64_t f = i % (D / 2);
          const double angle = static_cast<double>(t) * std::pow(c.rope_theta, -2.0 * f / D);
          const double half = i < D / 2 ? -q[i + D / 2] : q[i - D / 2];
          rotated[i] = q[i] * std::cos(angle) + half * std::sin(angle);
        }
        for (int64_t i = 0; i < D; ++i) q[i] = static_cast<float>(rotated[i]);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < D / 2; ++i) {
          for (int64_t j = 0; j < 2; ++j) {
            EXPECT_NEAR(q_hf[t * rows + h * D + j * D / 2 + i], q_meta[t * rows + h * D + 2 * i + j], 1e-5)
                << hf_name << " t=" << t << " h=" << h << " i=" << i << " j=" << j;
          }
        }
      }
    }
  }
  // v, o and the MLP are not permuted.
  EXPECT_EQ(find(hf, "model.layers.0.self_attn.v_proj.weight").data, find(tensors, "layers.0.attention.wv.weight").data);
  EXPECT_EQ(find(hf, "model.layers.0.mlp.gate_proj.weight").data, find(tensors, "layers.0.feed_forward.w1.weight").data);
  EXPECT_EQ(find(hf, "model.layers.0.mlp.up_proj.weight").data, find(tensors, "layers.0.feed_forward.w3.weight").data);
}

// A bf16 download (as Llama 2's are) imports to the bf16 values, widened.
TEST(HfImport, Bfloat16DirectoryImports) {
  const model::ModelConfig c = small_config(2, false);
  const auto tensors = random_tensors(c, 21);
  const fs::path dir = fresh_dir("bf16dir");
  export_hf(c, tensors, "test", dir.string());
  std::vector<std::pair<NamedTensor, std::vector<uint16_t>>> as_bf16;
  for (const NamedTensor& t : to_hf_tensors(c, tensors, "test")) {
    std::vector<uint16_t> bits(t.data.size());
    f32_to_bf16(t.data.data(), bits.data(), static_cast<int64_t>(bits.size()));
    as_bf16.push_back({t, bits});
  }
  write_16bit((dir / "model.safetensors").string(), "BF16", as_bf16, {{"format", "pt"}});
  const HfModel back = import_hf(dir.string());
  std::vector<NamedTensor> want = tensors;
  for (NamedTensor& t : want) {
    for (float& x : t.data) x = bf16_to_f32(f32_to_bf16(x));  // rounding commutes with the row permutation
  }
  expect_bitwise_equal(back.tensors, want);
  fs::remove_all(dir);
}

TEST(HfImport, BrokenDirectoriesNameTheFileAndTensorOrKey) {
  const model::ModelConfig c = small_config(2, false);
  const auto tensors = random_tensors(c, 7);
  const fs::path dir = fresh_dir("broken");
  auto fresh_export = [&](uint64_t max_shard_bytes) {
    fs::remove_all(dir);
    HfExportOptions o;
    o.max_shard_bytes = max_shard_bytes;
    export_hf(c, tensors, "test", dir.string(), o);
  };
  auto contains = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << message << "\" lacks \"" << part << "\"";
  };
  const std::string weights = (dir / "model.safetensors").string(), config = (dir / "config.json").string();
  auto rewrite_weights = [&](const std::function<void(std::vector<NamedTensor>&)>& edit) {
    auto ts = read_safetensors(weights);
    edit(ts);
    write_safetensors(weights, ts, {{"format", "pt"}});
  };
  auto edit_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = parse_json_or_throw(read_file(config));
    edit(j);
    std::ofstream(config) << dump_json(j);
  };

  fresh_export(5'000'000'000);
  rewrite_weights([](auto& ts) { std::erase_if(ts, [](auto& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; }); });
  contains(import_error(dir), weights + ": tensor model.layers.1.mlp.up_proj.weight is missing");

  fresh_export(5'000'000'000);
  rewrite_weights([](auto& ts) {
    for (auto& t : ts) {
      if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {16, 8}, t.data.resize(128);
    }
  });
  contains(import_error(dir), weights + ": tensor model.layers.0.self_attn.k_proj.weight has shape [16, 8]");

  fresh_export(5'000'000'000);
  rewrite_weights([](auto& ts) { ts.push_back({"model.layers.0.self_attn.q_proj.bias", {16}, std::vector<float>(16)}); });
  contains(import_error(dir), weights + ": tensor model.layers.0.self_attn.q_proj.bias has no place");

  // Old conversions' rotary buffers are ignored.
  fresh_export(5'000'000'000);
  rewrite_weights([](auto& ts) { ts.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {2}, {1, 0.5f}}); });
  EXPECT_NO_THROW(import_hf(dir.string()));

  fresh_export(5'000'000'000);
  {
    // An integer tensor: the reader names the file and tensor.
    nlohmann::ordered_json header = {{"model.norm.weight", {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}}}};
    const std::string json = dump_json(header);
    const uint64_t n = json.size();
    std::ofstream out(weights, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << json << std::string(16, '\0');
  }
  contains(import_error(dir), weights + ": tensor model.norm.weight: dtype \"I64\" is not supported");

  for (const auto& [key, value, message] :
       {std::tuple{"rope_scaling", nlohmann::json{{"type", "linear"}, {"factor", 2.0}}, "key rope_scaling"},
        std::tuple{"attention_bias", nlohmann::json(true), "key attention_bias = true"},
        std::tuple{"hidden_act", nlohmann::json("gelu"), "key hidden_act = \"gelu\""},
        std::tuple{"head_dim", nlohmann::json(8), "key head_dim = 8: must equal hidden_size / num_attention_heads = 4"},
        std::tuple{"num_key_value_heads", nlohmann::json(3), "key num_attention_heads = 4: must be divisible by"},
        std::tuple{"model_type", nlohmann::json("mistral"), "key model_type = \"mistral\""}}) {
    fresh_export(5'000'000'000);
    edit_config([&](nlohmann::json& j) { j[key] = value; });
    contains(import_error(dir), config + ": " + message);
  }
  fresh_export(5'000'000'000);
  edit_config([](nlohmann::json& j) { j.erase("hidden_size"); });
  contains(import_error(dir), config + ": key hidden_size: missing");

  fs::remove(config);
  contains(import_error(dir), config + ": cannot read: No such file or directory (not a Hugging Face model directory)");

  // Sharded: a tensor the index places in a file that lacks it; a missing shard; a path outside.
  fresh_export(4096);
  const fs::path index = dir / "model.safetensors.index.json";
  nlohmann::json idx = parse_json_or_throw(read_file(index));
  const std::string shard2 = idx["weight_map"]["model.layers.0.mlp.down_proj.weight"];
  {
    nlohmann::json edited = idx;
    edited["weight_map"]["model.layers.1.mlp.down_proj.weight"] = shard2;
    std::ofstream(index) << dump_json(edited);
  }
  const std::string msg = import_error(dir);
  EXPECT_TRUE(msg.find("model.layers.1.mlp.down_proj.weight is not listed for this file") != std::string::npos ||
              msg.find((dir / shard2).string() + ": tensor model.layers.1.mlp.down_proj.weight is missing") !=
                  std::string::npos)
      << msg;
  {
    nlohmann::json edited = idx;
    edited["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
    std::ofstream(index) << dump_json(edited);
  }
  contains(import_error(dir), index.string() + ": names " + (dir / "model-00009-of-00009.safetensors").string());
  {
    nlohmann::json edited = idx;
    edited["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
    std::ofstream(index) << dump_json(edited);
  }
  contains(import_error(dir), index.string() + ": weight_map entry model.norm.weight names \"../elsewhere.safetensors\"");
  {
    nlohmann::json edited = idx;
    edited["weight_map"].erase("model.norm.weight");
    std::ofstream(index) << dump_json(edited);
  }
  contains(import_error(dir), "tensor model.norm.weight is not listed for this file in " + index.string());

  // Export: a tensor missing from the input, and an earlier export in the way.
  auto missing = tensors;
  std::erase_if(missing, [](auto& t) { return t.name == "layers.1.ffn_norm.weight"; });
  try {
    export_hf(c, missing, "run/model.safetensors", fresh_dir("missing").string());
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    contains(e.what(), "run/model.safetensors: tensor layers.1.ffn_norm.weight is missing");
  }
  EXPECT_THROW(export_hf(c, tensors, "test", dir.string()), ConfigError);
  fs::remove_all(dir);
}

// What fuzz/hf_config_fuzz.cc found in config.json. small_config's config.json with `key` set to
// `value`: appended, so it replaces the value before it (nlohmann keeps the last of a repeated key).
std::string with_key(const std::string& key, const std::string& value) {
  std::string text = hf_config_json(small_config(2, false));
  text.erase(text.rfind('}'));
  return text + ",\n  \"" + key + "\": " + value + "\n}\n";
}

std::string config_error(const std::string& text) {
  try {
    hf_config_from_json(text, "config.json");
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

// parameter_count() and the layout multiply these sizes in int64: 24 x (2^63 - 1) overflowed
// (UBSan), and import built a layout of 2^60 blocks.
TEST(HfConfigFromJson, SizesBeyondInt64Refused) {
  for (const auto& [key, value] :
       {std::pair{"intermediate_size", "9223372036854775807"}, std::pair{"num_hidden_layers", "1152921504606846976"},
        std::pair{"max_position_embeddings", "4611686018427387904"}}) {
    const std::string e = config_error(with_key(key, value));
    EXPECT_NE(e.find("config.json: "), std::string::npos) << e;
    EXPECT_NE(e.find("must fit in an int64"), std::string::npos) << key << ": " << e;
  }
}

// A refused value was echoed with dump(), which recurses as deep as the value nests: 100000
// brackets overflowed the stack.
TEST(HfConfigFromJson, NestedValuesAreNotEchoed) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const char* key :
       {"model_type", "architectures", "hidden_act", "hidden_size", "rope_scaling", "rope_parameters"}) {
    const std::string e = config_error(with_key(key, deep));
    EXPECT_NE(e.find(std::string("config.json: key ") + key), std::string::npos) << e.substr(0, 200);
    EXPECT_LT(e.size(), 200u) << e.substr(0, 200);
  }
}

// A negative token id (conversions write -1 for "none") came back as itself, though the export
// leaves it out and so imports it as -1: ids read as -1 ("not said") unless they are >= 0.
TEST(HfConfigFromJson, NegativeTokenIdsMeanNone) {
  const HfModel m = hf_config_from_json(with_key("bos_token_id", "-2"), "config.json");
  EXPECT_EQ(m.bos_token_id, -1);
  EXPECT_EQ(hf_config_from_json(hf_config_json(m.config), "config.json").bos_token_id, m.bos_token_id);
  EXPECT_EQ(hf_config_from_json(with_key("eos_token_id", "0"), "config.json").eos_token_id, 0);
}

// transformers 5 writes the rotary base into rope_parameters, and no rope_theta. It was read as
// 10000 (transformers' default): a Llama 3 fine-tune saved by transformers 5 imported with every
// rotation wrong, and its rope_type (Llama 3.1's "llama3") was not refused.
TEST(HfConfigFromJson, RotaryBaseAsTransformers5WritesIt) {
  auto v5 = [](const std::string& rope_parameters) {  // small_config's config.json as 5 saves it
    nlohmann::json j = parse_json_or_throw(hf_config_json(small_config(2, false)));
    j.erase("rope_theta");
    j.erase("rope_scaling");
    j["rope_parameters"] = parse_json_or_throw(rope_parameters);
    return dump_json(j);
  };
  auto theta = [](const std::string& text) { return hf_config_from_json(text, "config.json").config.rope_theta; };
  EXPECT_EQ(theta(v5(R"({"rope_type": "default", "rope_theta": 250000.0})")), 250000.0);
  EXPECT_EQ(theta(v5(R"({"type": "default", "rope_theta": 250000})")), 250000.0);  // the older spelling
  EXPECT_EQ(theta(v5(R"({"rope_type": "default"})")), 10000.0);  // no base anywhere: transformers' default
  EXPECT_EQ(theta(with_key("rope_parameters", R"({"rope_type": "default"})")), 500000.0);  // rope_theta's

  // Export writes both spellings, which agree.
  const nlohmann::json exported = parse_json_or_throw(hf_config_json(small_config(2, false)));
  EXPECT_EQ(exported["rope_theta"], 500000.0);
  EXPECT_EQ(exported["rope_parameters"], (nlohmann::json{{"rope_type", "default"}, {"rope_theta", 500000.0}}));
  EXPECT_EQ(theta(exported.dump()), 500000.0);

  for (const auto& [text, message] : {
           std::pair{v5(R"({"rope_type": "yarn", "factor": 8.0, "rope_theta": 500000.0})"),
                     "key rope_parameters.rope_type = \"yarn\": this rotary scaling is not supported"},
           std::pair{v5(R"({"type": "linear", "factor": 2.0})"), "key rope_parameters.type = \"linear\""},
           std::pair{v5(R"({"rope_type": "default", "partial_rotary_factor": 0.5})"),
                     "key rope_parameters.partial_rotary_factor = 0.5: partial rotary embeddings"},
           std::pair{v5(R"({"rope_theta": -1})"), "key rope_parameters.rope_theta = -1: must be a number > 0"},
           std::pair{v5("4"), "key rope_parameters = 4: must be an object"},
           std::pair{with_key("rope_parameters", R"({"rope_theta": 10000.0})"),
                     "key rope_parameters.rope_theta = 10000.0: differs from the key rope_theta = 500000.0"},
       }) {
    const std::string e = config_error(text);
    EXPECT_NE(e.find(std::string("config.json: ") + message), std::string::npos) << e;
  }
}

// Llama 3.1's scaling, as transformers 4 (rope_scaling) and 5 (rope_parameters) write it: read
// into the model's rope_scaling keys, written back in both spellings, refused where incomplete or
// where the two spellings disagree.
TEST(HfConfigFromJson, Llama3RotaryScalingInBothSpellings) {
  const char* keys = R"("factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192)";
  nlohmann::json j4 =
      parse_json_or_throw(with_key("rope_scaling", fmt::format(R"({{"rope_type": "llama3", {}}})", keys)));
  j4.erase("rope_parameters");  // as transformers 4 writes it
  const std::string v4 = dump_json(j4);
  nlohmann::json j = parse_json_or_throw(hf_config_json(small_config(2, false)));
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = parse_json_or_throw(fmt::format(R"({{"rope_type": "llama3", "rope_theta": 5e5, {}}})", keys));
  const std::string v5 = dump_json(j);
  for (const std::string& text : {v4, v5}) {
    const model::ModelConfig c = hf_config_from_json(text, "config.json").config;
    EXPECT_EQ(c.rope_scaling, model::RopeScaling::kLlama3);
    EXPECT_EQ(c.rope_scaling_factor, 32.0);
    EXPECT_EQ(c.rope_low_freq_factor, 1.0);
    EXPECT_EQ(c.rope_high_freq_factor, 4.0);
    EXPECT_EQ(c.rope_original_seq_len, 8192);
    EXPECT_EQ(c.rope_theta, 500000.0);
    // Exported in both spellings, which read back to the same model.
    const nlohmann::json out = parse_json_or_throw(hf_config_json(c));
    EXPECT_EQ(out["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(out["rope_parameters"]["rope_type"], "llama3");
    EXPECT_EQ(out["rope_parameters"]["factor"], 32.0);
    const model::ModelConfig back = hf_config_from_json(out.dump(), "config.json").config;
    EXPECT_EQ(back.rope_scaling, c.rope_scaling);
    EXPECT_EQ(back.rope_scaling_factor, c.rope_scaling_factor);
    EXPECT_EQ(back.rope_original_seq_len, c.rope_original_seq_len);
  }
  for (const auto& [text, message] : {
           std::pair{with_key("rope_scaling", R"({"rope_type": "llama3", "original_max_position_embeddings": 8192})"),
                     "key rope_scaling.factor: missing"},
           std::pair{with_key("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0})"),
                     "key rope_scaling.original_max_position_embeddings: missing"},
           std::pair{with_key("rope_scaling", R"({"rope_type": "llama3", "factor": 0.5,
                                                  "original_max_position_embeddings": 8192})"),
                     "key rope_scaling.factor = 0.5: must be >= 1"},
           std::pair{with_key("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                     "key rope_scaling.high_freq_factor = 4.0: must exceed low_freq_factor"},
       }) {
    const std::string e = config_error(text);
    EXPECT_NE(e.find(std::string("config.json: ") + message), std::string::npos) << e;
  }
  // Both spellings, disagreeing on the factor.
  nlohmann::json both = parse_json_or_throw(v4);
  both["rope_parameters"] =
      parse_json_or_throw(R"({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192})");
  const std::string e = config_error(both.dump());
  EXPECT_NE(e.find("key rope_parameters.rope_type = \"llama3\": and its keys differ from the key rope_scaling's"),
            std::string::npos)
      << e;
}

// Llama 3.2 1B's config.json as published (transformers 4.45): read whole, its scaled rotation
// and tied embeddings included.
TEST(HfConfigFromJson, Llama32ConfigAsPublished) {
  const char* text = R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";
  const model::ModelConfig c = hf_config_from_json(text, "config.json").config;
  EXPECT_EQ(c.dim, 2048);
  EXPECT_EQ(c.n_layers, 16);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_EQ(c.ffn_hidden, 8192);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.seq_len, 131072);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, model::RopeScaling::kLlama3);
  EXPECT_EQ(c.rope_scaling_factor, 32.0);
  EXPECT_EQ(c.rope_original_seq_len, 8192);
  EXPECT_NEAR(static_cast<double>(model::parameter_count(c)), 1.236e9, 0.001e9);  // as published: 1.24B
}

// config.json sizes the layout import builds before it compares any tensor: 2^40 layers beside a
// 2-layer model's weights allocated until the process was killed. The layers are counted
// against the weights first (65536 here, to keep the old behaviour quick to see).
TEST(HfImport, LayersBeyondTheWeightsRefusedBeforeTheLayout) {
  const model::ModelConfig c = small_config(2, false);
  const fs::path dir = fresh_dir("layers");
  export_hf(c, random_tensors(c, 3), "test", dir.string());
  std::ofstream(dir / "config.json") << with_key("num_hidden_layers", "65536");
  const std::string e = import_error(dir);
  EXPECT_NE(e.find((dir / "config.json").string() + ": key num_hidden_layers = 65536"), std::string::npos) << e;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::checkpoint
