// The Hugging Face fixture model of hf_fixture.h.
#include "hf_fixture.h"

#include <cstring>

#include "harness.h"
#include "model/layout.h"

namespace tessera::fuzz {

model::ModelConfig hf_fixture_config() {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.dim = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn_hidden = 12;
  c.seq_len = 16;
  c.rope_theta = 500000.0;
  c.norm_eps = 1e-5;
  return c;
}

void export_hf_fixture(const std::string& dir, const checkpoint::HfExportOptions& options) {
  const model::ModelConfig c = hf_fixture_config();
  std::vector<model::NamedTensor> tensors;
  const model::ModelLayout layout(c);
  for (const model::UnitLayout& u : layout.units()) {
    for (const model::TensorSpec& s : u.tensors) {
      model::NamedTensor t{s.name, s.shape, std::vector<float>(s.numel())};
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = 0.01f * static_cast<float>(tensors.size() * 100 + i);
      tensors.push_back(std::move(t));
    }
  }
  checkpoint::export_hf(c, tensors, "fixture", dir, options);
}

void check_same_tensors(const std::vector<model::NamedTensor>& got, const std::vector<model::NamedTensor>& want) {
  FUZZ_CHECK(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const model::NamedTensor &t = got[i], &w = want[i];
    FUZZ_CHECK(t.name == w.name && t.shape == w.shape && t.data.size() == w.data.size());
    FUZZ_CHECK(std::memcmp(t.data.data(), w.data.data(), t.data.size() * sizeof(float)) == 0);
  }
}

}  // namespace tessera::fuzz
