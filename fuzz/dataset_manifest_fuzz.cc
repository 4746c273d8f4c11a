// Fuzzes read_manifest and TokenStream: the input is a dataset's manifest.json beside three valid
// shards (written once per process), so accepted manifests go on to open, check and read them.
// Each input is tried as the file and as a recipe for a well-formed manifest whose names, counts
// and checksums are the fixture's or edge cases near them, which byte mutations rarely reach.
#include <fmt/format.h>
#include <fuzzer/FuzzedDataProvider.h>

#include <climits>
#include <fstream>
#include <optional>
#include <vector>

#include "core/file_io.h"
#include "core/json.h"
#include "data/dataset.h"
#include "harness.h"

namespace tessera::fuzz {
namespace {

constexpr uint32_t kVocab = 500;
constexpr uint64_t kTokenizerHash = 0x0123456789abcdefu;

struct Fixture {
  std::vector<data::ShardEntry> train, val;
};

// The shards every manifest may point at, in scratch_dir().
const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    auto make = [](const std::string& file, int32_t first, int documents) {
      data::ShardWriter w(scratch_dir() + "/" + file, kVocab, kTokenizerHash, 0);
      for (int d = 0; d < documents; ++d) {
        std::vector<int32_t> doc;
        for (int i = 0; i <= d; ++i) doc.push_back((first + 37 * d + i) % static_cast<int32_t>(kVocab));
        w.add_document(doc);
      }
      const data::ShardInfo info = w.finish();
      return data::ShardEntry{file, info.tokens, info.documents, info.payload_checksum};
    };
    out.train = {make("train-00000.bin", 1, 3), make("train-00001.bin", 100, 2)};
    out.val = {make("val-00000.bin", 7, 1)};
    return out;
  }();
  return f;
}

data::SplitManifest split(const std::vector<data::ShardEntry>& shards) {
  data::SplitManifest s;
  s.shards = shards;
  for (const data::ShardEntry& e : shards) s.tokens += e.tokens, s.documents += e.documents;
  return s;
}

void check_stream(const std::string& split) {
  std::optional<data::TokenStream> stream;
  if (!parses([&] { stream.emplace(scratch_dir(), split); })) return;
  std::vector<int32_t> tokens(stream->size());  // bounded by the fixture's shards
  stream->read(0, tokens.size(), tokens.data());
  for (const int32_t t : tokens) FUZZ_CHECK(t >= 0 && t < stream->manifest().vocab_size);
}

void check_manifest() {
  data::DatasetManifest m;
  if (!parses([&] { m = data::read_manifest(scratch_dir()); })) return;
  for (const data::SplitManifest* s : {&m.train, &m.val}) {  // the totals are the true sums
    uint64_t tokens = 0, documents = 0;
    for (const data::ShardEntry& e : s->shards) {
      FUZZ_CHECK(!__builtin_add_overflow(tokens, e.tokens, &tokens));
      FUZZ_CHECK(!__builtin_add_overflow(documents, e.documents, &documents));
    }
    FUZZ_CHECK(tokens == s->tokens && documents == s->documents);
  }
  check_stream("train");
  check_stream("val");
}

// The fixture's value, one off, or an edge case.
uint64_t near(FuzzedDataProvider& p, uint64_t real) {
  // clang-format off
  static constexpr uint64_t kEdges[] = {0, 1, uint64_t{1} << 31, uint64_t{1} << 32, uint64_t{1} << 63, ~uint64_t{0}};
  // clang-format on
  switch (p.ConsumeIntegralInRange(0, 5)) {
    case 0:
      return real + 1;
    case 1:
      return real - 1;
    case 2:
      return ~uint64_t{0} - real + 1;  // with `real` more, wraps to 0
    case 3:
      return p.PickValueInArray(kEdges);
    default:
      return real;
  }
}

nlohmann::ordered_json recipe_split(FuzzedDataProvider& p, const Fixture& f) {
  static constexpr const char* kFiles[] = {"manifest.json", "missing.bin", "..", "a/b", ""};
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  uint64_t tokens = 0, documents = 0;
  for (int i = 0, n = p.ConsumeIntegralInRange(0, 4); i < n; ++i) {
    const auto& pool = p.ConsumeBool() ? f.train : f.val;
    const data::ShardEntry& e = pool[p.ConsumeIntegralInRange<size_t>(0, pool.size() - 1)];
    const uint64_t t = near(p, e.tokens), d = near(p, e.documents);
    tokens += t;  // wraps on purpose
    documents += d;
    shards.push_back({{"file", p.ConsumeIntegralInRange(0, 7) != 0 ? e.file : p.PickValueInArray(kFiles)},
                      {"tokens", t},
                      {"documents", d},
                      {"checksum", fmt::format("{:016x}", p.ConsumeBool() ? e.checksum : near(p, e.checksum))}});
  }
  return {{"tokens", p.ConsumeBool() ? tokens : near(p, tokens)},
          {"documents", p.ConsumeBool() ? documents : near(p, documents)},
          {"shards", shards}};
}

std::string recipe_manifest(FuzzedDataProvider& p) {
  const Fixture& f = fixture();
  // clang-format off
  static constexpr int64_t kSigned[] = {0, 1, -1, kVocab - 1, kVocab, kVocab + 1, int64_t{1} << 16,
                                        (int64_t{1} << 31) - 1, int64_t{1} << 31, (int64_t{1} << 31) + 1, INT64_MAX};
  // clang-format on
  const int64_t vocab = p.ConsumeBool() ? int64_t{kVocab} : p.PickValueInArray(kSigned);
  const int64_t eos = p.ConsumeBool() ? 0 : p.PickValueInArray(kSigned);
  const nlohmann::ordered_json m = {
      {"format", "tessera-dataset"},
      {"version", p.ConsumeIntegralInRange(0, 7) != 0 ? 1 : p.ConsumeIntegral<int64_t>()},
      {"tokenizer",
       {{"file", "tokenizer.model"},
        {"hash", fmt::format("{:016x}", p.ConsumeBool() ? kTokenizerHash : near(p, kTokenizerHash))},
        {"vocab_size", vocab},
        {"eos_id", eos}}},
      {"splits", {{"train", recipe_split(p, f)}, {"val", recipe_split(p, f)}}},
      {"inputs", nlohmann::ordered_json::array()},
      {"unigram_entropy_nats", 5.25},
  };
  return dump_json(m);
}

}  // namespace

void write_seeds(const std::string& dir) {
  const Fixture& f = fixture();
  data::DatasetManifest m;
  m.tokenizer_file = "tokenizer.model";
  m.tokenizer_hash = kTokenizerHash;
  m.vocab_size = kVocab;
  m.eos_id = 0;
  m.train = split(f.train);
  m.val = split(f.val);
  m.inputs = {"corpus/a.txt", "corpus/b.txt"};
  m.unigram_entropy = 5.25;
  data::write_manifest(scratch_dir(), m);
  std::ofstream(dir + "/full.json", std::ios::binary) << read_file(scratch_dir() + "/manifest.json");
  m.val = split({});
  m.train = split({f.train[1]});
  m.inputs.clear();
  data::write_manifest(scratch_dir(), m);
  std::ofstream(dir + "/no-val.json", std::ios::binary) << read_file(scratch_dir() + "/manifest.json");
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::fixture();
  fuzz::write_input("manifest.json", data, size);
  fuzz::check_manifest();
  FuzzedDataProvider provider(data, size);
  const std::string recipe = fuzz::recipe_manifest(provider);
  fuzz::write_input("manifest.json", reinterpret_cast<const uint8_t*>(recipe.data()), recipe.size());
  fuzz::check_manifest();
  return 0;
}
