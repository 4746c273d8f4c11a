// `tessera generate` and `tessera eval`: using a trained model.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "fsdp/sharded_params.h"
#include "train/generate.h"
#include "train/run.h"
#include "train/trainer.h"

namespace tessera::cli {

int cmd_generate(const Args& args) {
  const ParsedArgs a =
      parse_args(args, {"--checkpoint", "--prompt", "--max-tokens", "--temperature", "--top-k", "--seed", "--tokenizer"});
  if (a.help || !a.positional.empty()) {
    std::fputs("usage: tessera generate --checkpoint PATH --prompt TEXT [--max-tokens N] [--temperature T] "
               "[--top-k K] [--seed S] [--tokenizer MODEL]\n",
               a.help ? stdout : stderr);
    return a.help ? kExitOk : kExitConfig;
  }
  const std::string checkpoint = a.get("--checkpoint", "");
  if (checkpoint.empty()) throw ConfigError("generate needs --checkpoint PATH (a run directory or weights file)");
  train::SamplingOptions options;
  options.max_tokens = a.get_int("--max-tokens", options.max_tokens);
  options.temperature = a.get_double("--temperature", options.temperature);
  options.top_k = a.get_int("--top-k", options.top_k);
  options.seed = static_cast<uint64_t>(a.get_int("--seed", 0));
  if (options.max_tokens < 0 || options.temperature < 0 || options.top_k < 0) {
    throw ConfigError("--max-tokens, --temperature and --top-k must be >= 0");
  }

  const train::TrainedModel trained = train::load_trained(checkpoint, a.get("--tokenizer", ""));
  if (trained.tokenizer_path.empty()) {
    throw DataError(fmt::format("no tokenizer.model beside {}; pass --tokenizer MODEL", trained.weights_path));
  }
  const data::Tokenizer tokenizer(trained.tokenizer_path);
  if (tokenizer.vocab_size() != trained.config.model.vocab_size) {
    throw DataError(fmt::format("tokenizer {} has {} tokens but the model {} has {}", trained.tokenizer_path,
                                tokenizer.vocab_size(), trained.weights_path, trained.config.model.vocab_size));
  }
  train::configure_threads(trained.config);
  const model::ModelLayout layout(trained.config.model);
  fsdp::ShardedParams params(layout, 0, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1, comm::Millis(0));
  params.load_tensors(trained.tensors, trained.weights_path);
  model::Llama model(layout, 1, num_threads());

  // Documents in the training data follow an EOS, so a prompt starts after one.
  std::vector<int32_t> ids = {tokenizer.eos_id()};
  const std::vector<int32_t> encoded = tokenizer.encode(a.get("--prompt", ""));
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  // Decode prompt and continuation together and print what is new: a piece decoded alone loses
  // the space it starts with, and byte-fallback sequences decode only when complete.
  std::vector<int32_t> text_ids = encoded;
  std::string text = tokenizer.decode(text_ids);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  train::generate(model, params, ids, tokenizer.eos_id(), options, [&](int32_t token) {
    text_ids.push_back(token);
    const std::string now = tokenizer.decode(text_ids);
    if (now.size() > text.size() && now.compare(0, text.size(), text) == 0) {
      std::fputs(now.c_str() + text.size(), stdout);
      std::fflush(stdout);
      text = now;
    }
  });
  std::fputs("\n", stdout);
  return kExitOk;
}

int cmd_eval(const Args& args) {
  const ParsedArgs a = parse_args(args, {"--checkpoint", "--data"});
  if (a.help || !a.positional.empty()) {
    std::fputs("usage: tessera eval --checkpoint PATH [--data DIR]\n", a.help ? stdout : stderr);
    return a.help ? kExitOk : kExitConfig;
  }
  const std::string checkpoint = a.get("--checkpoint", "");
  if (checkpoint.empty()) throw ConfigError("eval needs --checkpoint PATH (a run directory or weights file)");
  const train::TrainedModel trained = train::load_trained(checkpoint);
  const std::string dataset = a.get("--data", trained.dataset);
  if (dataset.empty()) throw ConfigError(fmt::format("no dataset recorded for {}; pass --data DIR", checkpoint));

  config::Config c = trained.config;
  c.data.synthetic = false;
  c.data.dataset = dataset;
  // Evaluation runs in this process, whatever the run's world size, tensor and pipeline sizes were.
  c.parallel.nproc = c.parallel.tensor = c.parallel.pipeline = 1;
  c.parallel.pipeline_layers.clear();
  c.train.micro_batch_size = 0;
  c.train.init_from.clear();  // the weights come from the checkpoint
  train::Trainer trainer(c, train::resolve_dataset(c));
  trainer.params().load_tensors(trained.tensors, trained.weights_path);
  // The whole validation split, as the last evaluation of `tessera train` covers.
  const train::Trainer::Evaluation e = trainer.evaluate(trainer.validation_batches());
  nlohmann::ordered_json out = {{"checkpoint", trained.weights_path},
                                {"dataset", dataset},
                                {"val_tokens", trainer.dataset()->val.tokens},
                                {"val_targets", e.targets},
                                {"val_loss", e.loss},
                                {"perplexity", std::exp(e.loss)},
                                {"unigram_entropy", trainer.dataset()->unigram_entropy}};
  fmt::print("{}\n", out.dump());
  return kExitOk;
}

}  // namespace tessera::cli
