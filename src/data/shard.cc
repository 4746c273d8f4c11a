// Token shards: writer (temporary file, header last, rename) and validating mmap reader.
#include "data/shard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/error.h"
#include "core/file_io.h"

static_assert(std::endian::native == std::endian::little, "shards are little-endian; add byte swaps here");

namespace tessera::data {
namespace {

constexpr size_t kFlushBytes = 1 << 20;

// Header field offsets (shard.h).
constexpr size_t kOffVersion = 8, kOffTokenBytes = 12, kOffVocab = 16, kOffReserved = 20, kOffTokens = 24,
                 kOffDocuments = 32, kOffTokenizer = 40, kOffPayloadSum = 48, kOffHeaderSum = 56;

template <typename T>
void put(uint8_t* h, size_t off, T v) {
  std::memcpy(h + off, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* h, size_t off) {
  T v;
  std::memcpy(&v, h + off, sizeof(T));
  return v;
}


}  // namespace

ShardWriter::ShardWriter(std::string path, uint32_t vocab_size, uint64_t tokenizer_hash, int32_t eos_id)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), eos_(eos_id) {
  CHECK_MSG(vocab_size > 0 && eos_id >= 0 && static_cast<uint32_t>(eos_id) < vocab_size, "EOS outside the vocabulary");
  info_.token_bytes = token_bytes_for(vocab_size);
  info_.vocab_size = vocab_size;
  info_.tokenizer_hash = tokenizer_hash;
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(fmt::format("cannot create {}: {}", tmp_, std::strerror(errno)));
  hash_ = XXH64_createState();
  CHECK(hash_ != nullptr);
  XXH64_reset(hash_, 0);
  buffer_.assign(kShardHeaderBytes, 0);  // placeholder; the real header is written by finish()
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
  if (hash_ != nullptr) XXH64_freeState(hash_);
}

void ShardWriter::add_document(std::span<const int32_t> tokens) {
  CHECK_MSG(fd_ >= 0, "add_document after finish");
  const size_t width = info_.token_bytes;
  const size_t start = buffer_.size();
  buffer_.resize(start + (tokens.size() + 1) * width);
  uint8_t* p = buffer_.data() + start;
  auto put_token = [&](int32_t t) {
    if (t < 0 || static_cast<uint32_t>(t) >= info_.vocab_size) {
      buffer_.resize(start);
      throw DataError(fmt::format("{}: token {} outside the vocabulary of {}", path_, t, info_.vocab_size));
    }
    if (width == 2) {
      const auto v = static_cast<uint16_t>(t);
      std::memcpy(p, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(t);
      std::memcpy(p, &v, 4);
    }
    p += width;
  };
  for (const int32_t t : tokens) put_token(t);
  put_token(eos_);
  // Only payload bytes enter the checksum (the header placeholder sits before the first `start`).
  XXH64_update(hash_, buffer_.data() + start, buffer_.size() - start);
  info_.tokens += tokens.size() + 1;
  info_.documents += 1;
  if (buffer_.size() >= kFlushBytes) flush();
}

void ShardWriter::flush() {
  write_all(fd_, buffer_.data(), buffer_.size(), tmp_);
  buffer_.clear();
}

ShardInfo ShardWriter::finish() {
  CHECK_MSG(fd_ >= 0, "finish called twice");
  flush();
  info_.payload_checksum = XXH64_digest(hash_);
  uint8_t h[kShardHeaderBytes] = {};
  std::memcpy(h, kShardMagic, sizeof(kShardMagic));
  put<uint32_t>(h, kOffVersion, kShardVersion);
  put<uint32_t>(h, kOffTokenBytes, info_.token_bytes);
  put<uint32_t>(h, kOffVocab, info_.vocab_size);
  put<uint32_t>(h, kOffReserved, 0);
  put<uint64_t>(h, kOffTokens, info_.tokens);
  put<uint64_t>(h, kOffDocuments, info_.documents);
  put<uint64_t>(h, kOffTokenizer, info_.tokenizer_hash);
  put<uint64_t>(h, kOffPayloadSum, info_.payload_checksum);
  put<uint64_t>(h, kOffHeaderSum, XXH64(h, kOffHeaderSum, 0));
  for (size_t done = 0; done < kShardHeaderBytes;) {
    const ssize_t w = ::pwrite(fd_, h + done, kShardHeaderBytes - done, static_cast<off_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw IoError(fmt::format("cannot write {}: {}", tmp_, std::strerror(errno)));
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd_) != 0) throw IoError(fmt::format("cannot fsync {}: {}", tmp_, std::strerror(errno)));
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_.c_str());
    throw IoError(fmt::format("cannot close {}: {}", tmp_, std::strerror(errno)));
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw IoError(fmt::format("cannot rename {} to {}: {}", tmp_, path_, std::strerror(err)));
  }
  return info_;
}

Shard Shard::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("cannot open shard {}: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw DataError(fmt::format("cannot stat shard {}: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("shard {} is not a regular file", path));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw DataError(fmt::format("shard {}: {} bytes, shorter than the {}-byte header", path, size, kShardHeaderBytes));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw DataError(fmt::format("cannot map shard {}: {}", path, std::strerror(map_err)));
  ::madvise(map, size, MADV_SEQUENTIAL);

  Shard s;  // owns the mapping from here on, so every throw below unmaps it
  s.path_ = path;
  s.map_ = static_cast<const uint8_t*>(map);
  s.map_bytes_ = size;
  const uint8_t* h = s.map_;
  auto fail = [&](const std::string& what) { return DataError(fmt::format("shard {}: {}", path, what)); };
  if (std::memcmp(h, kShardMagic, sizeof(kShardMagic)) != 0) throw fail("bad magic (not a tessera token shard)");
  const auto version = get<uint32_t>(h, kOffVersion);
  if (version != kShardVersion)
    throw fail(fmt::format("version {}, this build reads version {}", version, kShardVersion));
  if (get<uint64_t>(h, kOffHeaderSum) != XXH64(h, kOffHeaderSum, 0))
    throw fail("header checksum mismatch (corrupt header)");
  ShardInfo& info = s.info_;
  info.token_bytes = get<uint32_t>(h, kOffTokenBytes);
  info.vocab_size = get<uint32_t>(h, kOffVocab);
  info.tokens = get<uint64_t>(h, kOffTokens);
  info.documents = get<uint64_t>(h, kOffDocuments);
  info.tokenizer_hash = get<uint64_t>(h, kOffTokenizer);
  info.payload_checksum = get<uint64_t>(h, kOffPayloadSum);
  if (info.token_bytes != 2 && info.token_bytes != 4)
    throw fail(fmt::format("token bytes {}, want 2 or 4", info.token_bytes));
  if (get<uint32_t>(h, kOffReserved) != 0) throw fail("reserved header field is not 0");
  if (info.vocab_size == 0 || info.vocab_size > (1u << 31) || (info.token_bytes == 2 && info.vocab_size > (1u << 16))) {
    throw fail(fmt::format("vocab size {} does not fit {}-byte tokens", info.vocab_size, info.token_bytes));
  }
  const uint64_t payload = size - kShardHeaderBytes;
  if (info.tokens > payload / info.token_bytes || info.tokens * info.token_bytes != payload) {
    throw fail(fmt::format("{} bytes, but the header says {} tokens of {} bytes (+{} header): truncated or padded",
                           size, info.tokens, info.token_bytes, kShardHeaderBytes));
  }
  if (info.documents > info.tokens) throw fail(fmt::format("{} documents in {} tokens", info.documents, info.tokens));
  const uint8_t* body = h + kShardHeaderBytes;
  if (XXH64(body, payload, 0) != info.payload_checksum) throw fail("payload checksum mismatch (corrupt tokens)");
  // A well-formed but hostile shard could still carry ids the embedding table does not have.
  uint32_t max_token = 0;
  if (info.token_bytes == 2) {
    for (uint64_t i = 0; i < info.tokens; ++i) max_token = std::max<uint32_t>(max_token, get<uint16_t>(body, 2 * i));
  } else {
    for (uint64_t i = 0; i < info.tokens; ++i) max_token = std::max(max_token, get<uint32_t>(body, 4 * i));
  }
  if (info.tokens > 0 && max_token >= info.vocab_size) {
    throw fail(fmt::format("token {} outside the vocabulary of {}", max_token, info.vocab_size));
  }
  return s;
}

Shard::~Shard() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

Shard::Shard(Shard&& o) noexcept
    : path_(std::move(o.path_)),
      info_(o.info_),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)) {}

Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    path_ = std::move(o.path_);
    info_ = o.info_;
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
  }
  return *this;
}

void Shard::read(uint64_t begin, uint64_t n, int32_t* out) const {
  CHECK_MSG(begin <= info_.tokens && n <= info_.tokens - begin, "Shard::read past the end");
  const uint8_t* p = map_ + kShardHeaderBytes;
  if (info_.token_bytes == 2) {
    for (uint64_t i = 0; i < n; ++i) out[i] = get<uint16_t>(p, 2 * (begin + i));
  } else {
    for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(get<uint32_t>(p, 4 * (begin + i)));
  }
}

}  // namespace tessera::data
