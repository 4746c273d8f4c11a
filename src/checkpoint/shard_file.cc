// Checkpoint shard files: writer and bounds-checked reader.
#include "checkpoint/shard_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/file_io.h"
#include "core/io_progress.h"
#include "core/json.h"

namespace tessera::checkpoint {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'S', 'H', 'A', 'R', 'D'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kPrefix = 32;              // magic, version, header length and checksum
constexpr uint64_t kAlign = 64;
constexpr uint64_t kMaxHeader = 64ull << 20;  // far above any real layout's header

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Hasher {
  XXH64_state_t* state = XXH64_createState();
  Hasher() { XXH64_reset(state, 0); }
  ~Hasher() { XXH64_freeState(state); }
  void add(const void* p, size_t n) { XXH64_update(state, p, n); }
  uint64_t digest() const { return XXH64_digest(state); }
};

// A local shard file read with pread. A failed read (EIO, ESTALE) throws IoError naming `path`:
// the file may well be sound, so it is not reported as damage.
class LocalFile : public storage::ReadableFile {
 public:
  explicit LocalFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0 && errno == ENOENT) throw DataError(fmt::format("checkpoint shard {} is missing", path));
    if (fd_ < 0) throw IoError(fmt::format("cannot open checkpoint shard {}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      throw IoError(fmt::format("cannot stat checkpoint shard {}: {}", path, std::strerror(err)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~LocalFile() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  bool read_at(uint64_t offset, uint64_t n, void* out) const override {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw IoError(fmt::format("cannot read checkpoint shard {}: {}", path_, std::strerror(errno)));
      if (r == 0) return false;
      io_progress::add(static_cast<uint64_t>(r));
      p += r;
      n -= static_cast<uint64_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace

FileDigest write_shard_file(const std::string& path, const std::vector<TensorView>& tensors,
                            const std::function<void(size_t)>& before_tensor) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  std::vector<uint64_t> offsets;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    const uint64_t bytes = t.count * sizeof(float);
    offsets.push_back(offset);
    list.push_back({{"name", t.name},
                    {"offset", offset},
                    {"bytes", bytes},
                    {"xxh64", hex64(XXH64(t.data, bytes, 0))}});
    offset = align_up(offset + bytes);
  }
  const std::string header = dump_json(nlohmann::ordered_json{{"tensors", list}});
  const uint64_t data_begin = align_up(kPrefix + header.size());
  std::string prefix(kPrefix, '\0');
  std::memcpy(prefix.data(), kMagic, 8);
  std::memcpy(prefix.data() + 8, &kVersion, 4);
  const uint64_t header_size = header.size(), header_sum = XXH64(header.data(), header.size(), 0);
  std::memcpy(prefix.data() + 16, &header_size, 8);
  std::memcpy(prefix.data() + 24, &header_sum, 8);

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  Hasher file_hash;
  uint64_t written = 0;
  auto put = [&](const void* p, uint64_t n) {
    write_all(fd, p, n, path);
    io_progress::add(n);
    file_hash.add(p, n);
    written += n;
  };
  const std::string zeros(kAlign, '\0');
  auto pad_to = [&](uint64_t target) { put(zeros.data(), target - written); };
  try {
    put(prefix.data(), prefix.size());
    put(header.data(), header.size());
    pad_to(data_begin);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (before_tensor) before_tensor(i);
      pad_to(data_begin + offsets[i]);
      put(tensors[i].data, tensors[i].count * sizeof(float));
    }
    if (::fsync(fd) != 0) throw IoError(fmt::format("cannot fsync {}: {}", path, std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw IoError(fmt::format("cannot close {}: {}", path, std::strerror(err)));
  }
  return {written, file_hash.digest()};
}

ShardFile::ShardFile(const std::string& path) : path_(path), file_(std::make_unique<LocalFile>(path)) {
  parse_header();
}

ShardFile::ShardFile(std::string name, std::unique_ptr<storage::ReadableFile> file)
    : path_(std::move(name)), file_(std::move(file)) {
  parse_header();
}

void ShardFile::parse_header() {
  const std::string& path = path_;
  auto bad = [&](const std::string& why) {
    return DataError(fmt::format("checkpoint shard {} is damaged: {}", path, why));
  };
  const uint64_t size = file_->size();
  char prefix[kPrefix];
  if (size < kPrefix || !file_->read_at(0, kPrefix, prefix)) {
    throw bad(fmt::format("{} bytes, shorter than the {}-byte prefix", size, kPrefix));
  }
  if (std::memcmp(prefix, kMagic, 8) != 0) throw bad("not a Tessera shard file (bad magic)");
  uint32_t version = 0;
  uint64_t header_size = 0, header_sum = 0;
  std::memcpy(&version, prefix + 8, 4);
  std::memcpy(&header_size, prefix + 16, 8);
  std::memcpy(&header_sum, prefix + 24, 8);
  if (version != kVersion) throw bad(fmt::format("format version {}, this build reads {}", version, kVersion));
  if (header_size > kMaxHeader || header_size > size - kPrefix) {
    throw bad(fmt::format("header of {} bytes does not fit in the file of {} bytes", header_size, size));
  }
  std::string header(header_size, '\0');
  if (!file_->read_at(kPrefix, header_size, header.data())) throw bad("truncated header");
  if (XXH64(header.data(), header.size(), 0) != header_sum) throw bad("header checksum mismatch");
  data_begin_ = align_up(kPrefix + header_size);
  const uint64_t data_size = size >= data_begin_ ? size - data_begin_ : 0;
  const nlohmann::json j = parse_json(header);
  if (!j.is_object() || !j.contains("tensors") || !j["tensors"].is_array()) throw bad("header has no tensor list");
  for (const auto& t : j["tensors"]) {
    ShardEntry e;
    const bool shaped = t.is_object() && t.contains("name") && t["name"].is_string() && t.contains("offset") &&
                        t["offset"].is_number_unsigned() && t.contains("bytes") && t["bytes"].is_number_unsigned() &&
                        t.contains("xxh64") && t["xxh64"].is_string();
    if (!shaped) throw bad("a tensor entry lacks name, offset, bytes or xxh64");
    e.name = t["name"].get<std::string>();
    e.offset = t["offset"].get<uint64_t>();
    e.bytes = t["bytes"].get<uint64_t>();
    if (!parse_hex64(t["xxh64"].get<std::string>(), &e.xxh64)) throw bad(fmt::format("tensor {}: bad checksum", e.name));
    if (e.bytes % sizeof(float) != 0) throw bad(fmt::format("tensor {}: {} bytes is not whole floats", e.name, e.bytes));
    if (e.offset > data_size || e.bytes > data_size - e.offset) {
      throw bad(fmt::format("tensor {}: bytes [{}, {}) beyond the data region of {} bytes (truncated?)", e.name,
                            e.offset, e.offset + e.bytes, data_size));
    }
    if (find(e.name) != nullptr) throw bad(fmt::format("tensor {} appears twice", e.name));
    entries_.push_back(std::move(e));
  }
  std::vector<const ShardEntry*> sorted;
  for (const auto& e : entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->offset + sorted[i - 1]->bytes > sorted[i]->offset) {
      throw bad(fmt::format("tensors {} and {} overlap", sorted[i - 1]->name, sorted[i]->name));
    }
  }
}

ShardFile::~ShardFile() = default;

const ShardEntry* ShardFile::find(const std::string& name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void ShardFile::read(const ShardEntry& entry, float* out) const {
  if (!file_->read_at(data_begin_ + entry.offset, entry.bytes, out)) {
    throw DataError(fmt::format("checkpoint shard {}: tensor {} is truncated", path_, entry.name));
  }
  if (XXH64(out, entry.bytes, 0) != entry.xxh64) {
    throw DataError(fmt::format("checkpoint shard {}: tensor {} fails its checksum (the file is damaged)", path_,
                                entry.name));
  }
}

FileDigest digest_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  Hasher h;
  FileDigest d;
  std::unique_ptr<char[]> buffer(new char[1 << 20]);
  for (;;) {
    const ssize_t r = ::read(fd, buffer.get(), 1 << 20);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError(fmt::format("cannot read {}: {}", path, std::strerror(err)));
    }
    if (r == 0) break;
    h.add(buffer.get(), static_cast<size_t>(r));
    d.bytes += static_cast<uint64_t>(r);
    io_progress::add(static_cast<uint64_t>(r));
  }
  ::close(fd);
  d.xxh64 = h.digest();
  return d;
}

FileDigest digest_file(const storage::ReadableFile& file, const std::string& name) {
  constexpr uint64_t kChunk = 8ull << 20;  // ranged GETs of an object copy: few and large
  Hasher h;
  std::vector<char> buffer;
  const uint64_t size = file.size();
  for (uint64_t at = 0; at < size; at += kChunk) {
    const uint64_t n = std::min(kChunk, size - at);
    buffer.resize(n);
    if (!file.read_at(at, n, buffer.data())) throw IoError(fmt::format("cannot read {}: it ends early", name));
    h.add(buffer.data(), n);
  }
  return {size, h.digest()};
}

}  // namespace tessera::checkpoint
