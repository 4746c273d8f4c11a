// `tessera generate` and `tessera eval`: using a trained model.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "core/threads.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "fsdp/sharded_params.h"
#include "train/device.h"
#include "train/generate.h"
#include "train/run.h"
#include "train/trainer.h"

namespace tessera::cli {

namespace {

constexpr const char* kGenerateUsage =
    "usage: tessera generate --checkpoint PATH (--prompt TEXT [--prompt TEXT]... | --prompts-file FILE)\n"
    "         [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer FILE]\n"
    "         [--threads N] [--bf16] [--no-kv-cache] [--token-ids] [--device auto|cpu|cuda]\n"
    "  several prompts run as one batch and print one block each; --prompts-file: one prompt a line.\n"
    "  Sampling (defaults 0.8, 40, 1): at temperature T from the K likeliest tokens (0: all), of them\n"
    "  the fewest holding P of their probability (the nucleus; 1: all of them); T = 0: greedy.\n"
    "  A continuation ends at the EOS, or at a chat model's end of turn (Llama 3's <|eot_id|>).\n"
    "  Quote a prompt of several words: every word after --prompt is a prompt of its own.\n"
    "  --bf16: weight GEMMs in bf16. --no-kv-cache: a full forward per token (the reference path,\n"
    "  CPU only). --device: as train.device (auto: a GPU where one is usable, with the cache).\n"
    "  --token-ids: prompts are token ids (\"1 2 3\"), no tokenizer; prints one JSON object with the\n"
    "  new ids, their log-probabilities under the model and the time, and runs max-tokens tokens\n"
    "  whatever they are (for benchmarks).\n";

std::vector<std::string> prompt_texts(const ParsedArgs& a) {
  std::vector<std::string> prompts = a.get_list("--prompt");
  const std::string file = a.get("--prompts-file", "");
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw DataError(fmt::format("cannot read --prompts-file {}", file));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) prompts.push_back(line);
    }
    if (prompts.empty()) throw DataError(fmt::format("--prompts-file {} holds no prompt", file));
  }
  if (prompts.empty()) prompts.emplace_back();  // as before: an empty prompt starts a document
  return prompts;
}

// --token-ids: one JSON object with the new ids per prompt and the generation's time.
int generate_ids(const model::ModelLayout& layout, model::ParamSource& params, kernels::Backend& backend,
                 const std::vector<std::string>& texts, const train::SamplingOptions& options) {
  std::vector<std::vector<int32_t>> prompts;
  int64_t prompt_tokens = 0;
  for (const std::string& t : texts) {
    prompts.push_back(parse_token_ids(t, layout.config().vocab_size, "--token-ids"));
    prompt_tokens += static_cast<int64_t>(prompts.back().size());
  }
  const double t0 = now_seconds();
  std::vector<std::vector<double>> logprobs(prompts.size());
  const auto out = train::generate(
      layout, params, prompts, {}, options, [&](int64_t b, int32_t, double logprob) { logprobs[b].push_back(logprob); },
      backend);
  const double seconds = now_seconds() - t0;
  int64_t new_tokens = 0;
  for (const auto& o : out) new_tokens += static_cast<int64_t>(o.size());
  const nlohmann::ordered_json j = {{"tokens", out},
                                    {"logprobs", logprobs},
                                    {"prompts", prompts.size()},
                                    {"prompt_tokens", prompt_tokens},
                                    {"new_tokens", new_tokens},
                                    {"seconds", seconds},
                                    {"tokens_per_s", new_tokens / seconds},
                                    {"kv_cache", options.kv_cache},
                                    {"bf16", options.bf16},
                                    {"threads", num_threads()}};
  fmt::print("{}\n", dump_json(j));
  return kExitOk;
}

// Text: one prompt streams its continuation as it comes; several print a block each at the end.
int generate_text(const model::ModelLayout& layout, model::ParamSource& params, kernels::Backend& backend,
                  const data::Tokenizer& tokenizer, const std::vector<std::string>& texts,
                  const train::SamplingOptions& options) {
  std::vector<std::vector<int32_t>> prompts, text_ids;
  for (const std::string& t : texts) {
    text_ids.push_back(tokenizer.encode(t));
    // A prompt starts as a document of the training data does: after its start (Llama 3's BOS),
    // else after the EOS that ended the document before.
    prompts.push_back(tokenizer.document_start());
    if (prompts.back().empty() && tokenizer.eos_id() >= 0) prompts.back().push_back(tokenizer.eos_id());
    prompts.back().insert(prompts.back().end(), text_ids.back().begin(), text_ids.back().end());
    if (prompts.back().empty()) {
      throw ConfigError(fmt::format("prompt {} is empty, and tokenizer {} has neither a BOS nor an EOS to start it",
                                    prompts.size(), tokenizer.path()));
    }
  }
  if (texts.size() > 1) {
    const auto out = train::generate(
        layout, params, prompts, tokenizer.stop_tokens(), options, [](int64_t, int32_t, double) {}, backend);
    for (size_t i = 0; i < texts.size(); ++i) {
      text_ids[i].insert(text_ids[i].end(), out[i].begin(), out[i].end());
      fmt::print("=== {}/{} ===\n{}\n", i + 1, texts.size(), tokenizer.decode(text_ids[i]));
    }
    return kExitOk;
  }
  // Decode prompt and continuation together and print what is new: a piece decoded alone loses
  // the space it starts with, and a character split over tokens decodes only when complete (until
  // then it ends the text as U+FFFD, held back here).
  std::string text;
  const auto print_new = [&](bool last) {
    std::string now = tokenizer.decode(text_ids[0]);
    constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    while (!last && now.ends_with(kReplacement)) now.resize(now.size() - kReplacement.size());
    if (now.size() > text.size() && now.compare(0, text.size(), text) == 0) {
      std::fputs(now.c_str() + text.size(), stdout);
      std::fflush(stdout);
      text = std::move(now);
    }
  };
  print_new(false);
  const auto stream = [&](int64_t, int32_t token, double) {
    text_ids[0].push_back(token);
    print_new(false);
  };
  train::generate(layout, params, prompts, tokenizer.stop_tokens(), options, stream, backend);
  print_new(true);
  std::fputs("\n", stdout);
  return kExitOk;
}

}  // namespace

int cmd_generate(const Args& args) {
  const ParsedArgs a = parse_args(args,
                                  {"--checkpoint", "--prompts-file", "--max-tokens", "--temperature", "--top-k",
                                   "--top-p", "--seed", "--tokenizer", "--threads", "--device"},
                                  {"--prompt"}, {"--bf16", "--no-kv-cache", "--token-ids"});
  if (a.help || !a.positional.empty()) {
    std::fputs(kGenerateUsage, a.help ? stdout : stderr);
    return a.help ? kExitOk : kExitConfig;
  }
  const std::string checkpoint = a.get("--checkpoint", "");
  if (checkpoint.empty()) throw ConfigError("generate needs --checkpoint PATH (a run directory or weights file)");
  train::SamplingOptions options;
  options.max_tokens = a.get_int("--max-tokens", options.max_tokens);
  options.temperature = a.get_double("--temperature", options.temperature);
  options.top_k = a.get_int("--top-k", options.top_k);
  options.top_p = a.get_double("--top-p", options.top_p);
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    throw ConfigError(fmt::format("--top-p {}: must be in (0, 1]", a.get("--top-p", "")));
  }
  options.seed = static_cast<uint64_t>(a.get_int("--seed", 0));
  options.kv_cache = a.flags.count("--no-kv-cache") == 0;
  options.bf16 = a.flags.count("--bf16") != 0;
  for (const auto& [flag, negative] :
       {std::pair{"--max-tokens", options.max_tokens < 0}, std::pair{"--temperature", options.temperature < 0},
        std::pair{"--top-k", options.top_k < 0}}) {
    if (negative) throw ConfigError(fmt::format("{} {}: must be >= 0", flag, a.get(flag, "")));
  }
  const config::Device asked = config::parse_device(a.get("--device", options.kv_cache ? "auto" : "cpu"), "--device");
  if (!options.kv_cache && asked == config::Device::kCuda) {
    throw ConfigError("--device cuda: generation without the key/value cache (--no-kv-cache) runs on the CPU only");
  }
  const bool token_ids = a.flags.count("--token-ids") != 0;
  const std::vector<std::string> texts = prompt_texts(a);

  train::TrainedModel trained = train::load_trained(checkpoint, a.get("--tokenizer", ""));
  std::optional<data::Tokenizer> tokenizer;
  if (!token_ids) {
    if (trained.tokenizer_path.empty()) {
      throw DataError(
          fmt::format("no tokenizer.model or tokenizer.json beside {}; pass --tokenizer FILE", trained.weights_path));
    }
    tokenizer.emplace(trained.tokenizer_path);
    if (tokenizer->vocab_size() != trained.config.model.vocab_size) {
      throw DataError(fmt::format("tokenizer {} has {} tokens but the model {} has {}", trained.tokenizer_path,
                                  tokenizer->vocab_size(), trained.weights_path, trained.config.model.vocab_size));
    }
  }
  trained.config.train.threads = a.get_int("--threads", trained.config.train.threads);
  if (trained.config.train.threads < 0) throw ConfigError("--threads must be >= 0 (0: one per core)");
  train::configure_threads(trained.config);
  // Where the run trained does not decide: --device does (the full-forward reference is CPU only).
  config::Config where = trained.config;
  where.parallel.tensor = where.parallel.pipeline = 1;
  where.train.device = asked;
  const train::ComputeDevice device(where, 1);
  log::info("device: {}", device.description());
  kernels::Backend& backend = device.backend();
  const model::ModelLayout layout(trained.config.model);
  // bf16: the source hands out bf16 images of its units (rounded from the fp32 weights).
  fsdp::ShardedParams params(layout, 0, fsdp::Strategy::kNoShard, parallel::Mesh::single(), 1, comm::Millis(0),
                             options.bf16 ? comm::DType::kBF16 : comm::DType::kF32, comm::DType::kF32, backend);
  params.load_tensors(trained.tensors, trained.weights_path);
  if (token_ids) return generate_ids(layout, params, backend, texts, options);
  return generate_text(layout, params, backend, *tokenizer, texts, options);
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
  c.train.device = config::Device::kAuto;  // a GPU where one is usable, whatever the run trained on
  const train::ComputeDevice device(c, 1);
  train::log_device(c, device);
  train::Trainer trainer(c, train::resolve_dataset(c), {}, device.backend());
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
  fmt::print("{}\n", dump_json(out));
  return kExitOk;
}

}  // namespace tessera::cli
