// Typed reads of a JSON file's keys (a checkpoint's or dataset's manifest.json, a Hugging Face
// tokenizer.json), with errors that name the file and the key's path.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/json.h"

namespace tessera {

// The keys of one JSON object. Each failure is a DataError "ORIGIN: PATH WHAT", PATH the key's
// path from the top of the file, as in
//   "run/step_00000012/manifest.json: units[3].tensors[0].offset = -1 is outside [0, 4096]".
// A value that is not an object has no keys: every read of it fails as missing.
class JsonKeys {
 public:
  // `origin` begins every message: the file's path, with what it is where that helps
  // ("tokenizer PATH"); `where` is the object's own path ("splits.train.", "" at the top).
  JsonKeys(const nlohmann::json& j, std::string origin, std::string where = "");

  bool contains(const std::string& key) const;             // present, even if null
  bool has(const std::string& key) const;                  // present and not null
  const nlohmann::json& at(const std::string& key) const;  // present, of any type
  // The object at `key`, and the object at `key`[i] of a list, their keys named from theirs.
  JsonKeys object(const std::string& key) const;
  JsonKeys element(const std::string& key, size_t i) const;

  std::string string(const std::string& key) const;
  bool flag(const std::string& key, bool fallback) const;  // fallback where missing or null
  int64_t integer(const std::string& key, int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  uint64_t unsigned_integer(const std::string& key) const;
  double number(const std::string& key) const;
  const nlohmann::json& array(const std::string& key) const;
  uint64_t hex64(const std::string& key) const;  // 1 to 16 lowercase hex digits, as hex64() writes

  // "ORIGIN: PATH WHAT", PATH this object's path and `key` (which may name a path below it).
  DataError error(const std::string& key, const std::string& what) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const { throw error(key, what); }

  const nlohmann::json& value() const { return j_; }  // the object itself
  const std::string& origin() const { return origin_; }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string origin_, where_;
};

}  // namespace tessera
