// JsonKeys: each typed read, and each failure naming the origin and the key's full path.
#include "core/json_keys.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"

namespace tessera {
namespace {

using nlohmann::json;

// The message of what `read` throws; "" when it throws nothing.
template <class F>
std::string error_of(F read) {
  try {
    read();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonKeys, ReadsEachType) {
  const json j = parse_json_or_throw(
      R"({"s": "text", "i": -5, "u": 18446744073709551615, "h": "00000000deadbeef", "t": true, "n": null})");
  const JsonKeys r("file.json");
  EXPECT_EQ(r.string(j, "s", ""), "text");
  EXPECT_EQ(r.integer(j, "i", ""), -5);
  EXPECT_EQ(r.unsigned_integer(j, "u", ""), UINT64_MAX);
  EXPECT_EQ(r.hex64(j, "h", ""), 0xdeadbeefull);
  EXPECT_TRUE(r.flag(j, "t", "", false));
  EXPECT_TRUE(r.flag(j, "n", "", true));  // null reads as missing
  EXPECT_FALSE(r.flag(j, "absent", "", false));
  EXPECT_EQ(&r.at(j, "s", ""), &j.at("s"));
}

TEST(JsonKeys, FailuresNameTheOriginAndTheKeyPath) {
  const json j =
      parse_json_or_throw(R"({"a": {"s": 1, "i": "1", "big": 9223372036854775808, "neg": -1, "h": "xyz", "f": 0}})");
  const json& a = j.at("a");
  const JsonKeys r("tokenizer t.json");
  const std::pair<std::string, std::function<void()>> cases[] = {
      {"tokenizer t.json: a.missing is missing", [&] { r.at(a, "missing", "a."); }},
      {"tokenizer t.json: a.s is not a string", [&] { r.string(a, "s", "a."); }},
      {"tokenizer t.json: a.i is not an integer of 64 bits", [&] { r.integer(a, "i", "a."); }},
      {"tokenizer t.json: a.big is not an integer of 64 bits", [&] { r.integer(a, "big", "a."); }},
      {"tokenizer t.json: a.neg is not a non-negative integer", [&] { r.unsigned_integer(a, "neg", "a."); }},
      {"tokenizer t.json: a.h = \"xyz\" is not 16 hex digits", [&] { r.hex64(a, "h", "a."); }},
      {"tokenizer t.json: a.f is not true or false", [&] { r.flag(a, "f", "a.", false); }},
      {"tokenizer t.json: a.s.x is missing", [&] { r.at(a.at("s"), "x", "a.s."); }},  // not an object
  };
  for (const auto& [want, read] : cases) EXPECT_EQ(error_of(read), want);
}

}  // namespace
}  // namespace tessera
