// train.init_from: Hugging Face or Tessera weights, checked against the configured model.
#include "train/init_from.h"

#include <fmt/format.h>

#include <filesystem>
#include <functional>

#include "checkpoint/hf.h"
#include "core/error.h"
#include "core/log.h"
#include "train/run.h"

namespace tessera::train {

std::vector<checkpoint::NamedTensor> load_init_weights(const config::Config& config) {
  namespace fs = std::filesystem;
  const std::string& path = config.train.init_from;
  if (!fs::exists(path))
    throw ConfigError(fmt::format("config key train.init_from = \"{}\": no such file or directory", path));
  model::ModelConfig source;
  std::vector<checkpoint::NamedTensor> tensors;
  std::string origin;
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "config.json")) {
    checkpoint::HfModel hf = checkpoint::import_hf(path);
    source = hf.config;
    tensors = std::move(hf.tensors);
    origin = (fs::path(path) / "config.json").string();
  } else {
    TrainedModel trained = load_trained(path);
    source = trained.config.model;
    tensors = std::move(trained.tensors);
    origin = trained.weights_path;
  }
  const model::ModelConfig& m = config.model;
  auto check = [&](const char* key, auto mine, auto theirs) {
    if (mine != theirs) {
      throw ConfigError(
          fmt::format("config key model.{} = {} does not match train.init_from = \"{}\" ({} has {}); set "
                      "model.{} = {}",
                      key, mine, path, origin, theirs, key, theirs));
    }
  };
  check("vocab_size", m.vocab_size, source.vocab_size);
  check("dim", m.dim, source.dim);
  check("n_layers", m.n_layers, source.n_layers);
  check("n_heads", m.n_heads, source.n_heads);
  check("n_kv_heads", m.n_kv_heads, source.n_kv_heads);
  check("ffn_hidden", m.ffn_hidden, source.ffn_hidden);
  check("rope_theta", m.rope_theta, source.rope_theta);
  check("rope_scaling", config::name(m.rope_scaling), config::name(source.rope_scaling));
  if (m.rope_scaling != model::RopeScaling::kNone) {
    check("rope_scaling_factor", m.rope_scaling_factor, source.rope_scaling_factor);
    check("rope_low_freq_factor", m.rope_low_freq_factor, source.rope_low_freq_factor);
    check("rope_high_freq_factor", m.rope_high_freq_factor, source.rope_high_freq_factor);
    check("rope_original_seq_len", m.rope_original_seq_len, source.rope_original_seq_len);
  }
  check("norm_eps", m.norm_eps, source.norm_eps);
  check("tied_embeddings", m.tied_embeddings, source.tied_embeddings);
  log::info("initial weights from {}", origin);
  return tensors;
}

}  // namespace tessera::train
