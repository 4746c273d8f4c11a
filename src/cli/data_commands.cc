// The data subcommands: `tessera tokenizer train|encode|decode` and `tessera prepare`.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/object_cache.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "storage/s3_client.h"

namespace tessera::cli {
namespace {

constexpr const char* kTokenizerUsage =
    "usage: tessera tokenizer train --input FILE... --vocab-size N --out MODEL.model [--threads T]\n"
    "  trains a byte-fallback BPE SentencePiece model on the inputs' lines (plain or .zst);\n"
    "  writes MODEL.model and MODEL.vocab; T defaults to one per core, and the model depends on T,\n"
    "  so give --threads to reproduce a model on another machine\n"
    "usage: tessera tokenizer encode --tokenizer FILE (--text TEXT | --jsonl IN)\n"
    "       tessera tokenizer decode --tokenizer FILE (--ids \"ID ...\" | --jsonl IN)\n"
    "  FILE: a SentencePiece model or a Hugging Face tokenizer.json. Encoding adds no special\n"
    "  tokens. --text/--ids: prints the ids, or the text. --jsonl: IN holds a JSON string (encode)\n"
    "  or a list of ids (decode) a line; prints one JSON list or string a line, in order\n";

constexpr const char* kPrepareUsage =
    "usage: tessera prepare --input FILE/GLOB... --tokenizer FILE --out DIR [--workers K]\n"
    "                       [--val-fraction F] [--shard-tokens N] [--seed S]\n"
    "  tokenizes blank-line-separated documents into token shards in DIR with K worker\n"
    "  processes; DIR/manifest.json is written last. FILE: a SentencePiece model or a Hugging Face\n"
    "  tokenizer.json; each document ends with its EOS, and starts with its BOS where the\n"
    "  tokenizer.json's template puts one first (Llama 3's)\n";

int int_flag(const ParsedArgs& a, const std::string& flag, int fallback, int lo) {
  const long long v = a.get_int(flag, fallback);
  if (v < lo || v > std::numeric_limits<int>::max())
    throw ConfigError(fmt::format("{} {}: must be >= {}", flag, v, lo));
  return static_cast<int>(v);
}

std::string required(const ParsedArgs& a, const std::string& flag) {
  const std::string v = a.get(flag, "");
  if (v.empty()) throw ConfigError(fmt::format("missing {}", flag));
  return v;
}

// `tokenizer encode` and `tokenizer decode`.
int tokenizer_codec(const ParsedArgs& a, bool encode) {
  const data::Tokenizer tok(required(a, "--tokenizer"));
  const std::string one = a.get(encode ? "--text" : "--ids", ""), jsonl = a.get("--jsonl", "");
  if (one.empty() == jsonl.empty()) {
    throw ConfigError(fmt::format("tokenizer {}: give one of {} and --jsonl", encode ? "encode" : "decode",
                                  encode ? "--text" : "--ids"));
  }
  if (!one.empty()) {
    if (encode) {
      fmt::print("{}\n", fmt::join(tok.encode(one), " "));
    } else {
      fmt::print("{}\n", tok.decode(parse_token_ids(one, tok.vocab_size(), "--ids")));
    }
    return kExitOk;
  }
  std::ifstream in(jsonl);
  if (!in) throw DataError(fmt::format("cannot read --jsonl {}", jsonl));
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const nlohmann::json j = parse_json(line);
    const bool ok = encode ? j.is_string() : (j.is_array() && std::all_of(j.begin(), j.end(), [](const auto& v) {
                                                return v.is_number_integer() &&
                                                       v.template get<int64_t>() >= INT32_MIN &&
                                                       v.template get<int64_t>() <= INT32_MAX;
                                              }));
    if (!ok) {
      throw DataError(fmt::format("--jsonl {}: line {} is not {}", jsonl, line_no,
                                  encode ? "a JSON string" : "a JSON list of token ids"));
    }
    if (encode) {
      fmt::print("{}\n", dump_json(nlohmann::json(tok.encode(j.get<std::string>()))));
    } else {
      fmt::print("{}\n", dump_json(nlohmann::json(tok.decode(j.get<std::vector<int32_t>>())), -1, true));
    }
  }
  return kExitOk;
}

}  // namespace

int cmd_tokenizer(const Args& args) {
  const ParsedArgs a = parse_args(
      args, {"--vocab-size", "--out", "--threads", "--tokenizer", "--text", "--ids", "--jsonl"}, {"--input"});
  if (a.help) {
    std::fputs(kTokenizerUsage, stdout);
    return kExitOk;
  }
  if (a.positional.size() == 1 && (a.positional[0] == "encode" || a.positional[0] == "decode")) {
    return tokenizer_codec(a, a.positional[0] == "encode");
  }
  if (a.positional.size() != 1 || a.positional[0] != "train") {
    std::fputs(kTokenizerUsage, stderr);
    return kExitConfig;
  }
  data::TokenizerTrainOptions o;
  o.inputs = a.get_list("--input");
  if (o.inputs.empty()) throw ConfigError("missing --input FILE...");
  o.vocab_size = a.get_int("--vocab-size", o.vocab_size);
  o.out = required(a, "--out");
  o.threads = int_flag(a, "--threads", 0, 0);
  const double t0 = now_seconds();
  data::train_tokenizer(o);
  const data::Tokenizer tok(o.out);
  fmt::print("tokenizer {}: vocab {}, hash {:016x}, trained in {:.1f} s\n", o.out, tok.vocab_size(), tok.hash(),
             now_seconds() - t0);
  return kExitOk;
}

namespace {

// A directory under $TMPDIR (or /tmp), removed with everything in it.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& stem) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = fmt::format("{}/{}_XXXXXX", base != nullptr ? base : "/tmp", stem);
    if (::mkdtemp(pattern.data()) == nullptr) throw IoError(fmt::format("cannot create {}", pattern));
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

int cmd_prepare(const Args& args) {
  const ParsedArgs a = parse_args(
      args, {"--tokenizer", "--out", "--workers", "--val-fraction", "--shard-tokens", "--seed"}, {"--input"});
  if (a.help) {
    std::fputs(kPrepareUsage, stdout);
    return kExitOk;
  }
  if (!a.positional.empty()) {
    throw ConfigError(fmt::format("unexpected argument \"{}\" (inputs follow --input)", a.positional[0]));
  }
  data::PrepareOptions o;
  o.inputs = a.get_list("--input");
  if (o.inputs.empty()) throw ConfigError("missing --input FILE/GLOB...");
  o.tokenizer = required(a, "--tokenizer");
  o.out = required(a, "--out");
  o.workers = int_flag(a, "--workers", 1, 1);
  o.val_fraction = a.get_double("--val-fraction", 0.0);
  const long long shard_tokens = a.get_int("--shard-tokens", static_cast<long long>(o.shard_tokens));
  if (shard_tokens < 1) throw ConfigError(fmt::format("--shard-tokens {}: must be >= 1", shard_tokens));
  o.shard_tokens = static_cast<uint64_t>(shard_tokens);
  const long long seed = a.get_int("--seed", 0);
  if (seed < 0) throw ConfigError(fmt::format("--seed {}: must be >= 0", seed));
  o.seed = static_cast<uint64_t>(seed);

  // To an object store: prepared in a local staging directory, then uploaded (manifest last).
  const std::string destination = o.out;
  std::unique_ptr<TempDir> staging;
  if (storage::is_s3(destination)) {
    const storage::ObjectUrl url = storage::parse_s3(destination, "--out");
    if (storage::default_s3_client().head(url.child("manifest.json"))) {
      throw ConfigError(fmt::format("--out {}: a dataset is already there; prepare into another prefix", destination));
    }
    staging = std::make_unique<TempDir>("tessera_prepare");
    o.out = staging->path + "/dataset";
  }
  const data::PrepareStats s = data::prepare(o);
  const double secs = s.seconds > 0 ? s.seconds : 1e-9;
  const uint64_t tokens = s.train_tokens + s.val_tokens;
  fmt::print(
      "prepared {}: {} documents, {:.1f} MB of text in {:.2f} s with {} worker(s): {:.2f} MB/s, {:.0f} tokens/s\n",
      o.out, s.documents, static_cast<double>(s.bytes) / 1e6, s.seconds, o.workers,
      static_cast<double>(s.bytes) / 1e6 / secs, static_cast<double>(tokens) / secs);
  const data::DatasetManifest m = data::read_manifest(o.out);
  fmt::print(
      "  train: {} tokens, {} documents\n  val:   {} tokens, {} documents\n  {} shard(s), unigram entropy {:.3f} "
      "nats\n",
      m.train.tokens, m.train.documents, m.val.tokens, m.val.documents, s.shards, m.unigram_entropy);
  if (staging) {
    const double t0 = now_seconds();
    const int64_t puts =
        data::upload_dataset(storage::default_s3_client(), o.out, storage::parse_s3(destination, "--out"));
    fmt::print("uploaded to {} in {:.2f} s ({} PUT requests)\n", destination, now_seconds() - t0, puts);
  }
  return kExitOk;
}

}  // namespace tessera::cli
