// Reference RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, per row of C channels.
#pragma once

#include <cstdint>

namespace tessera::kernels::ref {

// out (n,C), rstd (n) = 1/sqrt(mean(x^2)+eps), x (n,C), weight (C). out may not alias x.
void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t n, int64_t C, float eps);
// dx (n,C) += d/dx, dweight (C) += d/dweight; dout (n,C); rstd from the forward.
void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                       const float* rstd, int64_t n, int64_t C);

}  // namespace tessera::kernels::ref
