// Layer fsdp: the row-sparse reduction of an embedding table's gradient.
//
// A lookup's backward writes the rows of the token ids the batch holds and leaves the others
// zero: a batch of 2048 tokens touches at most 2048 of a 32000-token table's rows. Rather than
// reduce the whole table, the ranks exchange a bitmask of their rows that are not all zero bits,
// pack the union's rows to the front of the gradient, all-reduce those, and unpack (a row no rank
// wrote is +0.0 on every rank, so its sum is +0.0: the result is the dense reduction's).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::fsdp {

// Bit r % 32 of word r / 32 set when row r of the rows x width matrix g holds any bit set (-0.0
// counts: a row left out must be +0.0 on every rank).
std::vector<uint32_t> nonzero_rows(const float* g, int64_t rows, int64_t width);

// The rows whose bit is set in any of n masks of `words` words each, back to back, ascending.
std::vector<int64_t> union_rows(const uint32_t* masks, int n, int64_t words, int64_t rows);

// Moves row rows[k] of g to row k, for k = 0, 1, ... (rows ascending, so no row is overwritten
// before it moves).
void pack_rows(float* g, const std::vector<int64_t>& rows, int64_t width);

// The inverse of pack_rows: row k back to row rows[k], every other row of the first `total` rows
// zeroed.
void unpack_rows(float* g, const std::vector<int64_t>& rows, int64_t width, int64_t total);

}  // namespace tessera::fsdp
