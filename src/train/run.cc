// `tessera train`: the step loop.
#include "train/run.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/timer.h"
#include "train/trainer.h"

namespace tessera::train {
namespace {

std::ofstream open_for_write(const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw IoError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
  return out;
}

std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

void run_training(const config::Config& config, const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw IoError(fmt::format("cannot create run directory {}: {}", run_dir, ec.message()));
  open_for_write(run_dir + "/config.toml") << config::to_toml(config);

  Trainer trainer(config);
  const model::ModelConfig& m = config.model;
  log::info("model {}: {} parameters ({} layers, dim {}, {} heads / {} kv, ffn {}, vocab {}, seq {})", m.preset,
            format_count(static_cast<double>(model::parameter_count(m))), m.n_layers, m.dim, m.n_heads, m.n_kv_heads,
            m.ffn_hidden, m.vocab_size, m.seq_len);
  log::info("batch {} sequences = {} tokens/step ({} micro-batches of {}), {} threads; memory: state {} MB, "
            "activations {} MB",
            config.train.batch_size, config.tokens_per_step(), config.accumulation_steps(), config.micro_batch(),
            tessera::num_threads(),
            trainer.state_bytes() >> 20, trainer.activation_bytes() >> 20);
  log::info("data: synthetic tokens (seed {}); run directory {}", config.train.seed, run_dir);

  std::ofstream metrics = open_for_write(run_dir + "/metrics.jsonl");
  const double flops_per_token = model::flops_per_token(m);
  int64_t tokens = 0;
  const double start = now_seconds();
  while (trainer.steps_done() < config.train.max_steps &&
         (config.train.max_tokens == 0 || tokens < config.train.max_tokens)) {
    const StepStats s = trainer.step();
    tokens += s.tokens;
    const double tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
    nlohmann::ordered_json record = {{"step", s.step},
                                     {"loss", s.loss},
                                     {"lr", s.lr},
                                     {"grad_norm", s.grad_norm},
                                     {"tokens", tokens},
                                     {"step_s", s.seconds},
                                     {"tokens_per_s", tokens_per_s},
                                     {"model_flops_per_s", tokens_per_s * flops_per_token}};
    metrics << record.dump() << '\n';
    metrics.flush();
    if (s.step % config.metrics.log_interval == 0 || s.step == config.train.max_steps) {
      const double elapsed = now_seconds() - start;
      const double eta = elapsed / static_cast<double>(s.step) * static_cast<double>(config.train.max_steps - s.step);
      log::info("step {:>5}/{} loss {:.4f} lr {:.2e} grad_norm {:.3f} {} tok/s {:.1f} GFLOP/s eta {:.0f}s", s.step,
                config.train.max_steps, s.loss, s.lr, s.grad_norm, format_count(tokens_per_s),
                tokens_per_s * flops_per_token / 1e9, eta);
    }
  }
  if (!metrics) throw IoError(fmt::format("cannot write {}/metrics.jsonl", run_dir));
  if (config.checkpoint.save_final) {
    const std::string path = run_dir + "/model.safetensors";
    checkpoint::write_safetensors(path, trainer.params().named_tensors());
    log::info("wrote {}", path);
  }
  log::info("done: {} steps, {} tokens in {:.1f}s", trainer.steps_done(), format_count(static_cast<double>(tokens)),
            now_seconds() - start);
}

}  // namespace tessera::train
