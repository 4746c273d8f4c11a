// safetensors: exact round trip, and hostile files rejected with the file and tensor named.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
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

TEST(Safetensors, UnwritableDirectoryIsAnIoError) {
  EXPECT_THROW(write_safetensors("/nonexistent-dir/x.safetensors", {}), IoError);
}

}  // namespace
}  // namespace tessera::checkpoint
