// Offline resharding: a committed checkpoint re-cut for another world size or strategy.
#pragma once

#include <string>

#include "config/config.h"

namespace tessera::checkpoint {

// Writes the checkpoint `src` (a committed step directory) re-cut for the world size and strategy
// of `target` (parallel.nproc, parallel.strategy, parallel.shard_group_size) as a committed
// checkpoint under dst_root (step directory and `latest`), with target's parallel settings in its
// stored config. Parameters and moments are copied exactly. Returns the new step directory.
std::string reshard(const std::string& src, const std::string& dst_root, const config::Config& target);

}  // namespace tessera::checkpoint
