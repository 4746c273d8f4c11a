// prepare end to end on generated text with a tokenizer trained here: token counts equal direct
// tokenization plus one EOS per document, the split does not depend on the worker count, .zst
// equals plain, and every failure names its cause and leaves no dataset and no temporary file.
#include "data/prepare.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zstd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "data/dataset.h"
#include "data/hf_tokenizer_test_util.h"
#include "data/text.h"
#include "data/tokenizer.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using Doc = std::vector<int32_t>;
using DocSet = std::multiset<Doc>;

std::string corpus(int documents, uint32_t seed) {
  static const char* kWords[] = {"the", "and", "of",    "to",   "in",    "light", "water", "earth", "seed", "day",
                                 "was", "he",  "said",  "unto", "them",  "land",  "fruit", "night", "good", "made",
                                 "let", "be",  "there", "it",   "every", "after", "his",   "kind",  "form", "void"};
  std::mt19937 rng(seed);
  std::string text;
  for (int d = 0; d < documents; ++d) {
    const int lines = 1 + static_cast<int>(rng() % 4);
    for (int l = 0; l < lines; ++l) {
      const int words = 3 + static_cast<int>(rng() % 10);
      for (int w = 0; w < words; ++w) text += std::string(w ? " " : "") + kWords[rng() % std::size(kWords)];
      text += rng() % 3 ? ".\n" : fmt::format(", {} and {}.\n", rng() % 100, d);
    }
    text += d % 5 == 0 ? "\n \n\n" : "\n";
  }
  return text;
}

class PrepareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    shared_ = fs::path(::testing::TempDir()) / fmt::format("tessera_prepare_suite_{}", getpid());
    fs::remove_all(shared_);
    fs::create_directories(shared_);
    const std::string text = (shared_ / "tok.txt").string();
    std::ofstream(text) << corpus(80, 42);
    TokenizerTrainOptions o;
    o.inputs = {text};
    o.vocab_size = 300;
    o.out = (shared_ / "tok.model").string();
    o.threads = 1;
    train_tokenizer(o);
  }
  static void TearDownTestSuite() { fs::remove_all(shared_); }

  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        fmt::format("tessera_prepare_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string model() { return (shared_ / "tok.model").string(); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  PrepareOptions options(std::vector<std::string> inputs, const std::string& out, int workers,
                         double val_fraction = 0.2) const {
    PrepareOptions o;
    o.inputs = std::move(inputs);
    o.tokenizer = model();
    o.out = path(out);
    o.workers = workers;
    o.val_fraction = val_fraction;
    o.shard_tokens = 700;  // several shards per worker
    o.seed = 5;
    return o;
  }

  static fs::path shared_;
  fs::path dir_;
};

fs::path PrepareTest::shared_;

// The documents of a split, cut at EOS (the tokenizer never emits EOS inside text).
std::vector<Doc> split_docs(const std::string& dir, const std::string& split) {
  const TokenStream s(dir, split);
  std::vector<int32_t> tokens(s.size());
  s.read(0, tokens.size(), tokens.data());
  std::vector<Doc> docs;
  Doc cur;
  for (const int32_t t : tokens) {
    if (t == s.manifest().eos_id) {
      docs.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(t);
    }
  }
  EXPECT_TRUE(cur.empty()) << "the stream ends with EOS";
  return docs;
}

DocSet as_set(const std::vector<Doc>& docs) { return DocSet(docs.begin(), docs.end()); }

// Nothing that looks like a dataset or a leftover: no manifest, no shard, no temporary file.
void expect_no_dataset(const std::string& dir) {
  EXPECT_FALSE(fs::exists(dir + "/manifest.json"));
  if (!fs::exists(dir)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_FALSE(name.ends_with(".tmp") || name.ends_with(".bin") || name.starts_with(".worker") ||
                 name == "manifest.json")
        << "left behind: " << name;
  }
}

template <typename E>
std::string error_of(const PrepareOptions& o) {
  try {
    prepare(o);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return fmt::format("(wrong exception type: {})", e.what());
  }
  return "(no error)";
}

// With a tokenizer.json whose template puts a BOS first (Llama 3's), each document is BOS, its
// text's ids and EOS; the dataset keeps the file under its own name.
TEST_F(PrepareTest, TokenizerJsonDocumentsStartWithItsBos) {
  nlohmann::json j = test::tokenizer_json({" t", " th", " the", "an", "and"},
                                          {{" ", "t"}, {" t", "h"}, {" th", "e"}, {"a", "n"}, {"an", "d"}},
                                          test::llama3_pre_tokenizer());
  test::add_llama3_specials(j, 300);
  const std::string tok_path = write("tok.json", dump_json(j));
  const std::string text = corpus(30, 3);
  PrepareOptions o = options({write("a.txt", text)}, "ds", 2, 0.0);
  o.tokenizer = tok_path;
  prepare(o);
  const Tokenizer tok(tok_path);
  ASSERT_EQ(tok.document_start(), (std::vector<int32_t>{300}));
  std::vector<Doc> want;
  for (const std::string_view d : split_documents(text)) {
    want.push_back({300});
    const Doc ids = tok.encode(d);
    want.back().insert(want.back().end(), ids.begin(), ids.end());
  }
  const std::vector<Doc> got = split_docs(path("ds"), "train");
  EXPECT_EQ(as_set(got), as_set(want));
  const DatasetManifest m = read_manifest(path("ds"));
  EXPECT_EQ(m.tokenizer_file, "tokenizer.json");
  EXPECT_EQ(m.eos_id, 301);
  EXPECT_EQ(m.vocab_size, 302);
  EXPECT_EQ(read_tokenizer_file(path("ds/tokenizer.json")), read_tokenizer_file(tok_path));
  EXPECT_FALSE(fs::exists(path("ds/tokenizer.model")));
}

TEST_F(PrepareTest, TokenCountsMatchDirectTokenization) {
  const std::string a = write("a.txt", corpus(90, 1)), b = write("b.txt", corpus(40, 2));
  const PrepareStats stats = prepare(options({a, b}, "ds", 2));
  const std::string ds = path("ds");

  const Tokenizer tok(model());
  DocSet direct;
  uint64_t tokens = 0, documents = 0, bytes = 0;
  for (const std::string& in : {a, b}) {
    const std::string text = read_text_file(in);
    bytes += text.size();
    for (const std::string_view d : split_documents(text)) {
      direct.insert(tok.encode(d));
      tokens += tok.encode(d).size() + 1;
      ++documents;
    }
  }
  EXPECT_EQ(documents, 130u);
  EXPECT_EQ(stats.documents, documents);
  EXPECT_EQ(stats.bytes, bytes);
  EXPECT_EQ(stats.train_tokens + stats.val_tokens, tokens);
  EXPECT_GT(stats.val_tokens, 0u);
  EXPECT_GT(stats.train_tokens, stats.val_tokens);
  EXPECT_GT(stats.seconds, 0.0);

  const DatasetManifest m = read_manifest(ds);
  EXPECT_EQ(m.train.tokens, stats.train_tokens);
  EXPECT_EQ(m.val.tokens, stats.val_tokens);
  EXPECT_EQ(m.train.documents + m.val.documents, documents);
  EXPECT_EQ(m.tokenizer_hash, tok.hash());
  EXPECT_EQ(m.vocab_size, 300);
  EXPECT_EQ(m.eos_id, 2);
  EXPECT_EQ(m.inputs, (std::vector<std::string>{a, b}));
  EXPECT_EQ(stats.shards, static_cast<int>(m.train.shards.size() + m.val.shards.size()));
  EXPECT_GT(m.train.shards.size(), 2u);
  EXPECT_EQ(read_file(ds + "/" + m.tokenizer_file), read_file(model()));
  EXPECT_EQ(Tokenizer(ds + "/" + m.tokenizer_file).hash(), tok.hash());

  const std::vector<Doc> train = split_docs(ds, "train"), val = split_docs(ds, "val");
  EXPECT_EQ(train.size(), m.train.documents);
  EXPECT_EQ(val.size(), m.val.documents);
  DocSet all = as_set(train);
  all.insert(val.begin(), val.end());
  EXPECT_EQ(all, direct);

  // Entropy over the train stream, EOS included.
  std::map<int32_t, double> counts;
  double n = 0;
  for (const Doc& d : train) {
    for (const int32_t t : d) counts[t] += 1;
    counts[2] += 1;
    n += static_cast<double>(d.size() + 1);
  }
  double h = 0;
  for (const auto& [t, c] : counts) h -= c / n * std::log(c / n);
  EXPECT_NEAR(m.unigram_entropy, h, 1e-9);

  // Only the dataset is left in the directory.
  std::set<std::string> expected = {"manifest.json", "tokenizer.model"};
  for (const auto& s : m.train.shards) expected.insert(s.file);
  for (const auto& s : m.val.shards) expected.insert(s.file);
  std::set<std::string> present;
  for (const auto& e : fs::directory_iterator(ds)) present.insert(e.path().filename().string());
  EXPECT_EQ(present, expected);
}

TEST_F(PrepareTest, SplitDoesNotDependOnWorkerCount) {
  // One large input cut among workers, and several inputs dealt round-robin.
  const std::vector<std::vector<std::string>> input_sets = {
      {write("one.txt", corpus(150, 3))},
      {write("p0.txt", corpus(30, 4)), write("p1.txt", corpus(20, 5)), write("p2.txt", corpus(25, 6)),
       write("p3.txt", corpus(10, 7))},
  };
  for (size_t set = 0; set < input_sets.size(); ++set) {
    std::map<int, std::pair<DocSet, DocSet>> by_workers;
    for (const int workers : {1, 2, 3}) {
      const std::string out = fmt::format("ds-{}-{}", set, workers);
      prepare(options(input_sets[set], out, workers, 0.3));
      by_workers[workers] = {as_set(split_docs(path(out), "train")), as_set(split_docs(path(out), "val"))};
      const DatasetManifest m = read_manifest(path(out));
      // Every worker had work (inputs are cut when fewer than workers).
      bool last_worker_wrote = false;
      for (const auto& s : m.train.shards)
        last_worker_wrote |= s.file.starts_with(fmt::format("train-w{}-", workers - 1));
      EXPECT_TRUE(last_worker_wrote) << "set " << set << " workers " << workers;
    }
    EXPECT_FALSE(by_workers[1].second.empty());
    for (const int workers : {2, 3}) {
      EXPECT_EQ(by_workers[workers].first, by_workers[1].first) << "train, set " << set << ", workers " << workers;
      EXPECT_EQ(by_workers[workers].second, by_workers[1].second) << "val, set " << set << ", workers " << workers;
    }
  }
  // With one worker and one input the stream keeps document order.
  const Tokenizer tok(model());
  const std::string text = read_text_file(input_sets[0][0]);
  std::vector<Doc> in_order;
  for (const std::string_view d : split_documents(text)) in_order.push_back(tok.encode(d));
  prepare(options(input_sets[0], "ordered", 1, 0.0));
  EXPECT_EQ(split_docs(path("ordered"), "train"), in_order);
  EXPECT_TRUE(split_docs(path("ordered"), "val").empty());
}

TEST_F(PrepareTest, ZstInputGivesTheSameTokens) {
  const std::string text = corpus(60, 8);
  std::string z(ZSTD_compressBound(text.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), text.data(), text.size(), 3));
  const std::string plain = write("c.txt", text), compressed = write("c.txt.zst", z);
  const PrepareStats sp = prepare(options({plain}, "plain", 1, 0.0));
  const PrepareStats sz = prepare(options({compressed}, "zst", 2, 0.0));
  EXPECT_EQ(sz.bytes, text.size());
  EXPECT_EQ(sz.train_tokens, sp.train_tokens);
  EXPECT_EQ(split_docs(path("zst"), "train"), split_docs(path("plain"), "train"));
}

TEST_F(PrepareTest, GlobsExpandInOrderAndUnmatchedGlobsAreNamed) {
  fs::create_directories(path("in"));
  write("in/part-2.txt", corpus(5, 9));
  write("in/part-1.txt", corpus(5, 10));
  write("in/other.md", corpus(5, 11));
  prepare(options({path("in/part-*.txt")}, "ds", 1));
  EXPECT_EQ(read_manifest(path("ds")).inputs, (std::vector<std::string>{path("in/part-1.txt"), path("in/part-2.txt")}));
  const std::string msg = error_of<DataError>(options({path("in/part-*.txt"), path("in/*.json")}, "none", 1));
  EXPECT_NE(msg.find(path("in/*.json")), std::string::npos) << msg;
  expect_no_dataset(path("none"));
}

TEST_F(PrepareTest, FailuresNameTheCauseAndLeaveNoDataset) {
  const std::string good = write("good.txt", corpus(20, 12));
  const std::string empty = write("empty.txt", "");
  const std::string blank = write("blank.txt", "\n   \n");
  const std::string bad_utf8 = write("bad.txt", corpus(10, 13) + "caf\xC3\n\n" + corpus(10, 14));
  const std::string missing = path("missing.txt");

  struct Case {
    const char* what;
    std::vector<std::string> inputs;
    int workers;
    std::string expect;  // in the message
  };
  const Case cases[] = {
      {"missing input", {good, missing}, 1, missing},
      {"empty input, parent", {empty}, 1, empty + " is empty"},
      {"empty input, worker 1", {good, empty}, 2, empty + " is empty"},
      {"blank input", {good, blank}, 2, blank + " is empty"},
      {"invalid UTF-8, one worker", {bad_utf8}, 1, bad_utf8 + ": invalid UTF-8 at byte"},
      {"invalid UTF-8, cut input", {bad_utf8}, 3, bad_utf8 + ": invalid UTF-8 at byte"},
      {"invalid UTF-8, worker 2", {good, good, bad_utf8}, 3, bad_utf8 + ": invalid UTF-8"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of<DataError>(options(c.inputs, "ds", c.workers));
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    expect_no_dataset(path("ds"));
  }

  // Tokenizer: garbage, missing.
  PrepareOptions o = options({good}, "ds", 2);
  o.tokenizer = write("garbage.model", "definitely not a protobuf \x01\x02\x03");
  EXPECT_NE(error_of<DataError>(o).find(o.tokenizer), std::string::npos);
  expect_no_dataset(path("ds"));
  o.tokenizer = path("none.model");
  EXPECT_NE(error_of<DataError>(o).find(o.tokenizer), std::string::npos);
  expect_no_dataset(path("ds"));

  // Output under a regular file cannot be created.
  const std::string under_file = error_of<IoError>(options({good}, "good.txt/ds", 1));
  EXPECT_NE(under_file.find(path("good.txt/ds")), std::string::npos) << under_file;
  EXPECT_FALSE(fs::exists(path("good.txt/ds")));

  // A failed run over an existing dataset removes it (its manifest first) and leaves no debris.
  prepare(options({good}, "ds", 2));
  ASSERT_TRUE(fs::exists(path("ds/manifest.json")));
  const std::string msg = error_of<DataError>(options({good, good, bad_utf8}, "ds", 3));
  EXPECT_NE(msg.find("worker 2"), std::string::npos) << msg;
  expect_no_dataset(path("ds"));
  // And a later good run into the same directory works.
  prepare(options({good}, "ds", 1));
  EXPECT_EQ(split_docs(path("ds"), "train").size() + split_docs(path("ds"), "val").size(), 20u);

  // Bad options are configuration errors.
  o = options({good}, "cfg", 0);
  EXPECT_THROW(prepare(o), ConfigError);
  o = options({good}, "cfg", 1, 1.5);
  EXPECT_THROW(prepare(o), ConfigError);
  expect_no_dataset(path("cfg"));
}

}  // namespace
}  // namespace tessera::data
