// Hugging Face safetensors: atomic writer, bounds-checked reader.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <tuple>

#include "core/bf16.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"

namespace tessera::checkpoint {

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, StoredDtype dtype) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  const bool bf16 = dtype == StoredDtype::kBF16;
  size_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const size_t bytes = t.data.size() * stored_bytes(dtype);
    header[t.name] = {{"dtype", bf16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = dump_json(header);
  json.resize((json.size() + 7) / 8 * 8, ' ');  // the format pads the header with spaces to 8 bytes
  const uint64_t header_len = json.size();      // little-endian on every machine we build for

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
  try {
    write_all(fd, &header_len, sizeof(header_len), tmp);
    write_all(fd, json.data(), json.size(), tmp);
    std::vector<uint16_t> rounded;  // one tensor's bf16 values at a time
    for (const NamedTensor& t : tensors) {
      if (!bf16) {
        write_all(fd, t.data.data(), t.data.size() * sizeof(float), tmp);
        continue;
      }
      rounded.resize(t.data.size());
      f32_to_bf16(t.data.data(), rounded.data(), static_cast<int64_t>(t.data.size()));
      write_all(fd, rounded.data(), rounded.size() * sizeof(uint16_t), tmp);
    }
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

namespace {

// The reference implementation's limit; a longer header is an attack, not a checkpoint.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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

// A header entry checked against the file, before any of its data is allocated.
struct Entry {
  std::string name;
  std::string dtype;  // F32, BF16 or F16
  size_t element_size = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data
};

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& info, uint64_t data_size) {
  auto bad = [&](const std::string& why) { return DataError(fmt::format("{}: tensor {}: {}", path, name, why)); };
  if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
    throw bad("missing dtype, shape or data_offsets");
  }
  const auto& dtype = info["dtype"];
  // Only strings are echoed: dumping an arbitrary value recurses as deep as it nests.
  if (!dtype.is_string()) throw bad("dtype is not a string");
  const size_t esize = element_size(dtype.get<std::string>());
  if (esize == 0) {
    throw bad(fmt::format("dtype \"{}\" is not supported (F32, BF16 or F16)", dtype.get<std::string>()));
  }
  const auto& shape = info["shape"];
  const auto& offsets = info["data_offsets"];
  if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2) throw bad("malformed shape or data_offsets");
  Entry e;
  e.name = name;
  e.dtype = dtype.get<std::string>();
  e.element_size = esize;
  // numel bounds the data; `extent`, the product of the non-zero dimensions, bounds every partial
  // product a reader may form in int64 (a zero dimension does not make [0, 2^63, 2] harmless).
  uint64_t numel = 1, extent = 1;
  for (const auto& d : shape) {
    if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && extent > static_cast<uint64_t>(INT64_MAX) / dim) throw bad("shape product overflows int64");
    if (dim != 0) extent *= dim;
    if (dim != 0 && numel > data_size / dim) throw bad("shape larger than the file");
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) throw bad("malformed data_offsets");
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size) {
    throw bad(fmt::format("data_offsets [{}, {}) outside the data ({} bytes)", e.begin, e.end, data_size));
  }
  // numel <= data_size (checked above), so the product cannot overflow.
  if (e.end - e.begin != numel * esize) throw bad("data_offsets do not match the shape");
  return e;
}

// The header's JSON; *header_len its length in bytes (the data starts at 8 + header_len).
nlohmann::json read_header(std::ifstream& in, const std::string& path, uint64_t file_size, uint64_t* header_len) {
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(header_len), 8)) {
    throw DataError(fmt::format("{}: too short for a safetensors header", path));
  }
  if (*header_len > file_size - 8) {
    throw DataError(fmt::format("{}: header length {} exceeds the file size {}", path, *header_len, file_size));
  }
  if (*header_len > kMaxHeaderBytes) {
    throw DataError(
        fmt::format("{}: header length {} exceeds the format's limit of {}", path, *header_len, kMaxHeaderBytes));
  }
  std::string json(*header_len, '\0');
  in.read(json.data(), static_cast<std::streamsize>(*header_len));
  nlohmann::json header;
  try {
    header = parse_json_or_throw(json);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: header is not valid JSON: {}", path, e.what()));
  }
  if (!header.is_object()) throw DataError(fmt::format("{}: header is not a JSON object", path));
  return header;
}

// The format requires the entries' ranges to tile the data exactly, so the tensors together
// never claim more bytes than the file holds.
void check_tiling(const std::string& path, const std::vector<Entry>& entries, uint64_t data_size) {
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t covered = 0;
  for (const Entry* e : by_offset) {
    if (e->begin < covered) {
      throw DataError(fmt::format("{}: tensor {}: data_offsets [{}, {}) overlap another tensor's", path, e->name,
                                  e->begin, e->end));
    }
    if (e->begin > covered) {
      throw DataError(fmt::format("{}: no tensor holds data bytes [{}, {})", path, covered, e->begin));
    }
    covered = e->end;
  }
  if (covered != data_size) {
    throw DataError(fmt::format("{}: no tensor holds data bytes [{}, {})", path, covered, data_size));
  }
}

// One checked entry's data, at `data_start` in the file, as fp32 (16-bit types widen exactly).
NamedTensor read_tensor(std::ifstream& in, const std::string& path, uint64_t data_start, Entry& e) {
  NamedTensor t;
  t.name = std::move(e.name);
  t.shape = std::move(e.shape);
  const uint64_t numel = (e.end - e.begin) / e.element_size;
  t.data.resize(numel);  // at most twice the tensor's bytes in the file (16-bit widened)
  in.seekg(static_cast<std::streamoff>(data_start + e.begin));
  if (e.element_size == sizeof(float)) {
    if (!in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(e.end - e.begin))) {
      throw IoError(fmt::format("cannot read tensor {} from {}", t.name, path));
    }
    return t;
  }
  // Read in chunks so the staging buffer stays small.
  std::vector<uint16_t> staging(std::min<uint64_t>(numel, uint64_t{1} << 20));
  for (uint64_t done = 0; done < numel;) {
    const uint64_t n = std::min<uint64_t>(staging.size(), numel - done);
    if (!in.read(reinterpret_cast<char*>(staging.data()), static_cast<std::streamsize>(n * 2))) {
      throw IoError(fmt::format("cannot read tensor {} from {}", t.name, path));
    }
    float* to = t.data.data() + done;
    if (e.dtype == "BF16") {
      bf16_to_f32(staging.data(), to, static_cast<int64_t>(n));
    } else {
      for (uint64_t i = 0; i < n; ++i) to[i] = f16_to_f32(staging[i]);
    }
    done += n;
  }
  return t;
}

}  // namespace

std::vector<NamedTensor> read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_len = 0;
  const nlohmann::json header = read_header(in, path, file_size, &header_len);
  const uint64_t data_size = file_size - 8 - header_len;
  // Every entry is checked before any tensor is allocated.
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) throw DataError(fmt::format("{}: __metadata__ is not an object", path));
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) throw DataError(fmt::format("{}: __metadata__ entry {} is not a string", path, key));
        if (metadata != nullptr) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, info, data_size));
  }
  check_tiling(path, entries, data_size);
  std::vector<NamedTensor> out;
  out.reserve(entries.size());
  for (Entry& e : entries) out.push_back(read_tensor(in, path, 8 + header_len, e));
  return out;
}

}  // namespace tessera::checkpoint
