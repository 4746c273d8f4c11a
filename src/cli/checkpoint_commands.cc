// `tessera checkpoint SUBCOMMAND`: converting, verifying, resharding and uploading saved weights.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>

#include "checkpoint/directory.h"
#include "checkpoint/hf.h"
#include "checkpoint/object_tier.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "config/config.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/tokenizer.h"
#include "storage/s3_client.h"
#include "train/run.h"

namespace tessera::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kExportUsage =
    "usage: tessera checkpoint export --format hf SRC OUT [--max-shard-size SIZE] [--dtype fp32|bf16]\n"
    "  SRC: a run directory, a checkpoint directory or a model.safetensors of `tessera train`; OUT: a new directory\n"
    "  for transformers' LlamaForCausalLM (config.json, model.safetensors, the tokenizer when SRC\n"
    "  has one). Above SIZE bytes (suffix KB, MB or GB; default 5GB) the weights go into\n"
    "  model-0000i-of-0000n.safetensors files with model.safetensors.index.json. --dtype bf16: each\n"
    "  weight rounded to the nearest bf16 (half the bytes, as Llama checkpoints are published);\n"
    "  fp32 (the default): exact.\n";

constexpr const char* kImportUsage =
    "usage: tessera checkpoint import --format hf HF_DIR OUT_DIR\n"
    "  HF_DIR: a Llama directory (config.json and model.safetensors or an index of several files;\n"
    "  F32, BF16 or F16). Writes OUT_DIR/model.safetensors (fp32, the config in its metadata),\n"
    "  OUT_DIR/config.toml and a copy of HF_DIR's tokenizer.model (SentencePiece), else of its\n"
    "  tokenizer.json (byte-level BPE, as Llama 3's), when Tessera can read it; `tessera generate`\n"
    "  and `tessera eval` take OUT_DIR, and train.init_from takes HF_DIR or OUT_DIR.\n";

constexpr const char* kVerifyUsage =
    "usage: tessera checkpoint verify DIR\n"
    "  checks sizes and checksums of a sharded checkpoint (a step directory, or a checkpoint root or\n"
    "  run directory: every committed checkpoint in it) and names the bad file and tensor; exit 3\n"
    "  when anything is damaged.\n";

constexpr const char* kReshardUsage =
    "usage: tessera checkpoint reshard SRC DST --nproc N [--set parallel.strategy=S]\n"
    "                                  [--set parallel.shard_group_size=G]\n"
    "  writes checkpoint SRC (a step directory, or a root with `latest`) re-cut for N ranks into the\n"
    "  checkpoint root DST, parameters and optimizer state exactly.\n";

constexpr const char* kUploadUsage =
    "usage: tessera checkpoint upload SRC MIRROR [--keep K]\n"
    "  uploads checkpoint SRC (a step directory, or a checkpoint root or run directory: the one\n"
    "  `latest` names) to the object-store tier at MIRROR, s3://BUCKET/PREFIX/RUN (a run's\n"
    "  checkpoint.mirror_dir and its run directory's name: where it mirrors and resumes from), after\n"
    "  checking its checksums (exit 3 when damaged); then MIRROR's `latest` names it. Nothing is sent\n"
    "  when MIRROR holds that step; a newer one there is refused (exit 2). --keep K: then remove the\n"
    "  oldest committed checkpoints there so that K remain (default: none removed).\n";

struct Subcommand {
  const char* name;
  const char* usage;
  std::function<int(const ParsedArgs&)> run;
  std::vector<std::string> value_flags;
};

// The only interchange format so far; --format is required so that others can follow.
void require_hf_format(const ParsedArgs& a) {
  const std::string format = a.get("--format", "");
  if (format.empty()) throw ConfigError("missing --format (supported: hf)");
  if (format != "hf") throw ConfigError(fmt::format("--format {}: unsupported (supported: hf)", format));
}

// "5GB", "200MB", "4096": decimal units, as transformers' max_shard_size.
uint64_t parse_size(const std::string& text) {
  static const std::pair<const char*, uint64_t> kUnits[] = {{"GB", 1000000000}, {"MB", 1000000}, {"KB", 1000}};
  uint64_t unit = 1;
  std::string digits = text;
  for (const auto& [suffix, scale] : kUnits) {
    if (text.ends_with(suffix)) {
      unit = scale;
      digits = text.substr(0, text.size() - 2);
      break;
    }
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v == 0 || v > UINT64_MAX / unit) {
    throw ConfigError(fmt::format("--max-shard-size expects a positive size such as 5GB or 200MB, got \"{}\"", text));
  }
  return v * unit;
}

// A copy of the tokenizer's file in `out_dir`, under its format's name.
void copy_tokenizer(const data::Tokenizer& tokenizer, const fs::path& out_dir) {
  std::error_code ec;
  fs::copy_file(tokenizer.path(), out_dir / tokenizer.file_name(), fs::copy_options::overwrite_existing, ec);
  if (ec) throw IoError(fmt::format("cannot copy {} into {}: {}", tokenizer.path(), out_dir.string(), ec.message()));
}

// The tokenizer of a Hugging Face directory: the first of data::kTokenizerFiles that Tessera
// reads (a Llama 2 directory has both, its tokenizer.json in a form only the SentencePiece model
// replaces); nullopt, with the reasons logged, when none is readable.
std::optional<data::Tokenizer> hf_tokenizer(const fs::path& hf_dir) {
  for (const char* name : data::kTokenizerFiles) {
    const fs::path p = hf_dir / name;
    if (!fs::exists(p)) continue;
    try {
      return data::Tokenizer(p.string());
    } catch (const DataError& e) {
      log::warn("not copying {}: {}", p.string(), e.what());
    }
  }
  return std::nullopt;
}

int export_command(const ParsedArgs& a) {
  require_hf_format(a);
  if (a.positional.size() != 2) throw ConfigError(fmt::format("export expects SRC OUT\n{}", kExportUsage));
  const std::string& src = a.positional[0];
  const std::string& out = a.positional[1];
  const train::TrainedModel trained = train::load_trained(src);
  checkpoint::HfExportOptions options;
  if (a.flags.count("--max-shard-size")) options.max_shard_bytes = parse_size(a.get("--max-shard-size", ""));
  if (const std::string dtype = a.get("--dtype", "fp32"); dtype == "bf16") {
    options.dtype = checkpoint::StoredDtype::kBF16;
  } else if (dtype != "fp32") {
    throw ConfigError(fmt::format("--dtype {}: expected fp32 or bf16\n{}", dtype, kExportUsage));
  }
  std::optional<data::Tokenizer> tokenizer;
  if (!trained.tokenizer_path.empty()) {
    tokenizer.emplace(trained.tokenizer_path);
    options.bos_token_id = tokenizer->bos_id();
    options.eos_token_id = tokenizer->eos_id();
  }
  checkpoint::export_hf(trained.config.model, trained.tensors, trained.weights_path, out, options);
  if (tokenizer) copy_tokenizer(*tokenizer, out);
  log::info("exported {} to {} (Hugging Face Llama{})", trained.weights_path, out,
            tokenizer ? fmt::format(", with {}", tokenizer->file_name()) : ", no tokenizer");
  return kExitOk;
}

int import_command(const ParsedArgs& a) {
  require_hf_format(a);
  if (a.positional.size() != 2) throw ConfigError(fmt::format("import expects HF_DIR OUT_DIR\n{}", kImportUsage));
  const fs::path hf_dir = a.positional[0], out = a.positional[1];
  checkpoint::HfModel hf = checkpoint::import_hf(hf_dir.string());
  // Defaults for everything but the model, which config.json fixes.
  config::Config c = config::load("", {});
  c.model = hf.config;
  try {
    config::validate(c);
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("{}: describes a model Tessera cannot train: {}", (hf_dir / "config.json").string(),
                                e.what()));
  }
  const fs::path weights = out / "model.safetensors";
  if (fs::exists(weights)) throw ConfigError(fmt::format("{} already exists; import into a new directory", weights.string()));
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", out.string(), ec.message()));
  const std::string toml = config::to_toml(c);
  write_file_atomic((out / "config.toml").string(), toml);
  checkpoint::write_safetensors(weights.string(), hf.tensors, {{"tessera_config", toml}});
  const std::optional<data::Tokenizer> tokenizer = hf_tokenizer(hf_dir);
  if (tokenizer) copy_tokenizer(*tokenizer, out);
  log::info(
      "imported {} into {} (model {}, {} layers, dim {}{})", hf_dir.string(), weights.string(), c.model.preset,
      c.model.n_layers, c.model.dim,
      tokenizer ? fmt::format(", with {}", tokenizer->file_name()) : ", no tokenizer Tessera reads in the source");
  return kExitOk;
}

// The step directories DIR names: itself when it holds a manifest, else every committed one in
// DIR or DIR/checkpoints.
std::vector<std::string> step_dirs(const std::string& dir) {
  if (storage::is_s3(dir)) {  // a step URL, or a tier root (s3://BUCKET/PREFIX/RUN)
    const storage::ObjectUrl url = storage::parse_s3(dir, "checkpoint");
    if (url.name().rfind("step_", 0) == 0) return {dir};
    std::vector<std::string> out;
    for (const int64_t step : checkpoint::tier_committed_steps(storage::default_s3_client(), dir)) {
      out.push_back(url.child(checkpoint::step_dir_name(step)).str());
    }
    if (out.empty()) throw DataError(fmt::format("{}: no committed checkpoint (no manifest.json) there", dir));
    return out;
  }
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) return {dir};
  for (const fs::path& root : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    std::vector<std::string> out;
    for (const int64_t step : checkpoint::committed_steps(root.string())) {
      out.push_back((root / checkpoint::step_dir_name(step)).string());
    }
    if (!out.empty()) return out;
  }
  throw DataError(fmt::format("{}: no committed checkpoint (no manifest.json) there", dir));
}

int verify_command(const ParsedArgs& a) {
  if (a.positional.size() != 1) throw ConfigError(fmt::format("verify expects DIR\n{}", kVerifyUsage));
  int bad = 0;
  for (const std::string& dir : step_dirs(a.positional[0])) {
    const std::vector<std::string> problems = checkpoint::verify(dir);
    if (problems.empty()) {
      const checkpoint::Manifest m = checkpoint::read_manifest(dir);
      fmt::print("ok      {} (step {}, {} file(s), world {}, {})\n", dir, m.step, m.files.size(), m.world, m.strategy);
    } else {
      ++bad;
      fmt::print("DAMAGED {}\n", dir);
      for (const auto& p : problems) fmt::print("  {}\n", p);
    }
  }
  return bad == 0 ? kExitOk : kExitData;
}

int upload_command(const ParsedArgs& a) {
  if (a.positional.size() != 2) throw ConfigError(fmt::format("upload expects SRC MIRROR\n{}", kUploadUsage));
  const std::string& mirror = a.positional[1];
  if (!storage::is_s3(mirror)) throw ConfigError(fmt::format("upload: MIRROR {} is not an s3:// URL", mirror));
  storage::parse_s3(mirror, "MIRROR");  // ConfigError naming what is wrong with it
  if (storage::is_s3(a.positional[0])) throw ConfigError("upload: SRC must be a checkpoint on this machine's disks");
  std::string src = checkpoint::checkpoint_in(a.positional[0]);
  if (src.empty()) src = step_dirs(a.positional[0]).back();
  const long long keep = a.get_int("--keep", std::numeric_limits<int>::max());  // default: none removed
  if (keep < 1 || keep > std::numeric_limits<int>::max()) {
    throw ConfigError(fmt::format("--keep {}: expected a whole number of checkpoints, at least 1", keep));
  }
  if (const std::vector<std::string> problems = checkpoint::verify(src); !problems.empty()) {
    for (const std::string& p : problems) log::error("{}", p);
    throw DataError(fmt::format("{} is damaged ({} problem(s) above): not uploaded", src, problems.size()));
  }
  const int64_t step = checkpoint::read_manifest(src).step;
  fs::path dir = fs::path(src).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  if (dir.filename() != checkpoint::step_dir_name(step)) {  // the tier names the step by its directory
    throw ConfigError(
        fmt::format("{} holds step {}: name its directory {}", src, step, checkpoint::step_dir_name(step)));
  }
  storage::S3Client& s3 = storage::default_s3_client();
  const std::vector<int64_t> held = checkpoint::tier_committed_steps(s3, mirror);
  if (std::find(held.begin(), held.end(), step) != held.end()) {
    fmt::print("{} holds step {} already: nothing sent\n", mirror, step);
    return kExitOk;
  }
  if (!held.empty() && held.back() > step) {
    throw ConfigError(fmt::format("{} holds step {}, newer than {}'s {}: uploading it would take `latest` back", mirror,
                                  held.back(), src, step));
  }
  const double t0 = now_seconds();
  // The step's files in one node object, whatever the nodes that wrote them.
  const checkpoint::TierUploadStats sent =
      checkpoint::upload_checkpoint(s3, dir.parent_path().string(), step, mirror, {static_cast<int>(keep), 1, {}});
  fmt::print("uploaded step {} of {} to {} in {:.2f}s: {} node object(s), {} bytes, {} PUT request(s)\n", step, src,
             mirror, now_seconds() - t0, sent.objects, sent.bytes, sent.puts);
  return kExitOk;
}

int reshard_command(const ParsedArgs& a) {
  if (a.positional.size() != 2 || !a.flags.count("--nproc")) {
    throw ConfigError(fmt::format("reshard expects SRC DST --nproc N\n{}", kReshardUsage));
  }
  // The one `latest` names, else the newest committed one.
  std::string src = checkpoint::checkpoint_in(a.positional[0]);
  if (src.empty()) src = step_dirs(a.positional[0]).back();
  config::Overrides o = {{"parallel.nproc", a.get("--nproc", "1")}};
  o.insert(o.end(), a.overrides.begin(), a.overrides.end());
  for (const auto& [key, value] : o) {
    if (!key.starts_with("parallel.")) {
      throw ConfigError(fmt::format("--set {}={}: reshard changes parallel.* keys only", key, value));
    }
  }
  // The checkpoint's own config with the new parallel settings, validated as a whole.
  const config::Config target = config::load_text(checkpoint::read_manifest(src).config_toml, src, o);
  const std::string out = checkpoint::reshard(src, a.positional[1], target);
  fmt::print("wrote {} ({} rank(s), {}{}{}) from {}\n", out, target.parallel.nproc,
             config::name(target.parallel.strategy),
             target.parallel.tensor > 1 ? fmt::format(", tensor {}", target.parallel.tensor) : "",
             target.parallel.pipeline > 1 ? fmt::format(", pipeline {}", target.parallel.pipeline) : "", src);
  return kExitOk;
}

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> table = {
      {"export", kExportUsage, export_command, {"--format", "--max-shard-size", "--dtype"}},
      {"import", kImportUsage, import_command, {"--format"}},
      {"verify", kVerifyUsage, verify_command, {}},
      {"reshard", kReshardUsage, reshard_command, {"--nproc"}},
      {"upload", kUploadUsage, upload_command, {"--keep"}},
  };
  return table;
}

std::string usage() {
  std::string text = "usage: tessera checkpoint <subcommand> ...\n";
  for (const Subcommand& s : subcommands()) text += std::string("\n") + s.usage;
  return text;
}

}  // namespace

int cmd_checkpoint(const Args& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(usage().c_str(), args.empty() ? stderr : stdout);
    return args.empty() ? kExitConfig : kExitOk;
  }
  for (const Subcommand& s : subcommands()) {
    if (args[0] != s.name) continue;
    const ParsedArgs a = parse_args(Args(args.begin() + 1, args.end()), s.value_flags);
    if (a.help) {
      std::fputs(s.usage, stdout);
      return kExitOk;
    }
    return s.run(a);
  }
  throw ConfigError(fmt::format("unknown checkpoint subcommand '{}'\n{}", args[0], usage()));
}

}  // namespace tessera::cli
