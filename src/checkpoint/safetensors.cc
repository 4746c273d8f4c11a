// Hugging Face safetensors: atomic writer, bounds-checked reader.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/error.h"
#include "core/file_io.h"

namespace tessera::checkpoint {
namespace {

// IEEE binary16 to float, exactly (every half is a float): subnormals, infinities, NaN payloads.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    exponent = 1;
    while ((mantissa & 0x400u) == 0) mantissa <<= 1, --exponent;  // normalize the subnormal
    mantissa &= 0x3ffu;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Bytes per element of the dtypes read, 0 for any other.
size_t element_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const size_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.resize((json.size() + 7) / 8 * 8, ' ');  // the format pads the header with spaces to 8 bytes
  const uint64_t header_len = json.size();      // little-endian on every machine we build for

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  try {
    write_all(fd, &header_len, sizeof(header_len), tmp);
    write_all(fd, json.data(), json.size(), tmp);
    for (const NamedTensor& t : tensors) write_all(fd, t.data.data(), t.data.size() * sizeof(float), tmp);
    if (::fsync(fd) != 0) throw IoError(fmt::format("cannot fsync {}: {}", tmp, std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
  }
  sync_parent_dir(path);
}

std::vector<NamedTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_len = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&header_len), 8)) {
    throw DataError(fmt::format("{}: too short for a safetensors header", path));
  }
  if (header_len > file_size - 8) {
    throw DataError(fmt::format("{}: header length {} exceeds the file size {}", path, header_len, file_size));
  }
  std::string json(header_len, '\0');
  in.read(json.data(), static_cast<std::streamsize>(header_len));
  const uint64_t data_size = file_size - 8 - header_len;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: header is not valid JSON: {}", path, e.what()));
  }
  if (!header.is_object()) throw DataError(fmt::format("{}: header is not a JSON object", path));

  std::vector<NamedTensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw DataError(fmt::format("{}: __metadata__ is not an object", path));
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) throw DataError(fmt::format("{}: __metadata__ entry {} is not a string", path, key));
        if (metadata != nullptr) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) { return DataError(fmt::format("{}: tensor {}: {}", path, name, why)); };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
      throw bad("missing dtype, shape or data_offsets");
    }
    const size_t esize = info["dtype"].is_string() ? element_size(info["dtype"].get<std::string>()) : 0;
    if (esize == 0) {
      throw bad(fmt::format("dtype {} is not supported (F32, BF16 or F16)", info["dtype"].dump()));
    }
    const std::string dtype = info["dtype"].get<std::string>();
    const auto& shape = info["shape"];
    const auto& offsets = info["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2) throw bad("malformed shape or data_offsets");
    NamedTensor t;
    t.name = name;
    uint64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > data_size / dim) throw bad("shape larger than the file");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) throw bad("malformed data_offsets");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size) throw bad(fmt::format("data_offsets [{}, {}) outside the data ({} bytes)", begin, end, data_size));
    // numel <= data_size (checked above), so the product cannot overflow.
    if (end - begin != numel * esize) throw bad("data_offsets do not match the shape");
    t.data.resize(numel);
    in.seekg(static_cast<std::streamoff>(8 + header_len + begin));
    if (esize == sizeof(float)) {
      if (!in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(end - begin))) {
        throw IoError(fmt::format("cannot read tensor {} from {}", name, path));
      }
    } else {
      // 16-bit tensors widen to fp32 exactly; read in chunks so the staging buffer stays small.
      std::vector<uint16_t> staging(std::min<uint64_t>(numel, uint64_t{1} << 20));
      for (uint64_t done = 0; done < numel;) {
        const uint64_t n = std::min<uint64_t>(staging.size(), numel - done);
        if (!in.read(reinterpret_cast<char*>(staging.data()), static_cast<std::streamsize>(n * 2))) {
          throw IoError(fmt::format("cannot read tensor {} from {}", name, path));
        }
        float* out_data = t.data.data() + done;
        if (dtype == "BF16") {
          bf16_to_f32(staging.data(), out_data, static_cast<int64_t>(n));
        } else {
          for (uint64_t i = 0; i < n; ++i) out_data[i] = f16_to_f32(staging[i]);
        }
        done += n;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace tessera::checkpoint
