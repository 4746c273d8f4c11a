// Hugging Face safetensors files (8-byte little-endian header length, JSON header, raw data):
// an atomic writer and a bounds-checked reader that never trusts a size it has not checked
// against the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/named_tensor.h"

namespace tessera::checkpoint {

using model::NamedTensor;  // the model's tensors by name

// How write_safetensors stores the tensors: as they are (F32), or each value rounded to the
// nearest bf16, ties to even (BF16: half the bytes; what read_safetensors widens back is exactly
// the rounded value).
enum class StoredDtype { kF32, kBF16 };

// Bytes of one stored element.
inline uint64_t stored_bytes(StoredDtype dtype) { return dtype == StoredDtype::kBF16 ? 2 : 4; }

// Writes the tensors to `path` through a temporary file that is fsynced and renamed, so a crash
// leaves either the old file or the new one. Throws IoError naming the file.
// `metadata` goes into the header's "__metadata__" (string to string, as the format requires).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, StoredDtype dtype = StoredDtype::kF32);
// Reads every tensor (F32, or BF16 and F16 widened exactly to F32) and, when `metadata` is not
// null, the "__metadata__" entries. Throws DataError naming the file and tensor on any
// inconsistency (a header over 100 MB or past the end of the file, a shape whose product
// overflows int64, data ranges that overlap, leave bytes unclaimed or run past the file), IoError
// when the file cannot be read. Nothing is allocated for a tensor before every entry has been
// checked against the file size, and all tensors together take at most twice the file's bytes.
std::vector<NamedTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace tessera::checkpoint
