// Fuzzes read_manifest and TokenStream: the input is a dataset's manifest.json beside three valid
// shards (written once per process), so accepted manifests go on to open, check and read them.
#include <fstream>
#include <optional>
#include <vector>

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
  if (!fuzz::parses([] { data::read_manifest(fuzz::scratch_dir()); })) return 0;
  fuzz::check_stream("train");
  fuzz::check_stream("val");
  return 0;
}
