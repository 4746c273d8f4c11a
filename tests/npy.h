// Minimal NumPy .npy writer (format 1.0, little-endian, C order) for handing tensors to the
// PyTorch reference through files.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace tessera::testing {

inline void write_npy(const std::string& path, const char* descr, const void* data, size_t elem_size,
                      const std::vector<int64_t>& shape) {
  std::string dims;
  size_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ",";
    n *= static_cast<size_t>(d);
  }
  if (shape.size() > 1) dims.pop_back();  // "(3,)" for 1-D, "(2,3)" otherwise
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n * elem_size));
}

inline void write_npy(const std::string& path, const std::vector<float>& v, const std::vector<int64_t>& shape) {
  write_npy(path, "<f4", v.data(), sizeof(float), shape);
}
inline void write_npy(const std::string& path, const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  write_npy(path, "<i4", v.data(), sizeof(int32_t), shape);
}

}  // namespace tessera::testing
