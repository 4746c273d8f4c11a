// Typed reads of JSON keys, each failure naming the file and the key's path.
#include "core/json_keys.h"

#include <fmt/format.h>

#include "core/text.h"

namespace tessera {

using nlohmann::json;

JsonKeys::JsonKeys(const json& j, std::string origin, std::string where)
    : j_(j), origin_(std::move(origin)), where_(std::move(where)) {}

bool JsonKeys::contains(const std::string& key) const { return j_.is_object() && j_.contains(key); }

bool JsonKeys::has(const std::string& key) const { return contains(key) && !j_.at(key).is_null(); }

const json& JsonKeys::at(const std::string& key) const {
  if (!contains(key)) fail(key, "is missing");
  return j_.at(key);
}

JsonKeys JsonKeys::object(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_object()) fail(key, "is not an object");
  return JsonKeys(v, origin_, where_ + key + ".");
}

JsonKeys JsonKeys::element(const std::string& key, size_t i) const {
  const json& list = array(key);
  const std::string name = fmt::format("{}[{}]", key, i);
  if (i >= list.size()) fail(name, "is missing");
  if (!list[i].is_object()) fail(name, "is not an object");
  return JsonKeys(list[i], origin_, where_ + name + ".");
}

std::string JsonKeys::string(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_string()) fail(key, "is not a string");
  return v.get<std::string>();
}

bool JsonKeys::flag(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j_.at(key).is_boolean()) fail(key, "is not true or false");
  return j_.at(key).get<bool>();
}

int64_t JsonKeys::integer(const std::string& key, int64_t min, int64_t max) const {
  const json& v = at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
    fail(key, "is not an integer of 64 bits");
  }
  const int64_t x = v.get<int64_t>();
  if (x < min || x > max) fail(key, fmt::format("= {} is outside [{}, {}]", x, min, max));
  return x;
}

uint64_t JsonKeys::unsigned_integer(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_number_unsigned()) fail(key, "is not a non-negative integer");
  return v.get<uint64_t>();
}

double JsonKeys::number(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_number()) fail(key, "is not a number");
  return v.get<double>();
}

const json& JsonKeys::array(const std::string& key) const {
  const json& v = at(key);
  if (!v.is_array()) fail(key, "is not a list");
  return v;
}

uint64_t JsonKeys::hex64(const std::string& key) const {
  const std::string s = string(key);
  uint64_t v = 0;
  if (!parse_hex64(s, &v)) fail(key, fmt::format("= \"{}\" is not 1 to 16 lowercase hex digits", s));
  return v;
}

DataError JsonKeys::error(const std::string& key, const std::string& what) const {
  return DataError(fmt::format("{}: {}{} {}", origin_, where_, key, what));
}

}  // namespace tessera
