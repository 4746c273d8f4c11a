// safetensors: exact round trip, exact widening of 16-bit floats, and hostile files rejected with the file and tensor named.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_test_util.h"
#include "core/error.h"

namespace tessera::checkpoint {
namespace {

using test_util::write_16bit;

std::string path_of(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
}

std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, RoundTripIsExact) {
  std::vector<NamedTensor> in = {{"a.weight", {2, 3}, {1, -2, 3.5f, 1e-30f, -0.0f, 7}}, {"b", {4}, {0, 1, 2, 3}},
                                 {"empty", {0, 5}, {}}};
  const std::string p = path_of("rt.safetensors");
  write_safetensors(p, in);
  const auto out = read_safetensors(p);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].name, in[i].name);
    EXPECT_EQ(out[i].shape, in[i].shape);
    ASSERT_EQ(out[i].data.size(), in[i].data.size());
    if (!in[i].data.empty()) {  // bitwise, so -0.0 and denormals count
      EXPECT_EQ(std::memcmp(out[i].data.data(), in[i].data.data(), in[i].data.size() * 4), 0);
    }
  }
}

// BF16 stores each value rounded to nearest even (core/bf16.h): read back, exactly the rounding,
// in half the bytes. Ties go to even, NaN stays NaN, past bf16's largest finite is infinite.
TEST(Safetensors, Bfloat16StoresTheRoundingOfEachValue) {
  const float tie_down = std::bit_cast<float>(0x3f808000u);  // 1 + 2^-8: halfway, to the even 1.0
  const float tie_up = std::bit_cast<float>(0x3f818000u);    // halfway again, to the even 1 + 2^-6
  std::vector<NamedTensor> in = {{"w",
                                  {3, 3},
                                  {1, tie_down, tie_up, 3.14159265f, -0.0f, 1e-40f, 3.4e38f,
                                   std::numeric_limits<float>::infinity(), std::nanf("")}},
                                 {"empty", {0}, {}}};
  const std::string p = path_of("bf16.safetensors");
  write_safetensors(p, in, {}, StoredDtype::kBF16);
  const auto out = read_safetensors(p);
  ASSERT_EQ(out.size(), 2u);
  const NamedTensor& w = out[0].name == "w" ? out[0] : out[1];
  ASSERT_EQ(w.data.size(), 9u);
  const std::vector<uint32_t> want = {0x3f800000u, 0x3f800000u, 0x3f820000u, 0x40490000u,
                                      0x80000000u, 0x00010000u, 0x7f800000u, 0x7f800000u};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(std::bit_cast<uint32_t>(w.data[i]), want[i]) << i;
  EXPECT_TRUE(std::isnan(w.data[8]));
  const auto file_bytes = std::filesystem::file_size(p);
  uint64_t header = 0;
  std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
  EXPECT_EQ(file_bytes, 8 + header + 9 * 2);
}

TEST(Safetensors, HostileFilesAreRejectedWithNames) {
  const std::string p = path_of("bad.safetensors");
  write_raw(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8);
  EXPECT_NE(read_error(p).find("tensor t: data_offsets [0, 16) outside"), std::string::npos);
  write_raw(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16);
  EXPECT_NE(read_error(p).find("do not match the shape"), std::string::npos);
  write_raw(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[1000000000000,1000000000],\"data_offsets\":[0,16]}}", 16);
  EXPECT_NE(read_error(p).find("shape larger than the file"), std::string::npos);
  write_raw(p, "{\"t\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
  EXPECT_NE(read_error(p).find("not supported"), std::string::npos);
  write_raw(p, "{not json", 0);
  EXPECT_NE(read_error(p).find("not valid JSON"), std::string::npos);
  {
    std::ofstream out(p, std::ios::binary);
    const uint64_t huge = uint64_t{1} << 60;  // header length far beyond the file
    out.write(reinterpret_cast<const char*>(&huge), 8);
  }
  EXPECT_NE(read_error(p).find("exceeds the file size"), std::string::npos);
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_NE(read_error(p).find("too short"), std::string::npos);
}

TEST(Safetensors, HalfAndBfloat16WidenExactly) {
  // F16: 1, -2, smallest subnormal, largest subnormal, largest normal, -0, +inf, 1/3 rounded.
  const std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x0001, 0x03ff, 0x7bff, 0x8000, 0x7c00, 0x3555};
  const std::vector<float> f16_want = {1.0f, -2.0f, std::ldexp(1.0f, -24), 1023 * std::ldexp(1.0f, -24), 65504.0f,
                                       -0.0f, INFINITY, 0x1.554p-2f};
  const std::vector<uint16_t> bf16 = {0x3f80, 0xc040, 0x0001, 0x7f7f, 0x8000, 0x3eab};
  std::vector<float> bf16_want;
  for (uint16_t b : bf16) bf16_want.push_back(std::bit_cast<float>(static_cast<uint32_t>(b) << 16));
  EXPECT_EQ(bf16_want[1], -3.0f);
  write_16bit(path_of("h.safetensors"), "F16", {{NamedTensor{"h", {2, 4}, {}}, f16}});
  write_16bit(path_of("b.safetensors"), "BF16", {{NamedTensor{"b", {6}, {}}, bf16}});
  const auto h = read_safetensors(path_of("h.safetensors"));
  const auto b = read_safetensors(path_of("b.safetensors"));
  ASSERT_EQ(h.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(h[0].shape, (std::vector<int64_t>{2, 4}));
  ASSERT_EQ(h[0].data.size(), f16_want.size());
  EXPECT_EQ(std::memcmp(h[0].data.data(), f16_want.data(), 4 * f16_want.size()), 0);
  ASSERT_EQ(b[0].data.size(), bf16_want.size());
  EXPECT_EQ(std::memcmp(b[0].data.data(), bf16_want.data(), 4 * bf16_want.size()), 0);
  // Past the reader's staging chunk (2^20 elements), every bit pattern, NaNs included, widens.
  std::vector<uint16_t> many((1 << 20) + 3);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<uint16_t>(i * 40503u);
  write_16bit(path_of("many.safetensors"), "BF16", {{NamedTensor{"m", {static_cast<int64_t>(many.size())}, {}}, many}});
  const auto m = read_safetensors(path_of("many.safetensors"));
  ASSERT_EQ(m[0].data.size(), many.size());
  for (size_t i = 0; i < many.size(); ++i) {
    if (std::bit_cast<uint32_t>(m[0].data[i]) != static_cast<uint32_t>(many[i]) << 16) {
      ADD_FAILURE() << "element " << i;
      break;
    }
  }
  // The size check counts 2 bytes per element: 6 elements' bytes for a shape of 3 are rejected.
  write_16bit(path_of("bad16.safetensors"), "BF16", {{NamedTensor{"b", {3}, {}}, bf16}});
  try {
    read_safetensors(path_of("bad16.safetensors"));
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad16.safetensors: tensor b: data_offsets do not match"), std::string::npos)
        << e.what();
  }
}

// Found by fuzz/safetensors_fuzz: a zero dimension let the others through unchecked, and
// 18302063728017015298 became a negative int64 in the shape.
TEST(Safetensors, ShapesBeyondInt64AreRejected) {
  const std::string p = path_of("dims.safetensors");
  write_raw(p,
            "{\"t0\":{\"dtype\":\"F32\",\"shape\":[0,3619201952010731520,18302063728017015298,1],"
            "\"data_offsets\":[0,0]}}",
            0);
  EXPECT_NE(read_error(p).find("tensor t0: shape product overflows int64"), std::string::npos);
  write_raw(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808,0],\"data_offsets\":[0,0]}}", 0);
  EXPECT_NE(read_error(p).find("overflows int64"), std::string::npos);
  write_raw(p, "{\"t\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775807],\"data_offsets\":[0,0]}}", 0);
  const auto ok = read_safetensors(p);  // the largest dimension an int64 holds is fine
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].shape, (std::vector<int64_t>{0, INT64_MAX}));
}

// Tensors sharing bytes would let a small file claim (and allocate) its data many times over.
TEST(Safetensors, DataMustBeTiledExactly) {
  const std::string p = path_of("tiling.safetensors");
  write_raw(p,
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
            8);
  EXPECT_NE(read_error(p).find("overlap"), std::string::npos);
  write_raw(p,
            "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
            12);
  EXPECT_NE(read_error(p).find("tensor b: data_offsets [4, 12) overlap"), std::string::npos);
  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
  EXPECT_NE(read_error(p).find("no tensor holds data bytes [0, 4)"), std::string::npos);
  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8);
  EXPECT_NE(read_error(p).find("no tensor holds data bytes [4, 8)"), std::string::npos);
  // Out of order in the header, empty tensors anywhere: fine.
  write_raw(p,
            "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
            "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
            8);
  EXPECT_EQ(read_safetensors(p).size(), 3u);
}

TEST(Safetensors, OversizedHeaderIsRejectedBeforeAllocation) {
  const std::string p = path_of("big-header.safetensors");
  {
    std::ofstream out(p, std::ios::binary);
    const uint64_t n = 100'000'001;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  std::filesystem::resize_file(p, 8 + 100'000'001);  // sparse: costs no disk
  EXPECT_NE(read_error(p).find("exceeds the format's limit"), std::string::npos);
}

// A dtype nested 200000 deep used to be echoed with dump(), which recursed off the stack.
TEST(Safetensors, DeeplyNestedDtypeIsRejected) {
  const std::string p = path_of("deep.safetensors");
  const size_t depth = 200000;
  write_raw(p,
            "{\"t\":{\"dtype\":" + std::string(depth, '[') + std::string(depth, ']') +
                ",\"shape\":[],\"data_offsets\":[0,4]}}",
            4);
  EXPECT_NE(read_error(p).find("tensor t: dtype is not a string"), std::string::npos);
}

TEST(Safetensors, UnwritableDirectoryIsAnIoError) {
  EXPECT_THROW(write_safetensors("/nonexistent-dir/x.safetensors", {}), IoError);
}

}  // namespace
}  // namespace tessera::checkpoint
