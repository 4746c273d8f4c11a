// Fuzzes the safetensors index reader of import_hf: the input is model.safetensors.index.json in
// a directory holding a small model's config.json and its weights split into three files (written
// once per process). The files hold one model, so an accepted index must import exactly that
// model, whatever names it gives. Each input is tried as the file and as a recipe for a weight_map
// that places the model's tensors in its files, in other files of the directory, outside it, or
// nowhere, which byte mutations of JSON text rarely reach.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/hf.h"
#include "core/file_io.h"
#include "core/json.h"
#include "harness.h"
#include "hf_fixture.h"

namespace tessera::fuzz {
namespace {

using nlohmann::ordered_json;
using namespace std::string_view_literals;

struct Fixture {
  std::string dir;                               // config.json, three weight files, the index
  ordered_json index;                            // as export_hf wrote it
  std::vector<std::string> files;                // the weight files, in the index's order
  std::vector<checkpoint::NamedTensor> tensors;  // what importing the directory gives
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    out.dir = scratch_dir() + "/model";
    checkpoint::HfExportOptions o;
    o.max_shard_bytes = 2048;  // 4.9 kB of weights: three files
    export_hf_fixture(out.dir, o);
    out.index = parse_ordered_json_or_throw(read_file(out.dir + "/model.safetensors.index.json"));
    for (const auto& [tensor, file] : out.index["weight_map"].items()) {
      if (std::find(out.files.begin(), out.files.end(), file) == out.files.end()) out.files.push_back(file);
    }
    if (out.files.size() != 3) finding("the fixture's export is not three files");
    out.tensors = checkpoint::import_hf(out.dir).tensors;
    return out;
  }();
  return f;
}

void check(const std::string& index_text) {
  const Fixture& f = fixture();
  write_input("model/model.safetensors.index.json", reinterpret_cast<const uint8_t*>(index_text.data()),
              index_text.size());
  checkpoint::HfModel m;
  if (!parses([&] { m = checkpoint::import_hf(f.dir); })) return;
  check_same_tensors(m.tensors, f.tensors);
}

std::string recipe_index(FuzzedDataProvider& p) {
  const Fixture& f = fixture();
  // clang-format off
  static constexpr std::string_view kNames[] = {
      "model.safetensors", "config.json", "model.safetensors.index.json", "", ".", "..", "../model/config.json",
      "/dev/zero", "a/b", "missing.safetensors", "model-00001-of-00003.safetensors\0x"sv};
  static const char* const kExtraTensors[] = {
      "model.layers.2.mlp.up_proj.weight", "lm_head.bias", "model.layers.0.self_attn.rotary_emb.inv_freq", ""};
  // clang-format on
  ordered_json weight_map = ordered_json::object();
  for (const auto& [tensor, file] : f.index["weight_map"].items()) {
    switch (p.ConsumeIntegralInRange(0, 15)) {
      case 0:  // nowhere
        break;
      case 1:  // another file of the model
        weight_map[tensor] = f.files[p.ConsumeIntegralInRange<size_t>(0, f.files.size() - 1)];
        break;
      case 2:                                                          // not a weight file, or not in the directory
        weight_map[tensor] = std::string(p.PickValueInArray(kNames));  // string_view: keeps the NUL
        break;
      case 3:  // not a name
        weight_map[tensor] = p.ConsumeBool() ? ordered_json(p.ConsumeIntegral<int64_t>()) : ordered_json();
        break;
      default:
        weight_map[tensor] = file;
    }
  }
  for (int i = 0, n = p.ConsumeIntegralInRange(0, 7) == 0 ? 1 : 0; i < n; ++i) {
    weight_map[p.PickValueInArray(kExtraTensors)] = f.files[p.ConsumeIntegralInRange<size_t>(0, f.files.size() - 1)];
  }
  ordered_json index = f.index;
  index["weight_map"] = weight_map;
  switch (p.ConsumeIntegralInRange(0, 15)) {
    case 0:
      index["weight_map"] = ordered_json::array();
      break;
    case 1:
      index.erase("weight_map");
      break;
    case 2:
      index["metadata"]["total_size"] = p.ConsumeIntegral<uint64_t>();
      break;
    default:
      break;
  }
  return dump_json(index, 2);
}

}  // namespace

void write_seeds(const std::string& dir) {
  const Fixture& f = fixture();
  std::ofstream(dir + "/index.json", std::ios::binary) << read_file(f.dir + "/model.safetensors.index.json");
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::check(std::string(reinterpret_cast<const char*>(data), size));
  FuzzedDataProvider provider(data, size);
  fuzz::check(fuzz::recipe_index(provider));
  return 0;
}
