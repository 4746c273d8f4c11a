// Typed reads of a JSON file's keys (a dataset's manifest.json, a Hugging Face tokenizer.json),
// with errors that name the file and the key's path.
#pragma once

#include <cstdint>
#include <string>

#include "core/json.h"

namespace tessera {

// Each read takes the object, the key, and `where`, the object's own path ("splits.train.",
// "" at the top). Each failure throws DataError "ORIGIN: PATH WHAT", as in
// "data/manifest.json: splits.train.tokens is not a non-negative integer".
class JsonKeys {
 public:
  // `origin` begins every message: the file's path, with what it is where that helps.
  explicit JsonKeys(std::string origin) : origin_(std::move(origin)) {}

  const nlohmann::json& at(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  std::string string(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  int64_t integer(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  uint64_t unsigned_integer(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  // A string of exactly 16 hex digits (a checksum or hash).
  uint64_t hex64(const nlohmann::json& obj, const std::string& key, const std::string& where) const;
  // `fallback` where the key is missing or null.
  bool flag(const nlohmann::json& obj, const std::string& key, const std::string& where, bool fallback) const;

  // Throws "ORIGIN: PATH WHAT"; `path` is the key's full path.
  [[noreturn]] void fail(const std::string& path, const std::string& what) const;
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

}  // namespace tessera
