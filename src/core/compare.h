// Layer core: how tests compare runs, one definition for every suite that does.
#pragma once

#include <cmath>
#include <vector>

namespace tessera {

// ||got - want|| / ||want|| over a tensor, in double.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t j = 0; j < want.size(); ++j) {
    diff += std::pow(double{got[j]} - want[j], 2);
    norm += std::pow(double{want[j]}, 2);
  }
  return std::sqrt(diff / norm);
}

}  // namespace tessera
