// Dataset manifest (JSON, written atomically) and a split's token stream across its shards.
#include "data/dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/check.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/json_keys.h"
#include "core/log.h"
#include "core/text.h"
#include "data/object_cache.h"
#include "storage/s3_client.h"

namespace tessera::data {
namespace {

constexpr const char* kFormat = "tessera-dataset";
constexpr int kVersion = 1;

std::string manifest_path(const std::string& dir) { return dir + "/manifest.json"; }

// Shard files live in the dataset directory itself; a manifest cannot point elsewhere.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

SplitManifest read_split(const JsonKeys& splits, const std::string& name) {
  const JsonKeys split = splits.object(name);
  SplitManifest s;
  s.tokens = split.unsigned_integer("tokens");
  s.documents = split.unsigned_integer("documents");
  uint64_t tokens = 0, documents = 0;
  for (size_t i = 0; i < split.array("shards").size(); ++i) {
    const JsonKeys shard = split.element("shards", i);
    ShardEntry e;
    e.file = shard.string("file");
    if (!plain_file_name(e.file))
      shard.fail("file", fmt::format("= \"{}\" is not a file name in the dataset directory", e.file));
    e.tokens = shard.unsigned_integer("tokens");
    e.documents = shard.unsigned_integer("documents");
    e.checksum = shard.hex64("checksum");
    // A wrapped sum could match the split's totals while the shards claim more than 2^64 tokens.
    if (__builtin_add_overflow(tokens, e.tokens, &tokens) ||
        __builtin_add_overflow(documents, e.documents, &documents)) {
      shard.fail("tokens", "makes the split's shards hold more than 2^64 tokens or documents");
    }
    s.shards.push_back(std::move(e));
  }
  if (tokens != s.tokens || documents != s.documents) {
    split.fail("tokens", fmt::format("= {} and documents = {}, but the shards sum to {} and {}", s.tokens, s.documents,
                                     tokens, documents));
  }
  return s;
}

nlohmann::ordered_json split_json(const SplitManifest& s) {
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const ShardEntry& e : s.shards) {
    shards.push_back(
        {{"file", e.file}, {"tokens", e.tokens}, {"documents", e.documents}, {"checksum", hex64(e.checksum)}});
  }
  return {{"tokens", s.tokens}, {"documents", s.documents}, {"shards", shards}};
}

}  // namespace


DatasetManifest read_manifest(const std::string& dir) {
  const std::string file = manifest_path(dir);
  std::string text;
  if (storage::is_s3(dir)) {
    try {
      text = storage::default_s3_client().get(storage::parse_s3(file, "data.dataset"));
    } catch (const storage::S3Error& e) {
      if (e.code() == "NoSuchKey") throw DataError(fmt::format("{} is missing (not a prepared dataset?)", file));
      throw;
    }
  } else {
    FileBytes read = try_read_file(file);
    if (!read) throw DataError(fmt::format("cannot read {}: {} (not a prepared dataset?)", file, read.reason()));
    text = std::move(read.bytes);
  }
  nlohmann::json j = parse_json(text);
  if (j.is_discarded()) throw DataError(fmt::format("{}: not valid JSON", file));
  const JsonKeys top(j, file);
  if (top.string("format") != kFormat) top.fail("format", fmt::format("is not \"{}\"", kFormat));
  if (const int64_t v = top.integer("version"); v != kVersion) {
    top.fail("version", fmt::format("= {}; this build reads version {}", v, kVersion));
  }
  DatasetManifest m;
  const JsonKeys tok = top.object("tokenizer");
  m.tokenizer_file = tok.string("file");
  if (!plain_file_name(m.tokenizer_file)) tok.fail("file", "is not a file name in the dataset directory");
  m.tokenizer_hash = tok.hex64("hash");
  m.vocab_size = tok.integer("vocab_size", 1, int64_t{1} << 31);
  m.eos_id = static_cast<int32_t>(tok.integer("eos_id", 0, m.vocab_size - 1));
  const JsonKeys splits = top.object("splits");
  m.train = read_split(splits, "train");
  m.val = read_split(splits, "val");
  for (const auto& i : top.array("inputs")) {
    if (!i.is_string()) top.fail("inputs", "holds a value that is not a string");
    m.inputs.push_back(i.get<std::string>());
  }
  m.unigram_entropy = top.number("unigram_entropy_nats");
  return m;
}

void write_manifest(const std::string& dir, const DatasetManifest& m) {
  const nlohmann::ordered_json j = {
      {"format", kFormat},
      {"version", kVersion},
      {"tokenizer",
       {{"file", m.tokenizer_file},
        {"hash", hex64(m.tokenizer_hash)},
        {"vocab_size", m.vocab_size},
        {"eos_id", m.eos_id}}},
      {"splits", {{"train", split_json(m.train)}, {"val", split_json(m.val)}}},
      {"inputs", m.inputs},
      {"unigram_entropy_nats", m.unigram_entropy},
  };
  write_file_atomic(manifest_path(dir), dump_json(j, 2) + "\n");
}

TokenStream::TokenStream(const std::string& dir, const std::string& split, const std::string& cache_dir)
    : manifest_(read_manifest(dir)), dir_(dir), cache_dir_(cache_dir) {
  if (split != "train" && split != "val") throw ConfigError(fmt::format("unknown split \"{}\" (train or val)", split));
  entries_ = (split == "train" ? manifest_.train : manifest_.val).shards;
  for (const ShardEntry& e : entries_) {
    starts_.push_back(total_);
    total_ += e.tokens;
  }
  shards_.resize(entries_.size());
  if (!storage::is_s3(dir_)) {
    for (size_t i = 0; i < entries_.size(); ++i) shard(i);  // every shard validated up front
  }
}

TokenStream::~TokenStream() {
  if (read_ahead_.joinable()) read_ahead_.join();
}

void TokenStream::check_against_manifest(const Shard& shard, const ShardEntry& e) const {
  const ShardInfo& info = shard.info();
  auto disagree = [&](const char* what, const std::string& got, const std::string& want) {
    return DataError(
        fmt::format("shard {}: {} {} disagrees with {} ({})", shard.path(), what, got, manifest_path(dir_), want));
  };
  if (info.payload_checksum != e.checksum) throw disagree("checksum", hex64(info.payload_checksum), hex64(e.checksum));
  if (info.tokens != e.tokens) throw disagree("token count", std::to_string(info.tokens), std::to_string(e.tokens));
  if (info.documents != e.documents) {
    throw disagree("document count", std::to_string(info.documents), std::to_string(e.documents));
  }
  if (info.tokenizer_hash != manifest_.tokenizer_hash) {
    throw disagree("tokenizer hash", hex64(info.tokenizer_hash), hex64(manifest_.tokenizer_hash));
  }
  if (static_cast<int64_t>(info.vocab_size) != manifest_.vocab_size) {
    throw disagree("vocab size", std::to_string(info.vocab_size), std::to_string(manifest_.vocab_size));
  }
}

const Shard& TokenStream::shard(size_t i) const {
  if (shards_[i]) return *shards_[i];
  const ShardEntry& e = entries_[i];
  if (!storage::is_s3(dir_)) {
    shards_[i] = std::make_unique<Shard>(Shard::open(dir_ + "/" + e.file));
    check_against_manifest(*shards_[i], e);
    return *shards_[i];
  }
  const std::string path = fetch(i);
  try {
    auto opened = std::make_unique<Shard>(Shard::open(path));
    check_against_manifest(*opened, e);
    shards_[i] = std::move(opened);
  } catch (const DataError& bad) {  // a damaged cached copy is fetched again, once
    log::warn("{}; fetching it again", bad.what());
    std::filesystem::remove(path);
    auto opened = std::make_unique<Shard>(Shard::open(fetch(i)));
    check_against_manifest(*opened, e);
    shards_[i] = std::move(opened);
  }
  // Read-ahead: the next shard is fetched while this one is read.
  if (i + 1 < entries_.size() && !shards_[i + 1]) {
    if (read_ahead_.joinable()) read_ahead_.join();
    read_ahead_ = std::thread([this, next = i + 1] {
      try {
        fetch(next);
      } catch (const Error& err) {  // the reader fetches it again and reports the failure
        log::warn("read-ahead of {}: {}", entries_[next].file, err.what());
      }
    });
  }
  return *shards_[i];
}

std::string TokenStream::fetch(size_t i) const {
  const storage::ObjectUrl url = storage::parse_s3(dir_ + "/" + entries_[i].file, "data.dataset");
  const std::string path = cache_path(cache_dir_, url);
  const uint64_t bytes =
      kShardHeaderBytes + entries_[i].tokens * token_bytes_for(static_cast<uint64_t>(manifest_.vocab_size));
  fetch_to_cache(storage::default_s3_client(), url, bytes, path);  // logs what it fetched
  return path;
}

void TokenStream::read(uint64_t begin, uint64_t n, int32_t* out) const {
  CHECK_MSG(begin <= total_ && n <= total_ - begin, "TokenStream::read past the end");
  // The last shard starting at or before `begin`; empty shards are skipped by the loop.
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin());
  i = i == 0 ? 0 : i - 1;
  while (n > 0) {
    const uint64_t offset = begin - starts_[i];
    const uint64_t take = std::min(n, entries_[i].tokens - offset);
    if (take > 0) shard(i).read(offset, take, out);
    out += take;
    begin += take;
    n -= take;
    ++i;
  }
}

}  // namespace tessera::data
