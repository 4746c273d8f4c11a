// Counter-based random numbers: value i of stream s under seed k is a pure function of (k, s, i),
// so any slice of a tensor (a rank's shard, say) can be initialized without generating the rest,
// and results never depend on the standard library's distributions.
#pragma once

#include <cmath>
#include <cstdint>

namespace tessera::rng {

inline uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix(mix(seed ^ mix(stream)) + index);
}

// Uniform in (0, 1): never exactly 0, so log() is safe.
inline double uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(bits(seed, stream, index) >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal by Box-Muller over two independent uniforms.
inline double normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = uniform(seed, stream, 2 * index), u2 = uniform(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace tessera::rng
