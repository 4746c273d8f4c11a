// The CUDA backend (kernels/backend.h) over one device: its memory from cudaMalloc (never managed
// memory), one compute stream that every op is queued on, cuBLASLt for the GEMMs.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace tessera::kernels::cuda {

// Makes the device current on the calling thread, which then runs the backend's ops (the model's
// thread). Throws std::runtime_error naming the device and the runtime's reason when it cannot.
std::unique_ptr<Backend> make_backend(const CudaOptions& options);

}  // namespace tessera::kernels::cuda
