// safetensors: exact round trip, and hostile files rejected with the file and tensor named.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tessera::checkpoint {
namespace {

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
