// Layer kernels/ref: the scalar, double-accumulating oracle of every op and its shape contract.
// It knows nothing of models, parameters or processes: pointers and sizes in, numbers out.
//
// Reference linear layer without bias, weights in PyTorch's (out, in) layout: y = x w^T.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// y (M,N) = x (M,K) . w (N,K)^T.
void linear_forward(float* y, const float* x, const float* w, int64_t M, int64_t N, int64_t K);
// dx (M,K) = dy (M,N) . w (overwritten, or added to when accumulate_dx; skipped when dx is null);
// dw (N,K) += dy^T . x.
void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t M, int64_t N,
                     int64_t K, bool accumulate_dx);

}  // namespace tessera::kernels::ref
