// Shard files, manifests and checkpoint directories: round trips, and every kind of damage
// (flipped byte, truncation, overlapping or out-of-range tensors) is a DataError naming the file
// and tensor (RELIABILITY.md rows 5, 6 and 13).
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/object_tier.h"
#include "checkpoint/shard_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "storage/s3rver_test_util.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path = fs::path(::testing::TempDir()) / ("ckpt_test_" + std::to_string(::getpid()));
  Dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

void spit(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes; }

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i) * 0.25f;
  return v;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

TEST(ShardFile, RoundTripAndDigest) {
  Dir d;
  const auto a = iota(5, 1), b = iota(100, -3);
  const std::string path = (d.path / "s.bin").string();
  const FileDigest written = write_shard_file(path, {{"a", a.data(), a.size()}, {"b", b.data(), b.size()}, {"empty", nullptr, 0}});
  const FileDigest read = digest_file(path);
  EXPECT_EQ(written.bytes, fs::file_size(path));
  EXPECT_EQ(written.bytes, read.bytes);
  EXPECT_EQ(written.xxh64, read.xxh64);
  ShardFile f(path);
  ASSERT_EQ(f.entries().size(), 3u);
  std::vector<float> out(100);
  f.read(*f.find("b"), out.data());
  EXPECT_EQ(out, b);
  out.resize(5);
  f.read(*f.find("a"), out.data());
  EXPECT_EQ(out, a);
  EXPECT_EQ(f.find("c"), nullptr);
  for (const auto& e : f.entries()) EXPECT_EQ(e.offset % 64, 0u) << e.name;
}

TEST(ShardFile, FlippedDataByteNamesFileAndTensor) {
  Dir d;
  const auto a = iota(64, 1), b = iota(64, 2);
  const fs::path path = d.path / "s.bin";
  write_shard_file(path.string(), {{"first", a.data(), a.size()}, {"second", b.data(), b.size()}});
  std::string bytes = read_file(path);
  bytes[bytes.size() - 10] ^= 0x01;  // inside the last tensor
  spit(path, bytes);
  ShardFile f(path.string());
  std::vector<float> out(64);
  EXPECT_NO_THROW(f.read(*f.find("first"), out.data()));
  const std::string e = error_of([&] { f.read(*f.find("second"), out.data()); });
  EXPECT_NE(e.find(path.string()), std::string::npos) << e;
  EXPECT_NE(e.find("tensor second fails its checksum"), std::string::npos) << e;
}

TEST(ShardFile, EveryFlippedByteIsDetected) {
  // Header, prefix or data: a flip anywhere that matters is caught by the header checksum, the
  // parser or a tensor checksum (padding between tensors carries nothing).
  Dir d;
  const auto a = iota(3, 1);
  const fs::path path = d.path / "s.bin";
  write_shard_file(path.string(), {{"t", a.data(), a.size()}});
  const std::string good = read_file(path);
  uint64_t header = 0;
  std::memcpy(&header, good.data() + 16, 8);
  const uint64_t data_begin = good.size() - 64;  // one 64-byte aligned tensor of 12 bytes + padding
  for (size_t i = 0; i < good.size(); ++i) {
    const bool padding = (i >= 32 + header && i < data_begin) || i >= data_begin + 12;
    if (padding || (i >= 12 && i < 16)) continue;  // padding and the reserved word carry nothing
    std::string bad = good;
    bad[i] ^= 0x20;
    spit(path, bad);
    bool caught = false;
    try {
      ShardFile f(path.string());
      std::vector<float> out(3);
      const ShardEntry* e = f.find("t");
      if (e == nullptr || e->bytes != 12) {
        caught = true;
      } else {
        f.read(*e, out.data());
      }
    } catch (const DataError&) {
      caught = true;
    }
    EXPECT_TRUE(caught) << "byte " << i;
  }
}

TEST(ShardFile, TruncationsAreTypedErrors) {
  Dir d;
  const auto a = iota(40, 1);
  const fs::path path = d.path / "s.bin";
  write_shard_file(path.string(), {{"t", a.data(), a.size()}});
  const std::string good = read_file(path);
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{31}, size_t{32}, good.size() / 2, good.size() - 1}) {
    spit(path, good.substr(0, n));
    const std::string e = error_of([&] {
      ShardFile f(path.string());
      std::vector<float> out(40);
      f.read(*f.find("t"), out.data());
    });
    EXPECT_NE(e.find(path.string()), std::string::npos) << "truncated to " << n << ": " << e;
  }
}

// Rewrites a shard file with an edited header (and a matching header checksum), keeping its data
// region, to test the parser's range checks.
void rewrite_header(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = read_file(path);
  uint64_t len = 0;
  std::memcpy(&len, bytes.data() + 16, 8);
  const std::string data = bytes.substr((32 + len + 63) / 64 * 64);
  nlohmann::json h = parse_json_or_throw(bytes.substr(32, len));
  edit(h);
  const std::string text = dump_json(h);
  std::string out = bytes.substr(0, 32) + text;
  const uint64_t size = text.size(), sum = XXH64(text.data(), text.size(), 0);
  std::memcpy(out.data() + 16, &size, 8);
  std::memcpy(out.data() + 24, &sum, 8);
  out.resize((out.size() + 63) / 64 * 64, '\0');
  spit(path, out + data);
}

TEST(ShardFile, RejectsOverlapsAndOutOfRangeTensors) {
  Dir d;
  const auto a = iota(16, 1), b = iota(16, 2);
  const fs::path path = d.path / "s.bin";
  const std::string good = [&] {
    write_shard_file(path.string(), {{"a", a.data(), a.size()}, {"b", b.data(), b.size()}});
    return read_file(path);
  }();
  auto expect_rejected = [&](const char* what, const std::function<void(nlohmann::json&)>& edit, const char* needle) {
    spit(path, good);
    rewrite_header(path, edit);
    const std::string e = error_of([&] { ShardFile f(path.string()); });
    EXPECT_NE(e.find(needle), std::string::npos) << what << ": " << e;
  };
  expect_rejected("overlap", [](nlohmann::json& h) { h["tensors"][1]["offset"] = 32; }, "overlap");
  expect_rejected("beyond the end", [](nlohmann::json& h) { h["tensors"][1]["offset"] = 1u << 30; }, "beyond");
  expect_rejected("huge size", [](nlohmann::json& h) { h["tensors"][0]["bytes"] = ~uint64_t{0} - 3; }, "beyond");
  expect_rejected("odd size", [](nlohmann::json& h) { h["tensors"][0]["bytes"] = 6; }, "whole floats");
  expect_rejected("duplicate", [](nlohmann::json& h) { h["tensors"][1]["name"] = "a"; }, "twice");
  expect_rejected("negative", [](nlohmann::json& h) { h["tensors"][0]["offset"] = -64; }, "lacks");
}

TEST(ShardFile, HeaderLongerThanTheFileIsRejectedWithoutAllocating) {
  Dir d;
  const auto a = iota(4, 1);
  const fs::path path = d.path / "s.bin";
  write_shard_file(path.string(), {{"a", a.data(), a.size()}});
  std::string bytes = read_file(path);
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(bytes.data() + 16, &huge, 8);
  spit(path, bytes);
  EXPECT_NE(error_of([&] { ShardFile f(path.string()); }).find("does not fit"), std::string::npos);
}

Manifest sample_manifest() {
  Manifest m;
  m.step = 12;
  m.optimizer_steps = 11;  // one step skipped
  m.tokens = 4096;
  m.sampler_position = 48;
  m.seed = 7;
  m.lr = 1e-3;
  m.min_lr = 1e-4;
  m.warmup_steps = 2;
  m.total_steps = 100;
  m.decay = "linear";
  m.decay_steps = 20;
  m.world = 4;
  m.shard_size = 2;
  m.strategy = "hybrid_shard";
  m.config_toml = "[model]\npreset = \"tiny\"\n";
  m.created = "2026-01-01T00:00:00Z";
  m.units = {{"embedding", 0, 10, 32, {{"tok", {2, 5}, 0, -1, {2, 5}}}},
             {"head", 0, 3, 32, {{"norm", {3}, 0, -1, {3}}}}};
  m.files = {{"shard_00000.bin", 0, 0, 0, 100, 0xabc}, {"shard_00001.bin", 0, 0, 1, 200, 0xdef}};
  return m;
}

TEST(Manifest, RoundTrip) {
  const Manifest m = sample_manifest();
  const Manifest r = parse_manifest(to_json(m), "x");
  EXPECT_EQ(to_json(r), to_json(m));
  EXPECT_EQ(r.files[1].xxh64, 0xdefu);
  EXPECT_EQ(r.units[0].tensors[0].shape, (std::vector<int64_t>{2, 5}));
}

// Manifests written before skipped steps stopped counting have no optimizer_steps: their updates
// counted every step, and resuming continues them so.
TEST(Manifest, OptimizerStepsDefaultToTheStep) {
  nlohmann::json j = parse_json_or_throw(to_json(sample_manifest()));
  EXPECT_EQ(parse_manifest(dump_json(j), "M").optimizer_steps, sample_manifest().optimizer_steps);
  j.erase("optimizer_steps");
  EXPECT_EQ(parse_manifest(dump_json(j), "M").optimizer_steps, sample_manifest().step);
}

// Manifests written before train.lr_decay have a schedule without decay: warmup then cosine over
// every later step.
TEST(Manifest, ScheduleWithoutDecayReadsAsCosine) {
  nlohmann::json j = parse_json_or_throw(to_json(sample_manifest()));
  EXPECT_EQ(parse_manifest(dump_json(j), "M").decay, "linear");
  EXPECT_EQ(parse_manifest(dump_json(j), "M").decay_steps, 20);
  j["schedule"].erase("decay");
  j["schedule"].erase("decay_steps");
  EXPECT_EQ(parse_manifest(dump_json(j), "M").decay, "cosine");
  EXPECT_EQ(parse_manifest(dump_json(j), "M").decay_steps, 0);
  j["schedule"]["decay_steps"] = -1;
  EXPECT_NE(error_of([&] { parse_manifest(dump_json(j), "M"); }).find("schedule.decay_steps = -1 is outside"),
            std::string::npos);
}

// Version 1 (before tensor parallelism) has no tensor_parallel, tp_rank, split_dim or full_shape:
// it reads as tp 1, every tensor whole.
TEST(Manifest, VersionOneReadsAsOneTensorParallelRank) {
  nlohmann::json j = parse_json_or_throw(to_json(sample_manifest()));
  j["version"] = 1;
  j.erase("tensor_parallel");
  j.erase("pipeline_parallel");
  for (auto& f : j["files"]) f.erase("tp_rank"), f.erase("pp_rank");
  for (auto& u : j["units"]) {
    u.erase("pp_rank");
    for (auto& t : u["tensors"]) t.erase("split_dim"), t.erase("full_shape");
  }
  const Manifest m = parse_manifest(dump_json(j), "v1");
  EXPECT_EQ(m.tensor_parallel, 1);
  EXPECT_EQ(m.file_of(0, 0, 1)->name, "shard_00001.bin");
  EXPECT_EQ(m.units[0].tensors[0].split_dim, -1);
  EXPECT_EQ(m.units[0].tensors[0].full_shape, (std::vector<int64_t>{2, 5}));
  // Written back, it is version 2 with the same content.
  EXPECT_EQ(to_json(parse_manifest(to_json(m), "v2")), to_json(sample_manifest()));
}

// Under tensor parallelism a file is named by (tp rank, shard rank) and a tensor's whole shape is
// its block's with the split dimension tensor_parallel times as long.
TEST(Manifest, TensorParallelFieldsAreChecked) {
  Manifest m = sample_manifest();
  m.tensor_parallel = 2;
  m.units[0].tensors[0] = {"tok", {2, 5}, 0, 0, {4, 5}};
  m.files.push_back({"tp01_shard_00000.bin", 0, 1, 0, 1, 1});
  m.files.push_back({"tp01_shard_00001.bin", 0, 1, 1, 1, 1});
  const nlohmann::json good = parse_json_or_throw(to_json(m));
  EXPECT_EQ(to_json(parse_manifest(dump_json(good), "M")), to_json(m));
  auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return error_of([&] { parse_manifest(dump_json(j), "M"); });
  };
  EXPECT_NE(error_with([](auto& j) { j["units"][0]["tensors"][0]["full_shape"] = {2, 5}; })
                .find("units[0].tensors[0].full_shape is not the block's shape with dimension 0 cut among 2 tp ranks"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["units"][0]["tensors"][0]["split_dim"] = 2; }).find("split_dim = 2"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["files"].erase(3); }).find("no file for shard rank 1 of tp rank 1"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["files"][3]["tp_rank"] = 0; }).find("of tp rank 0 of stage 0 appears twice"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["units"][1]["name"] = "embedding"; }).find("\"embedding\" appears twice"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["tensor_parallel"] = 3; }).find("tensor_parallel"), std::string::npos);
}

TEST(Manifest, BadFieldsNameTheKey) {
  const nlohmann::json good = parse_json_or_throw(to_json(sample_manifest()));
  auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return error_of([&] { parse_manifest(dump_json(j), "M"); });
  };
  EXPECT_NE(error_with([](auto& j) { j.erase("step"); }).find("M: step is missing"), std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["step"] = "12"; }).find("M: step is not an integer of 64 bits"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["version"] = 3; }).find("version = 3; this build reads versions 1 to 2"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["optimizer_steps"] = 13; }).find("optimizer_steps"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["files"][0]["name"] = "../etc/passwd"; }).find("files[0].name"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["files"][1]["shard_rank"] = 0; }).find("appears twice"), std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["files"].erase(1); }).find("no file for shard rank 1"), std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["units"][0]["tensors"][0]["offset"] = 5; }).find("beyond the end"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["units"][0]["tensors"][0]["shape"] = {1u << 31, 1u << 31}; }).find("shape"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["units"][0]["padded"] = 33; }).find("multiple"), std::string::npos);
  EXPECT_NE(error_with([](auto& j) { j["shard_size"] = 3; }).find("does not divide"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_manifest("{\"format\": ", "M"); }).find("not a JSON object"), std::string::npos);
}

// A committed checkpoint written by hand at shard size S over units of the given sizes.
void write_checkpoint(const fs::path& root, int64_t step, int S, const std::vector<int64_t>& numels) {
  Manifest m = sample_manifest();
  m.step = m.optimizer_steps = step;
  m.world = m.shard_size = S;
  m.units.clear();
  m.files.clear();
  for (size_t u = 0; u < numels.size(); ++u) {
    const int64_t padded = (numels[u] + 16 * S - 1) / (16 * S) * (16 * S);
    m.units.push_back(
        {"u" + std::to_string(u), 0, numels[u], padded, {{"w" + std::to_string(u), {numels[u]}, 0, -1, {numels[u]}}}});
  }
  const fs::path dir = root / step_dir_name(step);
  fs::create_directories(dir);
  for (int k = 0; k < S; ++k) {
    std::vector<std::vector<float>> data;
    std::vector<TensorView> views;
    for (size_t u = 0; u < numels.size(); ++u) {
      const int64_t n = m.units[u].padded / S;
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
        std::vector<float> v(n);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t global = k * n + i;
          v[i] = global < numels[u] ? static_cast<float>(1000 * u + global) + (kind[4] == 'a' ? 0.5f : kind[0] == 'p' ? 0.f : 0.25f) : 0.f;
        }
        data.push_back(std::move(v));
        views.push_back({Manifest::tensor_name(m.units[u].name, kind), data.back().data(), static_cast<uint64_t>(n)});
      }
    }
    views.clear();  // `data` may have reallocated while it grew: point into its final buffers
    size_t at = 0;
    for (size_t u = 0; u < numels.size(); ++u) {
      for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
        views.push_back({Manifest::tensor_name(m.units[u].name, kind), data[at].data(), data[at].size()});
        ++at;
      }
    }
    const FileDigest dg = write_shard_file((dir / shard_file_name(k)).string(), views);
    m.files.push_back({shard_file_name(k), 0, 0, k, dg.bytes, dg.xxh64});
  }
  spit(dir / "manifest.json", to_json(m));
  write_latest(root.string(), step);
}

TEST(CheckpointReader, ReadsAnySliceAtAnyPadding) {
  Dir d;
  write_checkpoint(d.path, 5, 3, {37, 100});
  CheckpointReader r((d.path / step_dir_name(5)).string());
  // Re-cut for 2 shards of a padding of 64: elements past numel are zero.
  for (int unit = 0; unit < 2; ++unit) {
    const int64_t numel = unit == 0 ? 37 : 100;
    std::vector<float> all(128, -1.f);
    r.read_slice(0, unit, "param", 0, 64, all.data());
    r.read_slice(0, unit, "param", 64, 64, all.data() + 64);
    for (int64_t i = 0; i < 128; ++i) {
      EXPECT_EQ(all[i], i < numel ? static_cast<float>(1000 * unit + i) : 0.f) << unit << " " << i;
    }
    std::vector<float> m(7);
    r.read_slice(0, unit, "exp_avg", 30, 7, m.data());
    EXPECT_EQ(m[0], static_cast<float>(1000 * unit + 30) + 0.5f);
  }
  const auto params = r.parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[1].data.size(), 100u);
  EXPECT_EQ(params[1].data[99], 1099.f);
}

// Issue 12 item 12: a manifest whose numel (and padded) claim far more than the shard files hold
// is a DataError before anything is sized by it (it used to make `generate` allocate until killed).
TEST(CheckpointReader, CraftedNumelIsRejectedBeforeAllocating) {
  Dir d;
  write_checkpoint(d.path, 5, 2, {37});
  const fs::path manifest = d.path / step_dir_name(5) / "manifest.json";
  nlohmann::json j = parse_json_or_throw(read_file(manifest));
  j["units"][0]["numel"] = int64_t{1} << 40;
  j["units"][0]["padded"] = int64_t{1} << 40;
  spit(manifest, dump_json(j));
  CheckpointReader r((d.path / step_dir_name(5)).string());
  const std::string error = error_of([&] { r.parameters(); });
  EXPECT_NE(error.find("tensor u0.param is of the wrong size"), std::string::npos) << error;
}

// A manifest is parsed whole: one larger than 256 MiB is refused by its size, unread (a sparse file
// of 257 MiB here, which costs no disk), a missing one and an unreadable one are told apart.
TEST(CheckpointReader, ManifestMissingTooLargeOrUnreadableIsNamed) {
  Dir d;
  write_checkpoint(d.path, 5, 1, {16});
  const fs::path step = d.path / step_dir_name(5);
  const fs::path manifest = step / "manifest.json";
  EXPECT_EQ(read_manifest(step.string()).step, 5);

  fs::resize_file(manifest, (257ull << 20));
  std::string error = error_of([&] { read_manifest(step.string()); });
  EXPECT_EQ(error, manifest.string() + ": more than 268435456 bytes is too large for a manifest");

  fs::remove(manifest);
  error = error_of([&] { read_manifest(step.string()); });
  EXPECT_EQ(error, manifest.string() + " is missing");

  fs::create_directory(manifest);
  try {
    read_manifest(step.string());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read " + manifest.string() + ": " + std::strerror(EISDIR));
  }
}

TEST(CheckpointDirectory, VerifyNamesTheDamagedFileAndTensor) {
  Dir d;
  write_checkpoint(d.path, 5, 2, {40, 64});
  const fs::path dir = d.path / step_dir_name(5);
  EXPECT_TRUE(verify(dir.string()).empty());
  const fs::path shard = dir / shard_file_name(1);
  std::string bytes = read_file(shard);
  bytes[bytes.size() - 4] ^= 0x40;  // the last tensor: u1.exp_avg_sq
  spit(shard, bytes);
  const auto problems = verify(dir.string());
  ASSERT_GE(problems.size(), 2u);
  EXPECT_NE(problems[0].find(shard.string() + ": checksum"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("tensor u1.exp_avg_sq fails its checksum"), std::string::npos) << problems[1];
  spit(shard, bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(verify(dir.string())[0].find("bytes, the manifest records"), std::string::npos);
  fs::remove(shard);
  EXPECT_FALSE(verify(dir.string()).empty());
}

TEST(CheckpointDirectory, LatestListingCleanupAndPrune) {
  Dir d;
  for (int64_t step : {5, 10, 15, 20}) write_checkpoint(d.path, step, 1, {16});
  fs::create_directories(d.path / step_dir_name(25));  // a save that never committed
  spit(d.path / step_dir_name(25) / "shard_00000.bin", std::string(1000, 'x'));
  spit(d.path / "latest.tmp", "junk");
  EXPECT_EQ(committed_steps(d.path.string()), (std::vector<int64_t>{5, 10, 15, 20}));
  EXPECT_EQ(read_latest(d.path.string()), 20);
  EXPECT_EQ(remove_uncommitted(d.path.string()), 1004u);
  EXPECT_FALSE(fs::exists(d.path / step_dir_name(25)));
  EXPECT_FALSE(fs::exists(d.path / "latest.tmp"));
  write_latest(d.path.string(), 10);  // e.g. a commit whose latest update was cut short
  prune(d.path.string(), 1);
  EXPECT_EQ(committed_steps(d.path.string()), (std::vector<int64_t>{10, 20}));  // latest is never pruned
  remove_newer(d.path.string(), 10);
  EXPECT_EQ(committed_steps(d.path.string()), (std::vector<int64_t>{10}));
  spit(d.path / "latest", "garbage\n");
  EXPECT_NE(error_of([&] { read_latest(d.path.string()); }).find("garbage"), std::string::npos);
  EXPECT_EQ(read_latest((d.path / "nowhere").string()), -1);
}

// The object-store tier (object_tier.h) against a real S3-compatible server: node objects under
// hashed prefixes, the manifest placing each file, ranged reads of one slice, verify, prune.
TEST(ObjectTier, NodeObjectsUnderHashedPrefixesReadByRangeAndPruned) {
  storage::test_util::S3rver server;
  ASSERT_EQ(server.start(), "");
  ::setenv("AWS_ACCESS_KEY_ID", storage::test_util::S3rver::kAccessKey, 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", storage::test_util::S3rver::kSecretKey, 1);
  ::setenv("AWS_ENDPOINT_URL", server.endpoint().c_str(), 1);
  storage::S3Client s3(server.options());
  Dir d;
  const std::string mirror = "s3://tessera-test/base/run";
  const TierUpload how{2, 4, {0, 0, 1, 1}};  // keep 2, 4 prefixes, files 0-1 on node 0, 2-3 on node 1
  write_checkpoint(d.path, 5, 4, {37, 100});
  const TierUploadStats sent = upload_checkpoint(s3, d.path.string(), 5, mirror, how);
  EXPECT_EQ(sent.objects, 2);
  EXPECT_EQ(sent.puts, 4);  // two node objects, the manifest, latest
  std::vector<std::string> keys;
  for (const storage::ObjectInfo& o : s3.list({"tessera-test", "base/"})) keys.push_back(o.key);
  for (int node : {0, 1}) {
    const std::string key = tier_object_key(mirror, 5, node, 4);
    EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
    EXPECT_TRUE(key.rfind("base/0", 0) == 0 && key.find("/run/step_00000005/node_0000") == 7) << key;
  }
  EXPECT_EQ(tier_read_latest(s3, mirror), 5);
  EXPECT_EQ(tier_committed_steps(s3, mirror), std::vector<int64_t>{5});

  // Every slice read from the bucket equals the local copy; one slice costs a few ranged GETs.
  CheckpointReader local((d.path / step_dir_name(5)).string());
  CheckpointReader remote(mirror + "/" + step_dir_name(5));
  EXPECT_EQ(remote.manifest().files[2].object, tier_object_key(mirror, 5, 1, 4));
  EXPECT_EQ(remote.manifest().files[3].object_offset, remote.manifest().files[2].bytes);
  const int64_t gets_before = storage::default_s3_client().counts().get;
  std::vector<float> a(16), b(16);
  remote.read_slice(0, 1, "exp_avg", 64, 16, a.data());                   // shard 2's first 16 floats of unit 1
  EXPECT_LE(storage::default_s3_client().counts().get - gets_before, 3);  // its prefix, header, tensor
  local.read_slice(0, 1, "exp_avg", 64, 16, b.data());
  EXPECT_EQ(a, b);
  for (int unit = 0; unit < 2; ++unit) {
    for (const char* kind : Manifest::kKinds) {
      std::vector<float> x(128), y(128);
      remote.read_slice(0, unit, kind, 0, 128, x.data());
      local.read_slice(0, unit, kind, 0, 128, y.data());
      EXPECT_EQ(x, y) << unit << kind;
    }
  }
  EXPECT_EQ(verify(mirror + "/" + step_dir_name(5)), std::vector<std::string>{});

  // keep = 2: step 5's manifest and objects go when 6 and 7 arrive.
  for (int64_t step : {6, 7}) {
    write_checkpoint(d.path, step, 4, {37, 100});
    upload_checkpoint(s3, d.path.string(), step, mirror, how);
  }
  EXPECT_EQ(tier_committed_steps(s3, mirror), (std::vector<int64_t>{6, 7}));
  for (const storage::ObjectInfo& o : s3.list({"tessera-test", "base/"})) {
    EXPECT_EQ(o.key.find("step_00000005"), std::string::npos) << o.key;
  }
}

}  // namespace
}  // namespace tessera::checkpoint
