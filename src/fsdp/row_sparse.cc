// The row-sparse reduction's packing.
#include "fsdp/row_sparse.h"

#include <cstring>

#include "core/check.h"

namespace tessera::fsdp {

std::vector<uint32_t> nonzero_rows(const float* g, int64_t rows, int64_t width) {
  std::vector<uint32_t> mask((rows + 31) / 32, 0u);
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(g + r * width);
    uint32_t bits = 0;
    // A touched row usually shows a bit in its first 16 floats; an untouched one is read whole.
    for (int64_t j = 0; j < width && bits == 0; j += 16) {
      const int64_t end = j + 16 < width ? j + 16 : width;
      for (int64_t i = j; i < end; ++i) bits |= row[i];
    }
    if (bits != 0) mask[r / 32] |= 1u << (r % 32);
  }
  return mask;
}

std::vector<int64_t> union_rows(const uint32_t* masks, int n, int64_t words, int64_t rows) {
  CHECK(words * 32 >= rows);
  std::vector<int64_t> out;
  for (int64_t w = 0; w < words; ++w) {
    uint32_t bits = 0;
    for (int i = 0; i < n; ++i) bits |= masks[i * words + w];
    for (; bits != 0; bits &= bits - 1) {
      const int64_t r = w * 32 + __builtin_ctz(bits);
      CHECK_MSG(r < rows, "a row mask names a row past the table");
      out.push_back(r);
    }
  }
  return out;
}

void pack_rows(float* g, const std::vector<int64_t>& rows, int64_t width) {
  for (size_t k = 0; k < rows.size(); ++k) {
    if (rows[k] != static_cast<int64_t>(k)) std::memcpy(g + k * width, g + rows[k] * width, sizeof(float) * width);
  }
}

void unpack_rows(float* g, const std::vector<int64_t>& rows, int64_t width, int64_t total) {
  // From the last row down: row k moves to rows[k] >= k, past every packed row still to move.
  int64_t end = total;  // rows [rows[k] + 1, end) are zeroed once row k is in place
  for (size_t k = rows.size(); k-- > 0;) {
    const int64_t r = rows[k];
    if (r != static_cast<int64_t>(k)) std::memcpy(g + r * width, g + k * width, sizeof(float) * width);
    std::memset(g + (r + 1) * width, 0, sizeof(float) * width * (end - r - 1));
    end = r;
  }
  std::memset(g, 0, sizeof(float) * width * end);
}

}  // namespace tessera::fsdp
