// JsonKeys: each typed read, nested objects and list elements, and each failure naming the
// origin and the key's full path.
#include "core/json_keys.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/error.h"

namespace tessera {
namespace {

using nlohmann::json;

// The message of what `read` throws; "" when it throws nothing.
std::string error_of(const std::function<void()>& read) {
  try {
    read();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonKeys, ReadsEachType) {
  const json j = parse_json_or_throw(R"({"s": "text", "i": -5, "u": 18446744073709551615, "x": 2.5,
      "h": "00000000deadbeef", "t": true, "n": null, "l": [1, {"k": "v"}], "o": {"p": {"q": 7}}})");
  const JsonKeys top(j, "file.json");
  EXPECT_EQ(top.string("s"), "text");
  EXPECT_EQ(top.integer("i"), -5);
  EXPECT_EQ(top.integer("i", -5, -5), -5);
  EXPECT_EQ(top.unsigned_integer("u"), UINT64_MAX);
  EXPECT_EQ(top.number("x"), 2.5);
  EXPECT_EQ(top.number("i"), -5.0);  // an integer is a number
  EXPECT_EQ(top.hex64("h"), 0xdeadbeefull);
  EXPECT_TRUE(top.flag("t", false));
  EXPECT_TRUE(top.flag("n", true));  // null reads as missing
  EXPECT_FALSE(top.flag("absent", false));
  EXPECT_TRUE(top.contains("n"));
  EXPECT_FALSE(top.has("n"));
  EXPECT_EQ(top.array("l").size(), 2u);
  EXPECT_EQ(top.element("l", 1).string("k"), "v");
  EXPECT_EQ(top.object("o").object("p").integer("q"), 7);
  EXPECT_EQ(top.object("o").object("p").where(), "o.p.");
  EXPECT_EQ(&top.at("s"), &j.at("s"));
}

TEST(JsonKeys, FailuresNameTheOriginAndTheKeyPath) {
  const json j = parse_json_or_throw(R"({"a": {"s": 1, "i": "1", "big": 9223372036854775808, "neg": -1,
      "h": "XYZ", "h17": "00000000000000000", "f": 0, "l": [3, {"m": 1}], "o": {}}})");
  const JsonKeys a = JsonKeys(j, "tokenizer t.json").object("a");
  const std::pair<std::string, std::function<void()>> cases[] = {
      {"tokenizer t.json: a.missing is missing", [&] { a.at("missing"); }},
      {"tokenizer t.json: a.s is not a string", [&] { a.string("s"); }},
      {"tokenizer t.json: a.i is not an integer of 64 bits", [&] { a.integer("i"); }},
      {"tokenizer t.json: a.big is not an integer of 64 bits", [&] { a.integer("big"); }},
      {"tokenizer t.json: a.neg = -1 is outside [0, 9]", [&] { a.integer("neg", 0, 9); }},
      {"tokenizer t.json: a.neg is not a non-negative integer", [&] { a.unsigned_integer("neg"); }},
      {"tokenizer t.json: a.s.x is missing", [&] { JsonKeys(a.at("s"), a.origin(), "a.s.").at("x"); }},
      {"tokenizer t.json: a.i is not a number", [&] { a.number("i"); }},
      {"tokenizer t.json: a.h = \"XYZ\" is not 1 to 16 lowercase hex digits", [&] { a.hex64("h"); }},
      {"tokenizer t.json: a.h17 = \"00000000000000000\" is not 1 to 16 lowercase hex digits", [&] { a.hex64("h17"); }},
      {"tokenizer t.json: a.f is not true or false", [&] { a.flag("f", false); }},
      {"tokenizer t.json: a.o is not a list", [&] { a.array("o"); }},
      {"tokenizer t.json: a.l is not an object", [&] { a.object("l"); }},
      {"tokenizer t.json: a.l[0] is not an object", [&] { a.element("l", 0); }},
      {"tokenizer t.json: a.l[2] is missing", [&] { a.element("l", 2); }},
      {"tokenizer t.json: a.l[1].m is not a string", [&] { a.element("l", 1).string("m"); }},
  };
  for (const auto& [want, read] : cases) EXPECT_EQ(error_of(read), want);
}

}  // namespace
}  // namespace tessera
