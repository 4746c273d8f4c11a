// The small Llama the Hugging Face import targets (hf_config, hf_index) export once per process
// and import back: two blocks, grouped-query attention, every weight a distinct value.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/hf.h"
#include "model/model_config.h"

namespace tessera::fuzz {

model::ModelConfig hf_fixture_config();

// Exports the fixture model into `dir` with `options` (bos/eos ids, the shard size).
void export_hf_fixture(const std::string& dir, const checkpoint::HfExportOptions& options);

// A finding unless `got` holds exactly `want`'s tensors: names, shapes and bits.
void check_same_tensors(const std::vector<model::NamedTensor>& got, const std::vector<model::NamedTensor>& want);

}  // namespace tessera::fuzz
