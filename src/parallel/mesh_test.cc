// The mesh: rank arithmetic for every layout of 1-8 ranks, the groups of 2x2x2 layouts, the
// config's strategies as dimensions, the refusals, and live groups whose all-reduce on each
// dimension sums exactly the ranks that dimension names.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comm/test_util.h"
#include "config/config.h"
#include "core/error.h"

namespace tessera::parallel {
namespace {

using Groups = std::set<std::vector<int>>;

Groups groups_of(const ParallelDims& d, Dim dim) {
  Groups out;
  for (int r = 0; r < d.world(); ++r) out.insert(group_ranks(d, r, dim));
  return out;
}

std::vector<ParallelDims> every_layout(int world) {
  std::vector<ParallelDims> out;
  for (int pp = 1; pp <= world; ++pp)
    for (int dpr = 1; dpr <= world; ++dpr)
      for (int dps = 1; dps <= world; ++dps)
        for (int tp = 1; tp <= world; ++tp)
          if (pp * dpr * dps * tp == world) out.push_back({pp, dpr, dps, tp});
  return out;
}

TEST(ParallelDims, EveryLayoutOfUpToEightRanksPartitionsTheRanks) {
  int layouts = 0;
  for (int world = 1; world <= 8; ++world) {
    for (const ParallelDims& d : every_layout(world)) {
      ++layouts;
      SCOPED_TRACE(d.to_string());
      std::set<std::tuple<int, int, int, int>> coords;
      for (int r = 0; r < world; ++r) {
        coords.insert({coordinate(d, r, Dim::kPp), coordinate(d, r, Dim::kDpReplicate), coordinate(d, r, Dim::kDpShard),
                       coordinate(d, r, Dim::kTp)});
        for (const Dim dim : kAllDims) {
          const std::vector<int> g = group_ranks(d, r, dim);
          ASSERT_EQ(static_cast<int>(g.size()), d.size(dim)) << name(dim);
          ASSERT_EQ(g[static_cast<size_t>(coordinate(d, r, dim))], r) << name(dim) << " rank " << r;
          for (int member : g) EXPECT_EQ(group_ranks(d, member, dim), g) << name(dim);  // the same group
        }
        // tp is innermost: a tensor-parallel group is consecutive ranks.
        const std::vector<int> tp = group_ranks(d, r, Dim::kTp);
        EXPECT_EQ(tp.back() - tp.front(), d.tp - 1);
      }
      EXPECT_EQ(static_cast<int>(coords.size()), world) << "coordinates name each rank once";
      for (const Dim dim : kAllDims) {
        const Groups g = groups_of(d, dim);
        EXPECT_EQ(static_cast<int>(g.size()) * d.size(dim), world) << name(dim);
      }
    }
  }
  EXPECT_EQ(layouts, 1 + 4 + 4 + 10 + 4 + 16 + 4 + 20);  // ordered 4-factorizations of 1..8
}

TEST(ParallelDims, PipelineDataTensorTwoByTwoByTwo) {
  const ParallelDims d{2, 1, 2, 2};
  EXPECT_EQ(groups_of(d, Dim::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(groups_of(d, Dim::kDpShard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(d, Dim::kDp), groups_of(d, Dim::kDpShard));
  EXPECT_EQ(groups_of(d, Dim::kPp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(groups_of(d, Dim::kDpReplicate), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(coordinate(d, 6, Dim::kPp), 1);
  EXPECT_EQ(coordinate(d, 6, Dim::kDpShard), 1);
  EXPECT_EQ(coordinate(d, 6, Dim::kTp), 0);
}

TEST(ParallelDims, HybridShardInsideDataParallelWithTensorParallel) {
  const ParallelDims d{1, 2, 2, 2};
  EXPECT_EQ(groups_of(d, Dim::kDp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(groups_of(d, Dim::kDpShard), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups_of(d, Dim::kDpReplicate), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(groups_of(d, Dim::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(coordinate(d, 5, Dim::kDp), 2);  // replica 1, shard 0
  EXPECT_EQ(describe_layout(d)[1], "dp (2 groups of 4): [0 2 4 6] [1 3 5 7]");
}

config::Config with(const std::string& strategy, int nproc, int group = 0, int tensor = 1, int pipeline = 1) {
  return config::load("", {{"parallel.strategy", strategy},
                           {"parallel.nproc", std::to_string(nproc)},
                           {"parallel.tensor", std::to_string(tensor)},
                           {"parallel.pipeline", std::to_string(pipeline)},
                           {"checkpoint.interval_minutes", "0"},
                           {"checkpoint.save_final", "false"},
                           {"parallel.shard_group_size", std::to_string(group)},
                           {"train.batch_size", "48"}});
}

TEST(ParallelDims, StrategiesFillTheDataParallelDimensions) {
  EXPECT_EQ(dims_for(with("full_shard", 4), 4), (ParallelDims{1, 1, 4, 1}));
  EXPECT_EQ(dims_for(with("shard_grad_op", 4), 4), (ParallelDims{1, 1, 4, 1}));
  EXPECT_EQ(dims_for(with("hybrid_shard", 8, 2), 8), (ParallelDims{1, 4, 2, 1}));
  EXPECT_EQ(dims_for(with("hybrid_shard", 4, 0), 4), (ParallelDims{1, 1, 4, 1}));
  EXPECT_EQ(dims_for(with("no_shard", 3), 3), (ParallelDims{1, 3, 1, 1}));
  EXPECT_EQ(dims_for(with("full_shard", 1), 1), (ParallelDims{}));
  // parallel.tensor takes the innermost ranks; the strategy fills the rest.
  EXPECT_EQ(dims_for(with("full_shard", 8, 0, 2), 8), (ParallelDims{1, 1, 4, 2}));
  EXPECT_EQ(dims_for(with("hybrid_shard", 8, 2, 2), 8), (ParallelDims{1, 2, 2, 2}));
  EXPECT_EQ(dims_for(with("no_shard", 8, 0, 4), 8), (ParallelDims{1, 2, 1, 4}));
  EXPECT_EQ(dims_for(with("shard_grad_op", 4, 0, 4), 4), (ParallelDims{1, 1, 1, 4}));
  // parallel.pipeline takes the outermost.
  EXPECT_EQ(dims_for(with("full_shard", 8, 0, 2, 2), 8), (ParallelDims{2, 1, 2, 2}));
  EXPECT_EQ(dims_for(with("hybrid_shard", 8, 1, 1, 2), 8), (ParallelDims{2, 4, 1, 1}));
}

TEST(ParallelDims, RefusesABadProductOrSizeNamingTheNumbers) {
  try {
    ParallelDims{2, 1, 2, 1}.validate(8);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), kExitConfig);
    EXPECT_NE(std::string(e.what()).find("pp 2 x dp_replicate 1 x dp_shard 2 x tp 1 = 4 ranks: the product must be "
                                         "the world size, 8 (parallel.nproc)"),
              std::string::npos)
        << e.what();
  }
  try {
    ParallelDims{1, 0, 4, 1}.validate(0);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp_replicate = 0 must be >= 1"), std::string::npos) << e.what();
  }
  // A hybrid group that does not divide the ranks a job really has (an elastic launch's world).
  try {
    dims_for(with("hybrid_shard", 4, 2), 3);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.shard_group_size = 2 must divide the 3 data-parallel ranks"),
              std::string::npos)
        << e.what();
  }
  // A tensor-parallel group that does not divide an elastic launch's world.
  try {
    dims_for(with("full_shard", 4, 0, 2), 3);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tensor = 2 must divide the 3 ranks"), std::string::npos) << e.what();
  }
}

TEST(Mesh, SingleProcessHasNoGroups) {
  const Mesh& m = Mesh::single();
  for (const Dim d : kAllDims) {
    EXPECT_EQ(m.size(d), 1);
    EXPECT_EQ(m.rank(d), 0);
    EXPECT_EQ(m.group(d), nullptr);
  }
}

// Every rank builds the mesh; on each dimension its group all-reduces 2^rank (exact in fp32 up to
// 24 ranks): the sum must be exactly the bits of the ranks that dimension names, and the group's
// own rank and size must be the mesh's.
void expect_exact_sums_on_every_dimension(const ParallelDims& dims) {
  comm::test_util::TempDir dir;
  const auto status = comm::test_util::run_ranks(
      dims.world(),
      [&](int rank) {
        const Mesh mesh(
            dims, rank,
            [&](const std::string& prefix) { return comm::make_file_store(dir.path, "mesh-job", "0." + prefix); },
            comm::Millis(20000));
        for (const Dim d : kAllDims) {
          comm::ProcessGroup* g = mesh.group(d);
          REQUIRE((g == nullptr) == (mesh.size(d) == 1));
          float expected = 0.0f;
          for (int r : mesh.ranks(d)) expected += static_cast<float>(1 << r);
          float value = static_cast<float>(1 << rank);
          if (g != nullptr) {
            REQUIRE(g->rank() == mesh.rank(d) && g->size() == mesh.size(d));
            g->all_reduce(&value, 1, comm::DType::kF32, {comm::Millis(20000)})->wait();
          }
          if (value != expected) {
            std::fprintf(stderr, "[rank %d] %s: sum %g, expected %g\n", rank, name(d), value, expected);
            return 1;
          }
        }
        return 0;
      },
      60);
  comm::test_util::expect_all_ok(status);
}

TEST(Mesh, AllReduceOnEachDimensionPipelineDataTensor) { expect_exact_sums_on_every_dimension({2, 1, 2, 2}); }

TEST(Mesh, AllReduceOnEachDimensionHybridWithTensorParallel) { expect_exact_sums_on_every_dimension({1, 2, 2, 2}); }

TEST(Mesh, AllReduceOnEachDimensionHybridShard) { expect_exact_sums_on_every_dimension({1, 3, 2, 1}); }

}  // namespace
}  // namespace tessera::parallel
