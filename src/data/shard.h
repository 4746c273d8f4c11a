// Token shards: a fixed 64-byte header and the tokens of many documents, each followed by EOS.
//
// Header (little-endian): magic "TSRATOKS", u32 version (1), u32 token bytes (2 when the
// vocabulary fits in 16 bits, else 4), u32 vocab size, u32 reserved (0), u64 token count,
// u64 document count, u64 tokenizer hash, u64 payload checksum (xxh64 of the token bytes),
// u64 header checksum (xxh64 of the 56 bytes before it). Payload: token count x token bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

struct XXH64_state_s;

namespace tessera::data {

inline constexpr char kShardMagic[8] = {'T', 'S', 'R', 'A', 'T', 'O', 'K', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

// Bytes per token in a shard of a vocabulary of vocab_size: 2 when ids fit in 16 bits, else 4.
inline uint32_t token_bytes_for(uint64_t vocab_size) { return vocab_size <= (1u << 16) ? 2 : 4; }

struct ShardInfo {
  uint32_t token_bytes = 0;
  uint32_t vocab_size = 0;
  uint64_t tokens = 0;
  uint64_t documents = 0;
  uint64_t tokenizer_hash = 0;
  uint64_t payload_checksum = 0;
};

// Writes one shard through "<path>.tmp", renamed into place by finish(); a writer destroyed
// without finish() removes its temporary file, so nothing half-written looks like a shard.
class ShardWriter {
 public:
  ShardWriter(std::string path, uint32_t vocab_size, uint64_t tokenizer_hash, int32_t eos_id);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends the document's tokens and an EOS. Tokens must be in [0, vocab_size).
  void add_document(std::span<const int32_t> tokens);
  uint64_t tokens() const { return info_.tokens; }
  // Writes the header, fsyncs and renames; returns what the header says. Throws IoError.
  ShardInfo finish();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  ShardInfo info_;
  int32_t eos_;
  struct XXH64_state_s* hash_ = nullptr;  // running payload checksum
  std::vector<uint8_t> buffer_;
  void flush();
};

// A shard mapped read-only. open() validates magic, version, sizes, header checksum and payload
// checksum; any mismatch is a DataError naming the file and what is wrong.
class Shard {
 public:
  static Shard open(const std::string& path);
  ~Shard();
  Shard(Shard&&) noexcept;
  Shard& operator=(Shard&&) noexcept;

  const ShardInfo& info() const { return info_; }
  const std::string& path() const { return path_; }
  // Tokens [begin, begin + n) as int32; begin + n <= info().tokens.
  void read(uint64_t begin, uint64_t n, int32_t* out) const;

 private:
  Shard() = default;
  std::string path_;
  ShardInfo info_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
};

}  // namespace tessera::data
