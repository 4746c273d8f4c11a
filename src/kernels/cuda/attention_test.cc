// CUDA attention, fp32 and bf16 tensor-core variants, against kernels/ref/attention on random
// inputs: MHA and GQA, every supported head dim, sequence lengths on and off the 64-row tiles;
// backward bit for bit reproducible; an unsupported head dim refused. Skipped without a device.
//
// Tolerances. Inputs are unit normals, so scaled scores are O(1) (a D-term dot over sqrt(D)) and a
// float dot of K terms errs by about u sqrt(K) times the terms' size (u = 2^-24; kernels/cpu/
// cpu_vs_ref_test.cc derives it); expf and logf add 2 ulp (CUDA's bounds); the ref is exact to
// double. Forward: out is a convex combination of values of size ~1 and lse ~ log T + O(1) <= ~10,
// so both err by a few u sqrt(T) * 10 ~ 1e-5 at worst (1e-6 seen in an fp32 emulation): atol 2e-5,
// rtol 1e-4. Backward: dout . v and dout . out are D-term dots of size ~sqrt(D) <= 11, their
// difference is scaled by p and summed over up to G * T = 1542 (query, head) pairs into gradients
// of size <= ~10: u sqrt(1542) * 10 * a few ~ 5e-5 at worst (1e-5 seen): atol 1e-4, rtol 1e-4. A
// wrong index, a lost tile or a wrong scale gives errors of order one.
#include "kernels/cuda/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/test_util.h"
#include "kernels/ref/attention.h"

namespace tessera::kernels::cuda {
namespace {

using testing::all_close;
using testing::DeviceBuffer;
using testing::random_floats;

struct Shape {
  int64_t B, T, H, Hkv, D;
  int64_t qkv_floats() const { return B * T * (H + 2 * Hkv) * D; }
  int64_t out_floats() const { return B * T * H * D; }
  int64_t lse_floats() const { return B * H * T; }
};

std::string shape_name(const Shape& s) {
  // fmt-free and without chained operator+ (GCC 12 at -O3 warns falsely, -Wrestrict, on those).
  std::string name;
  for (const auto& [key, value] :
       {std::pair<const char*, int64_t>{"B", s.B}, {"_T", s.T}, {"_H", s.H}, {"_Hkv", s.Hkv}, {"_D", s.D}}) {
    name.append(key).append(std::to_string(value));
  }
  return name;
}

void PrintTo(const Shape& s, std::ostream* os) { *os << shape_name(s); }

struct Outputs {
  std::vector<float> out, lse, dqkv;
};

// Forward, then backward from the device's own out and lse. Outputs start as NaN, so any element a
// kernel leaves unwritten fails the comparison.
Outputs run_cuda(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout, bool bf16) {
  DeviceBuffer<float> d_qkv(qkv), d_dout(dout);
  DeviceBuffer<float> out(std::vector<float>(s.out_floats(), NAN)), lse(std::vector<float>(s.lse_floats(), NAN));
  DeviceBuffer<float> dqkv(std::vector<float>(s.qkv_floats(), NAN));
  DeviceBuffer<float> workspace(static_cast<size_t>(attention_backward_workspace_floats(s.B, s.T, s.H)));
  attention_forward(out.get(), lse.get(), d_qkv.get(), s.B, s.T, s.H, s.Hkv, s.D, bf16, nullptr);
  attention_backward(dqkv.get(), d_dout.get(), d_qkv.get(), out.get(), lse.get(), s.B, s.T, s.H, s.Hkv, s.D, bf16,
                     workspace.get(), nullptr);
  return Outputs{out.download(), lse.download(), dqkv.download()};
}

Outputs run_ref(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  Outputs r{std::vector<float>(s.out_floats()), std::vector<float>(s.lse_floats()), std::vector<float>(s.qkv_floats())};
  ref::attention_forward(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.H, s.Hkv, s.D);
  ref::attention_backward(r.dqkv.data(), dout.data(), qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H, s.Hkv,
                          s.D);
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class CudaAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaAttention, MatchesRef) {
  REQUIRE_CUDA_DEVICE();
  const Shape s = GetParam();
  const auto qkv = random_floats(static_cast<size_t>(s.qkv_floats()), 11);
  const auto dout = random_floats(static_cast<size_t>(s.out_floats()), 12);
  const Outputs got = run_cuda(s, qkv, dout, false), want = run_ref(s, qkv, dout);
  EXPECT_TRUE(all_close(got.out, want.out, 2e-5f, 1e-4f)) << "out";
  EXPECT_TRUE(all_close(got.lse, want.lse, 2e-5f, 1e-4f)) << "lse";
  EXPECT_TRUE(all_close(got.dqkv, want.dqkv, 1e-4f, 1e-4f)) << "dqkv";
}

// The tensor-core variant against the same fp32 reference. Its operands are rounded to bf16
// (relative error 2^-9): scores of size O(1) err by about 2^-9 sqrt(2) per unit of their D-term
// dot over sqrt(D), ~4e-3, which moves lse by as much and out (convex combinations of values of size
// ~1, the probabilities rounded again) by ~1e-2; the gradients, sums over up to G * T pairs of
// products of bf16-rounded probabilities, score gradients and values, by a few times that. Seen
// at most (fp32 emulation of the tensor cores): out 1.3e-2, lse 8.5e-3, dqkv 2.5e-2. Bounds out and
// lse 2e-2 + 2e-2 |want|, dqkv 5e-2 + 5e-2 |want|; a wrong mask, head or scale errs by order one.
TEST_P(CudaAttention, Bf16MatchesRef) {
  REQUIRE_CUDA_DEVICE();
  const Shape s = GetParam();
  const auto qkv = random_floats(static_cast<size_t>(s.qkv_floats()), 11);
  const auto dout = random_floats(static_cast<size_t>(s.out_floats()), 12);
  const Outputs got = run_cuda(s, qkv, dout, true), want = run_ref(s, qkv, dout);
  EXPECT_TRUE(all_close(got.out, want.out, 2e-2f, 2e-2f)) << "out";
  EXPECT_TRUE(all_close(got.lse, want.lse, 2e-2f, 2e-2f)) << "lse";
  EXPECT_TRUE(all_close(got.dqkv, want.dqkv, 5e-2f, 5e-2f)) << "dqkv";
}

// The bf16 forward's two tilings (attention.h: 16 or 32 query rows per warp; Bf16MatchesRef runs
// the default) within the bounds above, and bit for bit the same where both take the softmax 64 keys
// at a time (D < 128): a group of 16 rows computes the same operations in either.
TEST_P(CudaAttention, Bf16ForwardTilings) {
  REQUIRE_CUDA_DEVICE();
  const Shape s = GetParam();
  const auto qkv = random_floats(static_cast<size_t>(s.qkv_floats()), 11);
  Outputs want{std::vector<float>(s.out_floats()), std::vector<float>(s.lse_floats()), {}};
  ref::attention_forward(want.out.data(), want.lse.data(), qkv.data(), s.B, s.T, s.H, s.Hkv, s.D);
  DeviceBuffer<float> d_qkv(qkv);
  Outputs got[2];
  for (int k = 0; k < 2; ++k) {
    const int rows_per_warp = 16 * (k + 1);
    DeviceBuffer<float> out(std::vector<float>(s.out_floats(), NAN)), lse(std::vector<float>(s.lse_floats(), NAN));
    attention_forward(out.get(), lse.get(), d_qkv.get(), s.B, s.T, s.H, s.Hkv, s.D, true, nullptr, rows_per_warp);
    got[k] = Outputs{out.download(), lse.download(), {}};
    EXPECT_TRUE(all_close(got[k].out, want.out, 2e-2f, 2e-2f)) << "out, rows per warp " << rows_per_warp;
    EXPECT_TRUE(all_close(got[k].lse, want.lse, 2e-2f, 2e-2f)) << "lse, rows per warp " << rows_per_warp;
  }
  if (s.D < 128) {
    EXPECT_TRUE(same_bits(got[0].out, got[1].out)) << "out";
    EXPECT_TRUE(same_bits(got[0].lse, got[1].lse)) << "lse";
  }
}

// Every head dim meets every sequence length: one row (T = 1), a part tile (7), one whole tile
// (64), a ragged second tile (100) and a ragged fifth (257); the (H, Hkv) and B choices rotate so
// each head dim also sees GQA with groups of 4 and 6, plain MHA, and B of 1 and 2.
std::vector<Shape> shapes() {
  const int64_t dims[] = {16, 32, 64, 128}, lengths[] = {1, 7, 64, 100, 257};
  const int64_t heads[][2] = {{8, 2}, {4, 4}, {6, 1}};
  std::vector<Shape> out;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 5; ++j) {
      const auto& hv = heads[(i + j) % 3];
      out.push_back(Shape{1 + (i + j) % 2, lengths[j], hv[0], hv[1], dims[i]});
    }
  }
  out.push_back(Shape{2, 128, 8, 2, 128});  // two whole tiles, no ragged end, the largest tiles
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Shape>& p) { return shape_name(p.param); }

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(shapes()), param_name);

// No atomics anywhere: the same inputs give the same bits, forward and backward.
TEST(CudaAttentionDeterminism, SameBitsTwice) {
  REQUIRE_CUDA_DEVICE();
  const Shape s{2, 257, 8, 2, 64};
  const auto qkv = random_floats(static_cast<size_t>(s.qkv_floats()), 21);
  const auto dout = random_floats(static_cast<size_t>(s.out_floats()), 22);
  for (const bool bf16 : {false, true}) {
    const Outputs first = run_cuda(s, qkv, dout, bf16), second = run_cuda(s, qkv, dout, bf16);
    EXPECT_TRUE(same_bits(first.out, second.out)) << "bf16 " << bf16;
    EXPECT_TRUE(same_bits(first.lse, second.lse)) << "bf16 " << bf16;
    EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "bf16 " << bf16;
  }
}

// The kernels are instantiated per head dim; any other D must stop with a clear CHECK before any
// launch (null pointers: nothing may be touched first).
TEST(CudaAttentionDeathTest, UnsupportedHeadDim) {
  REQUIRE_CUDA_DEVICE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the CUDA runtime has threads: re-exec, never plain fork
  for (const bool bf16 : {false, true}) {
    EXPECT_DEATH(attention_forward(nullptr, nullptr, nullptr, 1, 8, 2, 1, 48, bf16, nullptr), "supports head dims");
    EXPECT_DEATH(
        attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 2, 1, 256, bf16, nullptr, nullptr),
        "supports head dims");
  }
}

// The bf16 forward has two tilings (16 or 32 rows per warp, 0 for the default); any other is refused
// before a launch.
TEST(CudaAttentionDeathTest, UnsupportedRowsPerWarp) {
  REQUIRE_CUDA_DEVICE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(attention_forward(nullptr, nullptr, nullptr, 1, 8, 2, 1, 64, true, nullptr, 24), "rows per warp");
}

}  // namespace
}  // namespace tessera::kernels::cuda
