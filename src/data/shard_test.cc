// Shards and token streams: exact round trips at both token widths, every kind of damage rejected
// with the file named, no file from an unfinished writer, and streams across shard boundaries
// that refuse a shard the manifest does not describe.
#include "data/shard.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "data/dataset.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kEos = 2;

class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        fmt::format("tessera_shard_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<std::vector<int32_t>> random_documents(int n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(rng() % 50);  // empty documents too
    for (auto& t : d) t = static_cast<int32_t>(rng() % vocab);
  }
  return docs;
}

// Writes the documents; returns the expected token stream (each document followed by EOS).
std::vector<int32_t> write_shard(const std::string& path, uint32_t vocab, const std::vector<std::vector<int32_t>>& docs,
                                 ShardInfo* info = nullptr) {
  ShardWriter w(path, vocab, 0x1234abcd5678ef00ull, kEos);
  std::vector<int32_t> expected;
  for (const auto& d : docs) {
    w.add_document(d);
    expected.insert(expected.end(), d.begin(), d.end());
    expected.push_back(kEos);
  }
  EXPECT_EQ(w.tokens(), expected.size());
  const ShardInfo i = w.finish();
  if (info) *info = i;
  return expected;
}

void dump(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string open_error(const std::string& path) {
  try {
    Shard::open(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

// Rewrites the header checksum so that a test reaches the check after it.
void reseal_header(std::string& bytes) {
  const uint64_t sum = XXH64(bytes.data(), 56, 0);
  std::memcpy(bytes.data() + 56, &sum, 8);
}

TEST_F(ShardTest, RoundTripAtBothTokenWidths) {
  for (const uint32_t vocab : {300u, 65536u, 65537u, 1u << 20}) {
    const std::string p = path(fmt::format("rt-{}.bin", vocab));
    const auto docs = random_documents(200, vocab, vocab);
    ShardInfo written;
    const std::vector<int32_t> expected = write_shard(p, vocab, docs, &written);
    const uint32_t width = vocab <= 65536 ? 2 : 4;
    EXPECT_EQ(fs::file_size(p), kShardHeaderBytes + expected.size() * width);
    EXPECT_FALSE(fs::exists(p + ".tmp"));

    const Shard s = Shard::open(p);
    EXPECT_EQ(s.path(), p);
    EXPECT_EQ(s.info().token_bytes, width);
    EXPECT_EQ(s.info().vocab_size, vocab);
    EXPECT_EQ(s.info().tokens, expected.size());
    EXPECT_EQ(s.info().documents, docs.size());
    EXPECT_EQ(s.info().tokenizer_hash, 0x1234abcd5678ef00ull);
    EXPECT_EQ(s.info().payload_checksum, written.payload_checksum);
    std::vector<int32_t> got(expected.size());
    s.read(0, got.size(), got.data());
    EXPECT_EQ(got, expected);
    std::vector<int32_t> part(17);
    s.read(101, part.size(), part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), expected.begin() + 101));

    // The header is exactly the documented layout.
    const std::string bytes = read_file(p);
    EXPECT_EQ(bytes.substr(0, 8), "TSRATOKS");
    uint32_t u32[4];
    uint64_t u64[5];
    std::memcpy(u32, bytes.data() + 8, 16);
    std::memcpy(u64, bytes.data() + 24, 40);
    EXPECT_EQ(u32[0], 1u);
    EXPECT_EQ(u32[1], width);
    EXPECT_EQ(u32[2], vocab);
    EXPECT_EQ(u32[3], 0u);
    EXPECT_EQ(u64[0], expected.size());
    EXPECT_EQ(u64[1], docs.size());
    EXPECT_EQ(u64[2], 0x1234abcd5678ef00ull);
    EXPECT_EQ(u64[3], XXH64(bytes.data() + 64, bytes.size() - 64, 0));
    EXPECT_EQ(u64[4], XXH64(bytes.data(), 56, 0));
  }
  // A shard with no documents is valid and empty.
  ShardWriter empty(path("empty.bin"), 300, 0, kEos);
  EXPECT_EQ(empty.finish().tokens, 0u);
  EXPECT_EQ(Shard::open(path("empty.bin")).info().tokens, 0u);
}

TEST_F(ShardTest, LargeShardCrossesTheWriterBuffer) {
  std::vector<std::vector<int32_t>> docs(3, std::vector<int32_t>(700000));
  for (size_t d = 0; d < docs.size(); ++d) {
    for (size_t i = 0; i < docs[d].size(); ++i) docs[d][i] = static_cast<int32_t>((i * 7 + d) % 50000);
  }
  const auto expected = write_shard(path("big.bin"), 50000, docs);
  const Shard s = Shard::open(path("big.bin"));
  std::vector<int32_t> got(expected.size());
  s.read(0, got.size(), got.data());
  EXPECT_EQ(got, expected);
}

TEST_F(ShardTest, DamageIsRejectedWithTheFileNamed) {
  const std::string good = path("good.bin");
  write_shard(good, 1000, random_documents(50, 1000, 3));
  const std::string original = read_file(good);
  const std::string p = path("bad.bin");
  auto expect_rejected = [&](const std::string& bytes, const std::string& what) {
    dump(p, bytes);
    const std::string msg = open_error(p);
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "want \"" << what << "\" in: " << msg;
  };
  std::string b = original;
  b[64 + 37] ^= 0x10;
  expect_rejected(b, "payload checksum");
  b = original;
  b[30] ^= 0x01;  // token count
  expect_rejected(b, "header checksum");
  b = original;
  b[50] ^= 0x80;  // the stored payload checksum itself
  expect_rejected(b, "header checksum");
  expect_rejected(original.substr(0, original.size() - 1), "truncated");
  expect_rejected(original.substr(0, original.size() - 2), "truncated");
  expect_rejected(original + "xx", "truncated or padded");
  expect_rejected(original.substr(0, 40), "shorter than the 64-byte header");
  expect_rejected("", "shorter than the 64-byte header");
  b = original;
  b[0] = 'X';
  expect_rejected(b, "bad magic");
  b = original;
  b[8] = 2;  // version 2
  expect_rejected(b, "version 2");
  reseal_header(b);
  expect_rejected(b, "version 2");
  b = original;
  b[12] = 3;  // 3-byte tokens
  reseal_header(b);
  expect_rejected(b, "token bytes 3");
  b = original;
  const uint32_t small_vocab = 10;  // checksums intact, but ids beyond the vocabulary
  std::memcpy(b.data() + 16, &small_vocab, 4);
  reseal_header(b);
  expect_rejected(b, "outside the vocabulary");
  b = original;
  const uint64_t huge_tokens = uint64_t{1} << 62;  // must not allocate or overflow
  std::memcpy(b.data() + 24, &huge_tokens, 8);
  reseal_header(b);
  expect_rejected(b, "truncated or padded");
  EXPECT_NE(open_error(path("missing.bin")).find(path("missing.bin")), std::string::npos);
  EXPECT_NO_THROW(Shard::open(good));
}

TEST_F(ShardTest, EveryBitFlipAndTruncationIsRejected) {
  const std::string good = path("small.bin");
  write_shard(good, 70000, {{5, 69999, 123, 65536}, {}, {7, 8}});  // 4-byte tokens
  const std::string original = read_file(good);
  const std::string p = path("flipped.bin");
  for (size_t i = 0; i < original.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string b = original;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      dump(p, b);
      ASSERT_THROW(Shard::open(p), DataError) << "byte " << i << " bit " << bit;
    }
  }
  for (size_t n = 0; n < original.size(); ++n) {
    dump(p, original.substr(0, n));
    ASSERT_THROW(Shard::open(p), DataError) << "truncated to " << n;
  }
}

TEST_F(ShardTest, UnfinishedWriterLeavesNoFile) {
  const std::string p = path("unfinished.bin");
  {
    ShardWriter w(p, 1000, 0, kEos);
    w.add_document(std::vector<int32_t>(3000000, 5));  // past the flush size: bytes were on disk
    EXPECT_TRUE(fs::exists(p + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  {
    ShardWriter w(p, 1000, 0, kEos);
    EXPECT_THROW(w.add_document(std::vector<int32_t>{1, 2, 1000}), DataError);
    EXPECT_THROW(w.add_document(std::vector<int32_t>{-1}), DataError);
    w.add_document(std::vector<int32_t>{7});
    EXPECT_EQ(w.tokens(), 2u);  // rejected documents left nothing behind
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_THROW(ShardWriter(path("no/such/dir/x.bin"), 1000, 0, kEos), IoError);
}

// A dataset directory by hand: shards of uneven sizes (one empty) and a manifest.
struct HandDataset {
  std::vector<int32_t> train;  // the expected train stream
  DatasetManifest manifest;
};

HandDataset make_dataset(const std::string& dir) {
  HandDataset h;
  h.manifest.tokenizer_file = "tokenizer.model";
  h.manifest.tokenizer_hash = 0x1234abcd5678ef00ull;
  h.manifest.vocab_size = 1000;
  h.manifest.eos_id = kEos;
  h.manifest.inputs = {"a.txt", "b.txt"};
  h.manifest.unigram_entropy = 4.25;
  const int sizes[] = {7, 0, 1, 30, 3};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const std::string file = fmt::format("train-w{}-{:05}.bin", i, 0);
    ShardInfo info;
    const auto docs = random_documents(sizes[i], 1000, static_cast<uint32_t>(i) + 10);
    const auto tokens = write_shard(dir + "/" + file, 1000, docs, &info);
    h.train.insert(h.train.end(), tokens.begin(), tokens.end());
    h.manifest.train.shards.push_back({file, info.tokens, info.documents, info.payload_checksum});
    h.manifest.train.tokens += info.tokens;
    h.manifest.train.documents += info.documents;
  }
  write_manifest(dir, h.manifest);
  return h;
}

TEST_F(ShardTest, TokenStreamReadsAcrossShardBoundaries) {
  const HandDataset h = make_dataset(dir_.string());
  const DatasetManifest m = read_manifest(dir_.string());
  EXPECT_EQ(m.tokenizer_hash, h.manifest.tokenizer_hash);
  EXPECT_EQ(m.vocab_size, 1000);
  EXPECT_EQ(m.eos_id, kEos);
  EXPECT_EQ(m.inputs, h.manifest.inputs);
  EXPECT_EQ(m.unigram_entropy, 4.25);
  ASSERT_EQ(m.train.shards.size(), 5u);
  EXPECT_EQ(m.train.shards[3].checksum, h.manifest.train.shards[3].checksum);
  EXPECT_TRUE(m.val.shards.empty());
  EXPECT_FALSE(fs::exists(path("manifest.json.tmp")));

  const TokenStream train(dir_.string(), "train");
  ASSERT_EQ(train.size(), h.train.size());
  const uint64_t n = train.size();
  std::vector<int32_t> got;
  for (uint64_t begin = 0; begin <= n; begin += 3) {
    for (const uint64_t len : {uint64_t{0}, uint64_t{1}, uint64_t{5}, uint64_t{64}, n}) {
      const uint64_t take = std::min(len, n - begin);
      got.assign(take, -1);
      train.read(begin, take, got.data());
      ASSERT_TRUE(std::equal(got.begin(), got.end(), h.train.begin() + static_cast<int64_t>(begin)))
          << "begin " << begin << " n " << take;
    }
  }
  const TokenStream val(dir_.string(), "val");
  EXPECT_EQ(val.size(), 0u);
  EXPECT_THROW(TokenStream(dir_.string(), "test"), ConfigError);
}

TEST_F(ShardTest, TokenStreamRejectsShardsTheManifestDoesNotDescribe) {
  HandDataset h = make_dataset(dir_.string());
  auto stream_error = [&] {
    try {
      TokenStream s(dir_.string(), "train");
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // A shard replaced by another valid shard: its own checksums hold, the manifest's does not.
  const std::string victim = path(h.manifest.train.shards[3].file);
  const std::string saved = read_file(victim);
  write_shard(victim, 1000, random_documents(30, 1000, 99));
  std::string msg = stream_error();
  EXPECT_NE(msg.find(victim), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("disagrees with"), std::string::npos) << msg;
  dump(victim, saved);
  EXPECT_EQ(stream_error(), "(no error)");

  // A corrupt shard is named.
  std::string bad = saved;
  bad[70] ^= 1;
  dump(victim, bad);
  msg = stream_error();
  EXPECT_NE(msg.find(victim), std::string::npos) << msg;
  dump(victim, saved);

  // Another tokenizer's shards do not belong.
  h.manifest.tokenizer_hash ^= 1;
  write_manifest(dir_.string(), h.manifest);
  EXPECT_NE(stream_error().find("tokenizer hash"), std::string::npos);
  h.manifest.tokenizer_hash ^= 1;

  // A manifest whose counts do not add up, or that points outside the directory.
  h.manifest.train.tokens += 1;
  write_manifest(dir_.string(), h.manifest);
  EXPECT_NE(stream_error().find("splits.train.tokens"), std::string::npos) << stream_error();
  h.manifest.train.tokens -= 1;
  {  // counts that add up only modulo 2^64
    const SplitManifest train = h.manifest.train;
    ShardEntry wrap = train.shards[0];
    wrap.tokens = UINT64_MAX;
    h.manifest.train.shards.push_back(wrap);
    h.manifest.train.tokens -= 1;
    h.manifest.train.documents += wrap.documents;
    write_manifest(dir_.string(), h.manifest);
    msg = stream_error();
    EXPECT_NE(msg.find(fmt::format("splits.train.shards[{}].tokens", train.shards.size())), std::string::npos) << msg;
    EXPECT_NE(msg.find("more than 2^64"), std::string::npos) << msg;
    h.manifest.train = train;
  }
  h.manifest.train.shards[0].file = "../escape.bin";
  write_manifest(dir_.string(), h.manifest);
  EXPECT_NE(stream_error().find("splits.train.shards[0].file"), std::string::npos) << stream_error();

  // Missing and malformed manifests name the file and key.
  dump(path("manifest.json"), "{\"format\": \"tessera-dataset\", \"version\": 1}");
  msg = stream_error();
  EXPECT_NE(msg.find(path("manifest.json") + ": tokenizer is missing"), std::string::npos) << msg;
  dump(path("manifest.json"), "{not json");
  EXPECT_NE(stream_error().find("not valid JSON"), std::string::npos);
  fs::remove(path("manifest.json"));
  EXPECT_NE(stream_error().find(path("manifest.json")), std::string::npos);
}

}  // namespace
}  // namespace tessera::data
