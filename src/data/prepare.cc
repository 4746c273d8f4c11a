// `tessera prepare`: forked, shared-nothing tokenizer workers writing shards, then the manifest.
#include "data/prepare.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "data/text.h"
#include "data/tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

// A contiguous run of one input's documents for one worker. Inputs that are cut into pieces are
// read by the parent before the fork, so the pieces' global document numbers are known and the
// children share the text copy-on-write.
struct WorkItem {
  size_t input = 0;
  bool preloaded = false;
  size_t begin = 0, end = 0;    // byte range of the preloaded text
  uint64_t first_document = 0;  // index of the item's first document within its input
};

struct Plan {
  std::vector<std::string> inputs;  // expanded, in order
  std::vector<std::string> texts;   // preloaded inputs (empty where a worker reads the file)
  std::vector<std::vector<WorkItem>> workers;
};

bool has_glob_magic(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const std::string& p : patterns) {
    if (!has_glob_magic(p)) {
      out.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), GLOB_ERR, nullptr, &g);
    if (rc == GLOB_NOMATCH) {
      ::globfree(&g);
      throw DataError(fmt::format("--input {}: no file matches", p));
    }
    if (rc != 0) {
      ::globfree(&g);
      throw DataError(fmt::format("--input {}: cannot expand the pattern (glob error {})", p, rc));
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);  // sorted by glob
    ::globfree(&g);
  }
  return out;
}

// Uniform in [0, 1) from (seed, input as given, document index): independent of the worker count.
bool is_val(uint64_t seed, const std::string& input, uint64_t document, double fraction) {
  if (fraction <= 0.0) return false;
  // The file name, not the path as given: the same corpus checked out elsewhere, or named by a
  // relative path, must split the same way.
  const std::string name = std::filesystem::path(input).filename().string();
  const uint64_t h = XXH64(&document, sizeof(document), XXH64(name.data(), name.size(), seed));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

std::string shard_name(const char* split, int worker, int index) {
  return fmt::format("{}-w{}-{:05}.bin", split, worker, index);
}
std::string result_name(int worker) { return fmt::format(".worker-{}.json", worker); }

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What prepare may have written into the output directory (and temporaries of it). Removed
// before a run (a stale manifest would name shards being replaced) and after a failed one.
bool is_ours(std::string_view name) {
  if (name.ends_with(".tmp")) {
    name.remove_suffix(4);
    if (std::find(kTokenizerFiles.begin(), kTokenizerFiles.end(), name) != kTokenizerFiles.end()) return true;
  }
  if (name == "manifest.json") return true;
  if (name.starts_with(".worker-") && name.ends_with(".json") && name.size() > 13) {
    return all_digits(name.substr(8, name.size() - 13));
  }
  for (const std::string_view prefix : {"train-w", "val-w"}) {
    if (!name.starts_with(prefix) || !name.ends_with(".bin") || name.size() < prefix.size() + 4) continue;
    const std::string_view ids = name.substr(prefix.size(), name.size() - prefix.size() - 4);  // "{k}-{n}"
    const size_t dash = ids.find('-');
    return dash != std::string_view::npos && all_digits(ids.substr(0, dash)) && all_digits(ids.substr(dash + 1));
  }
  return false;
}

// The output directory: created if missing; on failure everything prepare wrote is removed, and
// the directory too if prepare created it.
class OutputDir {
 public:
  explicit OutputDir(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    const bool existed = fs::is_directory(path_, ec);
    if (!existed) {
      fs::create_directories(path_, ec);
      if (ec) throw IoError(fmt::format("cannot create output directory {}: {}", path_, ec.message()));
      created_ = true;
    }
    // Probe writability now rather than after minutes of tokenizing.
    const std::string probe = path_ + "/.prepare-probe.tmp";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      if (created_) fs::remove(path_, ec);
      throw IoError(fmt::format("cannot write to output directory {}: {}", path_, std::strerror(err)));
    }
    ::close(fd);
    ::unlink(probe.c_str());
    remove_files();  // what a previous run left
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  void set_wrote_tokenizer(std::string name) { tokenizer_ = std::move(name); }

  // After a failure: our files, and the directory if we created it and it is empty.
  void remove_ours() {
    remove_files();
    std::error_code ec;
    if (created_) fs::remove(path_, ec);  // only succeeds when empty
  }

 private:
  void remove_files() {
    std::error_code ec;
    std::vector<fs::path> doomed;
    for (fs::directory_iterator it(path_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (is_ours(name) || name == tokenizer_) doomed.push_back(it->path());
    }
    for (const fs::path& p : doomed) fs::remove(p, ec);
  }

  std::string path_;
  std::string tokenizer_;  // the tokenizer's copy, once written
  bool created_ = false;
};

Plan make_plan(const PrepareOptions& o, std::vector<std::string> inputs) {
  Plan plan;
  plan.inputs = std::move(inputs);
  plan.texts.resize(plan.inputs.size());
  const size_t n = plan.inputs.size(), k = static_cast<size_t>(o.workers);
  std::vector<WorkItem> items;
  if (n >= k) {
    for (size_t i = 0; i < n; ++i) items.push_back({.input = i});
  } else {
    const int pieces = static_cast<int>((k + n - 1) / n);
    for (size_t i = 0; i < n; ++i) {
      plan.texts[i] = read_text_file(plan.inputs[i]);
      const std::string_view text = plan.texts[i];
      const std::vector<size_t> cuts = split_at_documents(text, pieces);
      uint64_t first = 0;
      for (size_t p = 0; p + 1 < cuts.size(); ++p) {
        items.push_back({.input = i, .preloaded = true, .begin = cuts[p], .end = cuts[p + 1], .first_document = first});
        first += split_documents(text.substr(cuts[p], cuts[p + 1] - cuts[p])).size();
      }
    }
  }
  // Round-robin: with whole inputs, worker w takes inputs w, w+K, ... (ARCHITECTURE.md).
  plan.workers.resize(std::min(k, items.size()));
  for (size_t j = 0; j < items.size(); ++j) plan.workers[j % plan.workers.size()].push_back(items[j]);
  return plan;
}

// One worker's share; runs in the child. Writes shards and returns the result to report.
nlohmann::json run_worker(int w, const std::vector<WorkItem>& items, const Plan& plan, const Tokenizer& tok,
                          const PrepareOptions& o, const OutputDir& out) {
  const auto vocab = static_cast<uint32_t>(tok.vocab_size());
  const int32_t eos = tok.eos_id();
  const std::vector<int32_t> start = tok.document_start();
  struct Split {
    const char* name;
    std::unique_ptr<ShardWriter> writer;
    std::string file;
    int next = 0;
  };
  Split splits[2] = {{"train", nullptr, "", 0}, {"val", nullptr, "", 0}};
  nlohmann::json shards = nlohmann::json::array();
  std::vector<uint64_t> train_counts(vocab, 0);
  auto finish = [&](Split& s) {
    const ShardInfo info = s.writer->finish();
    s.writer.reset();
    shards.push_back({{"split", s.name},
                      {"file", s.file},
                      {"tokens", info.tokens},
                      {"documents", info.documents},
                      {"checksum", info.payload_checksum}});
  };
  uint64_t bytes = 0, documents = 0;
  for (const WorkItem& item : items) {
    const std::string& input = plan.inputs[item.input];
    std::string owned;
    std::string_view text;
    if (item.preloaded) {
      text = std::string_view(plan.texts[item.input]).substr(item.begin, item.end - item.begin);
    } else {
      owned = read_text_file(input);
      text = owned;
    }
    bytes += text.size();
    const std::vector<std::string_view> docs = split_documents(text);
    for (size_t d = 0; d < docs.size(); ++d) {
      Split& s = splits[is_val(o.seed, input, item.first_document + d, o.val_fraction) ? 1 : 0];
      std::vector<int32_t> ids = start;
      const std::vector<int32_t> text_ids = tok.encode(docs[d]);
      ids.insert(ids.end(), text_ids.begin(), text_ids.end());
      if (!s.writer) {
        s.file = shard_name(s.name, w, s.next++);
        s.writer = std::make_unique<ShardWriter>(out.file(s.file), vocab, tok.hash(), eos);
      }
      s.writer->add_document(ids);
      if (&s == &splits[0]) {
        for (const int32_t t : ids) ++train_counts[static_cast<size_t>(t)];  // in range: add_document checked
        ++train_counts[static_cast<size_t>(eos)];
      }
      if (s.writer->tokens() >= o.shard_tokens) finish(s);
    }
    documents += docs.size();
  }
  for (Split& s : splits) {
    if (s.writer) finish(s);
  }
  nlohmann::json counts = nlohmann::json::array();  // sparse: id, count, id, count, ...
  for (size_t t = 0; t < train_counts.size(); ++t) {
    if (train_counts[t] != 0) {
      counts.push_back(t);
      counts.push_back(train_counts[t]);
    }
  }
  return {{"ok", true}, {"bytes", bytes}, {"documents", documents}, {"shards", shards}, {"train_counts", counts}};
}

// The child's whole life: never returns into the caller's code (a test runner, the CLI).
[[noreturn]] void child_main(int w, const Plan& plan, const Tokenizer& tok, const PrepareOptions& o,
                             const OutputDir& out) {
  int code = kExitOk;
  nlohmann::json result;
  try {
    result = run_worker(w, plan.workers[static_cast<size_t>(w)], plan, tok, o, out);
  } catch (const Error& e) {
    code = e.exit_code();
    result = {{"ok", false}, {"code", code}, {"message", e.what()}};
  } catch (const std::exception& e) {
    code = kExitFailure;
    result = {{"ok", false}, {"code", code}, {"message", e.what()}};
  }
  try {
    // Replacing invalid UTF-8 (a file name in a message, say) keeps dump() from throwing.
    write_file_atomic(out.file(result_name(w)), dump_json(result, -1, /*replace_invalid_utf8=*/true));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prepare worker %d: cannot report: %s\n", w, e.what());
    if (code == kExitOk) code = kExitIo;
  }
  ::_exit(code);
}

[[noreturn]] void rethrow_as(int code, const std::string& message) {
  switch (code) {
    case kExitConfig:
      throw ConfigError(message);
    case kExitData:
      throw DataError(message);
    case kExitIo:
      throw IoError(message);
    default:
      throw Error(message, kExitFailure);
  }
}

nlohmann::json read_result(const std::string& path) {
  const FileBytes text = try_read_file(path);
  if (!text) return nullptr;
  nlohmann::json j = parse_json(text.bytes);
  return j.is_discarded() || !j.is_object() ? nlohmann::json(nullptr) : j;
}

// Forks the workers and waits for all of them. When one fails, the rest are killed (their work
// is void anyway) and the first failure in worker order is thrown with the worker's message.
std::vector<nlohmann::json> run_workers(const Plan& plan, const Tokenizer& tok, const PrepareOptions& o,
                                        const OutputDir& out) {
  const int n = static_cast<int>(plan.workers.size());
  std::vector<pid_t> pids;
  std::vector<int> status(static_cast<size_t>(n), 0);
  std::vector<bool> done(static_cast<size_t>(n), false), killed(static_cast<size_t>(n), false);
  auto kill_and_reap = [&] {
    for (size_t k = 0; k < pids.size(); ++k) {
      if (done[k]) continue;
      ::kill(pids[k], SIGKILL);
      killed[k] = true;
      while (::waitpid(pids[k], &status[k], 0) < 0 && errno == EINTR) {
      }
      done[k] = true;
    }
  };
  std::fflush(nullptr);  // buffered output must not be written once per child
  for (int w = 0; w < n; ++w) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      kill_and_reap();
      throw IoError(fmt::format("cannot start worker {}: fork: {}", w, std::strerror(err)));
    }
    if (pid == 0) child_main(w, plan, tok, o, out);
    pids.push_back(pid);
  }
  bool failed = false;
  for (int remaining = n; remaining > 0 && !failed;) {
    bool progress = false;
    for (size_t k = 0; k < pids.size(); ++k) {
      if (done[k]) continue;
      const pid_t r = ::waitpid(pids[k], &status[k], WNOHANG);
      if (r == pids[k]) {
        done[k] = true;
        --remaining;
        progress = true;
        if (!WIFEXITED(status[k]) || WEXITSTATUS(status[k]) != 0) failed = true;
      } else if (r < 0 && errno != EINTR) {
        done[k] = true;  // not our child any more (reaped elsewhere); treated as a failure below
        status[k] = -1;
        --remaining;
        failed = true;
      }
    }
    if (!progress && !failed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (failed) kill_and_reap();

  std::vector<nlohmann::json> results;
  for (int w = 0; w < n; ++w) {
    const auto k = static_cast<size_t>(w);
    if (killed[k]) continue;  // stopped by us after another worker failed
    nlohmann::json r = read_result(out.file(result_name(w)));
    const int st = status[k];
    const bool exited_ok = st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (!r.is_null() && r.value("ok", false) == false && r.contains("message")) {
      rethrow_as(r.value("code", int{kExitFailure}), fmt::format("prepare worker {}: {}", w, r.value("message", "")));
    }
    if (!exited_ok || r.is_null()) {
      const std::string how = st < 0            ? "was lost"
                              : WIFSIGNALED(st) ? fmt::format("was killed by signal {}", WTERMSIG(st))
                              : WIFEXITED(st) && WEXITSTATUS(st) != 0
                                  ? fmt::format("exited with status {}", WEXITSTATUS(st))
                                  : "left no result file";
      rethrow_as(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0 ? WEXITSTATUS(st) : kExitFailure,
                 fmt::format("prepare worker {} {} (output {})", w, how, out.path()));
    }
    results.push_back(std::move(r));
  }
  if (failed)
    throw Error(fmt::format("prepare: a worker failed without a report (output {})", out.path()), kExitFailure);
  return results;
}

// The options' mistakes, before any work.
void check_options(const PrepareOptions& o) {
  if (o.inputs.empty()) throw ConfigError("prepare needs at least one --input");
  if (o.out.empty()) throw ConfigError("prepare needs --out DIR");
  if (o.workers < 1 || o.workers > 4096)
    throw ConfigError(fmt::format("--workers {}: must be in [1, 4096]", o.workers));
  if (!(o.val_fraction >= 0.0 && o.val_fraction <= 1.0)) {
    throw ConfigError(fmt::format("--val-fraction {}: must be in [0, 1]", o.val_fraction));
  }
  if (o.shard_tokens < 1) throw ConfigError("--shard-tokens must be at least 1");
}

// Entropy in nats of the distribution the counts (of `total`) describe.
double unigram_entropy(const std::vector<uint64_t>& counts, uint64_t total) {
  double entropy = 0.0;
  for (const uint64_t c : counts) {
    if (c != 0) {
      const double p = static_cast<double>(c) / static_cast<double>(total);
      entropy -= p * std::log(p);
    }
  }
  return entropy;
}

// The dataset's manifest from the workers' results, in worker order; their bytes and documents
// into stats.
DatasetManifest merge_results(const std::vector<nlohmann::json>& results, const Tokenizer& tok, const Plan& plan,
                              PrepareStats* stats) {
  DatasetManifest m;
  m.tokenizer_file = tok.file_name();
  m.tokenizer_hash = tok.hash();
  m.vocab_size = tok.vocab_size();
  m.eos_id = tok.eos_id();
  m.inputs = plan.inputs;
  std::vector<uint64_t> counts(static_cast<size_t>(tok.vocab_size()), 0);
  for (const nlohmann::json& r : results) {
    stats->bytes += r.at("bytes").get<uint64_t>();
    stats->documents += r.at("documents").get<uint64_t>();
    for (const auto& s : r.at("shards")) {
      SplitManifest& split = s.at("split").get<std::string>() == "train" ? m.train : m.val;
      ShardEntry e{s.at("file").get<std::string>(), s.at("tokens").get<uint64_t>(), s.at("documents").get<uint64_t>(),
                   s.at("checksum").get<uint64_t>()};
      split.tokens += e.tokens;
      split.documents += e.documents;
      split.shards.push_back(std::move(e));
    }
    const auto& c = r.at("train_counts");
    for (size_t i = 0; i + 1 < c.size(); i += 2) counts.at(c[i].get<size_t>()) += c[i + 1].get<uint64_t>();
  }
  m.unigram_entropy = m.train.tokens > 0 ? unigram_entropy(counts, m.train.tokens) : 0.0;
  return m;
}

}  // namespace

PrepareStats prepare(const PrepareOptions& o) {
  const double t0 = now_seconds();
  check_options(o);
  std::vector<std::string> inputs = expand_inputs(o.inputs);
  for (const std::string& in : inputs) {
    // Fail before any work for the common mistake; workers check content (empty, UTF-8).
    if (::access(in.c_str(), R_OK) != 0) throw DataError(fmt::format("cannot open {}: {}", in, std::strerror(errno)));
  }
  const Tokenizer tok(o.tokenizer);
  if (tok.eos_id() < 0) throw DataError(fmt::format("tokenizer {} has no EOS piece", o.tokenizer));
  if (tok.vocab_size() > (int64_t{1} << 31)) {
    throw DataError(fmt::format("tokenizer {}: vocabulary of {} does not fit shards", o.tokenizer, tok.vocab_size()));
  }
  // Copied from memory, so the copy is the model we loaded (the file may even be in `out`).
  const std::string model_bytes = read_tokenizer_file(o.tokenizer);
  if (XXH64(model_bytes.data(), model_bytes.size(), 0) != tok.hash()) {
    throw DataError(fmt::format("tokenizer {} changed while it was being read", o.tokenizer));
  }

  OutputDir out(o.out);
  try {
    const Plan plan = make_plan(o, std::move(inputs));
    const std::vector<nlohmann::json> results = run_workers(plan, tok, o, out);
    PrepareStats stats;
    const DatasetManifest m = merge_results(results, tok, plan, &stats);
    out.set_wrote_tokenizer(tok.file_name());
    write_file_atomic(out.file(tok.file_name()), model_bytes);
    for (size_t w = 0; w < plan.workers.size(); ++w) ::unlink(out.file(result_name(static_cast<int>(w))).c_str());
    write_manifest(out.path(), m);  // last: from here on the directory is a dataset

    stats.train_tokens = m.train.tokens;
    stats.val_tokens = m.val.tokens;
    stats.shards = static_cast<int>(m.train.shards.size() + m.val.shards.size());
    stats.seconds = now_seconds() - t0;
    return stats;
  } catch (...) {
    out.remove_ours();
    throw;
  }
}

}  // namespace tessera::data
