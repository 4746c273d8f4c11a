// Run configuration: schema, TOML and command-line parsing, validation.
#include "config/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <sstream>
#include <variant>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"
#include "storage/object_url.h"

namespace tessera::config {
namespace {

// A value as written: from TOML it has a type; from the command line it is text to be parsed by
// the type the key expects.
using Integers = std::vector<int64_t>;  // a TOML array of integers
using Value = std::variant<bool, int64_t, double, std::string, Integers>;
struct Assignment {
  std::string key;
  Value value;
  bool from_text;      // came from --set, so value holds unparsed text
  std::string origin;  // file name or "--set"
};

// "[6, 2]": how a list is shown and written back.
std::string integers_text(const Integers& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

std::string show(const Value& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>)
          return fmt::format("\"{}\"", x);
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, Integers>)
          return integers_text(x);
        else
          return fmt::format("{}", x);
      },
      v);
}

// "[6, 2]", "6,2" or "" (an empty list) from the command line.
bool parse_integers(std::string text, Integers* out) {
  std::erase(text, ' ');
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  out->clear();
  for (size_t begin = 0; !text.empty() && begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    int64_t x = 0;
    auto [stop, ec] = std::from_chars(text.data() + begin, text.data() + end, x);
    if (ec != std::errc() || stop != text.data() + end) return false;
    out->push_back(x);
    begin = end + 1;
  }
  return true;
}

// The names of each enum-like key's values: the one place each is spelled.
template <typename E>
struct EnumNames;
template <>
struct EnumNames<Strategy> {
  static constexpr std::pair<const char*, Strategy> kTable[] = {{"full_shard", Strategy::kFullShard},
                                                                {"shard_grad_op", Strategy::kShardGradOp},
                                                                {"hybrid_shard", Strategy::kHybridShard},
                                                                {"no_shard", Strategy::kNoShard}};
};
template <>
struct EnumNames<Precision> {
  static constexpr std::pair<const char*, Precision> kTable[] = {{"fp32", Precision::kFp32},
                                                                 {"bf16", Precision::kBf16}};
};
template <>
struct EnumNames<OnNonFinite> {
  static constexpr std::pair<const char*, OnNonFinite> kTable[] = {{"stop", OnNonFinite::kStop},
                                                                   {"skip", OnNonFinite::kSkip}};
};
template <>
struct EnumNames<LrDecay> {
  static constexpr std::pair<const char*, LrDecay> kTable[] = {
      {"cosine", LrDecay::kCosine}, {"linear", LrDecay::kLinear}, {"sqrt", LrDecay::kSqrt}, {"none", LrDecay::kNone}};
};
template <>
struct EnumNames<model::RopeScaling> {
  static constexpr std::pair<const char*, model::RopeScaling> kTable[] = {{"none", model::RopeScaling::kNone},
                                                                          {"llama3", model::RopeScaling::kLlama3}};
};
template <>
struct EnumNames<PipelineSchedule> {
  static constexpr std::pair<const char*, PipelineSchedule> kTable[] = {{"1f1b", PipelineSchedule::kOneFOneB},
                                                                        {"gpipe", PipelineSchedule::kGPipe}};
};
template <>
struct EnumNames<HostTransport> {
  static constexpr std::pair<const char*, HostTransport> kTable[] = {
      {"auto", HostTransport::kAuto}, {"tcp", HostTransport::kTcp}, {"shm", HostTransport::kShm}};
};
template <>
struct EnumNames<CpuBind> {
  static constexpr std::pair<const char*, CpuBind> kTable[] = {{"auto", CpuBind::kAuto}, {"none", CpuBind::kNone}};
};
template <>
struct EnumNames<Device> {
  static constexpr std::pair<const char*, Device> kTable[] = {
      {"auto", Device::kAuto}, {"cpu", Device::kCpu}, {"cuda", Device::kCuda}};
};
template <>
struct EnumNames<OnFailure> {
  static constexpr std::pair<const char*, OnFailure> kTable[] = {{"continue", OnFailure::kContinue},
                                                                 {"stop", OnFailure::kStop}};
};

template <typename E>
bool parse_enum(const std::string& text, E* out) {
  if constexpr (std::is_same_v<E, log::Level>) {
    return log::parse_level(text, out);  // core/log's table
  } else {
    for (const auto& [n, v] : EnumNames<E>::kTable) {
      if (text == n) {
        *out = v;
        return true;
      }
    }
    return false;
  }
}

template <typename E>
const char* enum_name(E value) {
  if constexpr (std::is_same_v<E, log::Level>) {
    return log::level_name(value);
  } else {
    for (const auto& [n, v] : EnumNames<E>::kTable) {
      if (v == value) return n;
    }
    return "?";
  }
}

template <typename E>
std::string enum_choices() {
  if constexpr (std::is_same_v<E, log::Level>) {
    return "debug, info, warn, error";
  } else {
    std::string out;
    for (const auto& [n, v] : EnumNames<E>::kTable) out += (out.empty() ? "" : ", ") + std::string(n);
    return out;
  }
}

[[noreturn]] void fail(const Assignment& a, const std::string& why) {
  throw ConfigError(fmt::format("config key {} = {} ({}): {}", a.key, show(a.value), a.origin, why));
}

template <typename T>
T convert(const Assignment& a) {
  if (a.from_text) {
    const std::string& s = std::get<std::string>(a.value);
    if constexpr (std::is_same_v<T, std::string>) {
      return s;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (s == "true") return true;
      if (s == "false") return false;
      fail(a, "expected true or false");
    } else if constexpr (std::is_same_v<T, int64_t>) {
      int64_t x = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (ec != std::errc() || end != s.data() + s.size()) fail(a, "expected an integer");
      return x;
    } else if constexpr (std::is_same_v<T, Integers>) {
      Integers x;
      if (!parse_integers(s, &x)) fail(a, "expected a list of integers such as [6, 2]");
      return x;
    } else {
      double x = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (ec != std::errc() || end != s.data() + s.size()) fail(a, "expected a number");
      return x;
    }
  }
  if (const T* x = std::get_if<T>(&a.value)) return *x;
  if constexpr (std::is_same_v<T, double>) {
    if (const int64_t* i = std::get_if<int64_t>(&a.value)) return static_cast<double>(*i);
  }
  static const char* kNames[] = {"a boolean", "an integer", "a number", "a string", "a list of integers"};
  constexpr size_t kIndex = std::is_same_v<T, bool>          ? 0
                            : std::is_same_v<T, int64_t>     ? 1
                            : std::is_same_v<T, double>      ? 2
                            : std::is_same_v<T, std::string> ? 3
                                                             : 4;
  fail(a, fmt::format("expected {}", kNames[kIndex]));
}

// A TOML basic string: quotes, backslashes and control characters escaped (the text itself is
// UTF-8, as toml++ accepted it).
std::string toml_string(const std::string& v) {
  std::string out = "\"";
  for (const char ch : v) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\u{:04X}", u);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// The shortest text that reads back as the same double, and as a TOML float rather than an
// integer: "2" becomes "2.0", while "1e+20", "inf" and "0.5" already are floats.
std::string toml_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
  return s;
}

// The range a numeric key accepts: what validate() checks for every key before the rules that
// relate keys to each other.
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Bounds gt(double lo, const char* note = "") { return {lo, kInf, true, false, note}; }
constexpr Bounds ge(double lo, const char* note = "") { return {lo, kInf, false, false, note}; }
constexpr Bounds closed(double lo, double hi, const char* note = "") { return {lo, hi, false, false, note}; }
constexpr Bounds open(double lo, double hi) { return {lo, hi, true, true, ""}; }
constexpr Bounds half_open(double lo, double hi) { return {lo, hi, false, true, ""}; }
constexpr Bounds any(const char* note = "") { return {-kInf, kInf, false, false, note}; }

struct Key {
  std::string name;
  std::function<void(Config&, const Assignment&)> set;
  std::function<std::string(const Config&)> get;
  std::function<double(const Config&)> number;  // numeric keys only
  bool real = false;                            // a floating-point key
  Bounds bounds;
};

template <typename T>
Key make_key(std::string name, T& (*field)(Config&), Bounds bounds = any()) {
  Key k;
  k.name = std::move(name);
  k.bounds = bounds;
  if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
    k.number = [field](const Config& c) { return static_cast<double>(field(const_cast<Config&>(c))); };
    k.real = std::is_same_v<T, double>;
  }
  k.set = [field](Config& c, const Assignment& a) {
    if constexpr (std::is_enum_v<T>) {
      if (!parse_enum(convert<std::string>(a), &field(c))) fail(a, "must be one of " + enum_choices<T>());
    } else {
      field(c) = convert<T>(a);
    }
  };
  k.get = [field](const Config& c) {
    const T& v = field(const_cast<Config&>(c));
    if constexpr (std::is_same_v<T, std::string>) {
      return toml_string(v);
    } else if constexpr (std::is_enum_v<T>) {
      return toml_string(enum_name(v));
    } else if constexpr (std::is_same_v<T, bool>) {
      return std::string(v ? "true" : "false");
    } else if constexpr (std::is_same_v<T, double>) {
      return toml_float(v);
    } else if constexpr (std::is_same_v<T, Integers>) {
      return integers_text(v);
    } else {
      return fmt::format("{}", v);
    }
  };
  return k;
}

#define KEY(section, field, ...) \
  make_key(                      \
      #section "." #field,       \
      +[](Config& c) -> decltype(c.section.field)& { return c.section.field; } __VA_OPT__(, ) __VA_ARGS__)

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = {
      KEY(model, preset),
      KEY(model, vocab_size, gt(0)),
      KEY(model, dim, gt(0)),
      KEY(model, n_layers, gt(0)),
      KEY(model, n_heads, gt(0)),
      KEY(model, n_kv_heads, gt(0)),
      KEY(model, ffn_hidden, gt(0)),
      KEY(model, seq_len, gt(0)),
      KEY(model, rope_theta, gt(0)),
      KEY(model, rope_scaling),
      KEY(model, rope_scaling_factor, ge(1, "the long context's stretch")),
      KEY(model, rope_low_freq_factor, gt(0)),
      KEY(model, rope_high_freq_factor, gt(0)),
      KEY(model, rope_original_seq_len, gt(0)),
      KEY(model, norm_eps, open(0, 1)),
      KEY(model, tied_embeddings),
      KEY(model, init_std, open(0, 1)),
      KEY(model, allow_tf32),
      KEY(train, batch_size, gt(0)),
      KEY(train, micro_batch_size, ge(0, "0 derives it from train.batch_size")),
      KEY(train, max_steps, gt(0)),
      KEY(train, max_tokens, ge(0, "0: no limit")),
      KEY(train, lr, gt(0)),
      KEY(train, min_lr, ge(0)),
      KEY(train, warmup_steps, ge(0)),
      KEY(train, lr_decay),
      KEY(train, lr_decay_steps, ge(0, "0: every step after the warmup")),
      KEY(train, weight_decay, ge(0)),
      KEY(train, beta1, half_open(0, 1)),
      KEY(train, beta2, half_open(0, 1)),
      KEY(train, eps, gt(0)),
      KEY(train, grad_clip, ge(0, "0: no clipping")),
      KEY(train, on_nonfinite),
      KEY(train, max_skipped_steps, gt(0)),
      KEY(train, seed, ge(0)),
      KEY(train, device),
      KEY(train, threads, closed(0, 1024, "0: one per core")),
      KEY(train, eval_interval, ge(0, "0: never")),
      KEY(train, eval_batches, gt(0)),
      KEY(train, init_from),
      KEY(data, dataset),
      KEY(data, cache_dir),
      KEY(data, synthetic),
      KEY(parallel, nproc, closed(1, 1024)),
      KEY(parallel, tensor, closed(1, 1024)),
      KEY(parallel, sequence_parallel),
      KEY(parallel, pipeline, closed(1, 1024)),
      KEY(parallel, pipeline_schedule),
      KEY(parallel, pipeline_layers),
      KEY(parallel, strategy),
      KEY(parallel, shard_group_size, ge(0, "0: every data-parallel rank")),
      KEY(parallel, timeout_ms, gt(0)),
      KEY(parallel, host_transport),
      KEY(parallel, cpu_bind),
      KEY(parallel, health_min_memory_gbps, ge(0, "0: measured and logged only")),
      KEY(parallel, param_dtype),
      KEY(parallel, reduce_dtype),
      KEY(parallel, activation_checkpointing, ge(0, "0: off, k: every k-th block")),
      KEY(checkpoint, save_final),
      KEY(checkpoint, interval_steps, ge(0, "0: off")),
      KEY(checkpoint, interval_minutes, ge(0, "0: off")),
      KEY(checkpoint, keep, gt(0)),
      KEY(checkpoint, fallback),
      KEY(checkpoint, mirror_dir),
      KEY(checkpoint, s3_prefixes, closed(1, 256)),
      KEY(checkpoint, on_failure),
      KEY(metrics, log_level),
      KEY(metrics, log_interval, gt(0)),
      KEY(metrics, straggler_factor, gt(1)),
      KEY(metrics, straggler_steps, gt(0)),
      KEY(metrics, peak_flops, any("FLOP/s per rank; 0: measure; < 0: no MFU")),
      KEY(metrics, prometheus_host),
      KEY(metrics, prometheus_port, closed(0, 65535, "a TCP port; 0: no endpoint")),
  };
  return keys;
}
#undef KEY

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

const Key& find_key(const Assignment& a) {
  const Key* best = nullptr;
  size_t best_distance = 4;  // suggest only near misses
  for (const Key& k : schema()) {
    if (k.name == a.key) return k;
    const size_t d = edit_distance(k.name, a.key);
    if (d < best_distance) best_distance = d, best = &k;
  }
  throw ConfigError(fmt::format("unknown config key {} ({}){}", a.key, a.origin,
                                best ? fmt::format("; did you mean {}?", best->name) : std::string()));
}

Integers integers(const toml::array& list) {
  Integers out;
  for (const toml::node& x : list) out.push_back(*x.value<int64_t>());
  return out;
}

void collect_toml(const std::string& path, const std::string* text, std::vector<Assignment>* out) {
  toml::table root;
  try {
    root = text != nullptr ? toml::parse(*text, path) : toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ConfigError(fmt::format("cannot parse config {} at line {}, column {}: {}", path, where.line, where.column,
                                  e.description()));
  }
  for (const auto& [section, node] : root) {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      throw ConfigError(fmt::format("config {}: top-level key {} must be a section such as [train]", path,
                                    std::string(section.str())));
    }
    for (const auto& [name, item] : *table) {
      Assignment a{fmt::format("{}.{}", section.str(), name.str()), std::string(), false, path};
      if (auto b = item.value<bool>(); b && item.is_boolean())
        a.value = *b;
      else if (item.is_integer())
        a.value = *item.value<int64_t>();
      else if (item.is_floating_point())
        a.value = *item.value<double>();
      else if (item.is_string())
        a.value = *item.value<std::string>();
      else if (const toml::array* list = item.as_array();
               list != nullptr && (list->empty() || list->is_homogeneous<int64_t>()))
        a.value = integers(*list);
      else
        throw ConfigError(fmt::format("config key {} ({}): unsupported value type", a.key, path));
      out->push_back(std::move(a));
    }
  }
}

void require(bool ok, const std::string& key, const std::string& value, const std::string& why) {
  if (!ok) throw ConfigError(fmt::format("config key {} = {}: {}", key, value, why));
}

}  // namespace

std::pair<std::string, std::string> parse_override(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(fmt::format("--set expects key=value, got \"{}\"", text));
  }
  return {text.substr(0, eq), text.substr(eq + 1)};
}

namespace {
Config apply(std::vector<Assignment> assignments, const Overrides& overrides) {
  for (const auto& [key, value] : overrides) assignments.push_back({key, value, true, "--set"});

  Config c;
  model::model_preset("default", &c.model);
  // The last model.preset wins and is applied first, so explicit model keys refine it.
  for (auto it = assignments.rbegin(); it != assignments.rend(); ++it) {
    if (it->key != "model.preset") continue;
    const std::string name = convert<std::string>(*it);
    if (!model::model_preset(name, &c.model)) {
      fail(*it, fmt::format("unknown preset; choose one of {}", fmt::join(model::model_preset_names(), ", ")));
    }
    break;
  }
  for (const Assignment& a : assignments) {
    const Key& key = find_key(a);
    if (a.key != "model.preset") key.set(c, a);
  }
  validate(c);
  return c;
}
}  // namespace

Config load(const std::string& path, const Overrides& overrides) {
  std::vector<Assignment> assignments;
  if (!path.empty()) collect_toml(path, nullptr, &assignments);
  return apply(std::move(assignments), overrides);
}

Config load_text(const std::string& toml_text, const std::string& origin, const Overrides& overrides) {
  std::vector<Assignment> assignments;
  collect_toml(origin, &toml_text, &assignments);
  return apply(std::move(assignments), overrides);
}

const char* name(Strategy v) { return enum_name(v); }
const char* name(Precision v) { return enum_name(v); }
const char* name(OnNonFinite v) { return enum_name(v); }
const char* name(LrDecay v) { return enum_name(v); }
const char* name(OnFailure v) { return enum_name(v); }
const char* name(PipelineSchedule v) { return enum_name(v); }
const char* name(Device v) { return enum_name(v); }
const char* name(HostTransport v) { return enum_name(v); }
const char* name(CpuBind v) { return enum_name(v); }
const char* name(model::RopeScaling v) { return enum_name(v); }

Device parse_device(const std::string& text, const std::string& what) {
  Device d = Device::kAuto;
  if (!parse_enum(text, &d)) {
    throw ConfigError(fmt::format("{} {}: choose one of {}", what, text, enum_choices<Device>()));
  }
  return d;
}

namespace {

// "must be a finite number > 0 (note)", "must be in [0, 1)", ...
std::string describe(const Bounds& b, bool real) {
  std::string range;
  if (b.hi == kInf && b.lo != -kInf) {
    range = fmt::format("{} {}", b.lo_open ? ">" : ">=", b.lo);
  } else if (b.lo == -kInf && b.hi != kInf) {
    range = fmt::format("{} {}", b.hi_open ? "<" : "<=", b.hi);
  } else if (b.lo != -kInf) {
    range = fmt::format("in {}{}, {}{}", b.lo_open ? "(" : "[", b.lo, b.hi, b.hi_open ? ")" : "]");
  }
  std::string text = real ? "must be a finite number" + (range.empty() ? "" : " " + range) : "must be " + range;
  if (*b.note != '\0') text += fmt::format(" ({})", b.note);
  return text;
}

// The rules between keys, once every key is in its range.
void validate_model(const model::ModelConfig& m) {
  require(m.vocab_size <= (int64_t{1} << 31) - 1, "model.vocab_size", fmt::format("{}", m.vocab_size),
          "must fit in int32 token ids");
  require(m.dim % m.n_heads == 0, "model.dim", fmt::format("{}", m.dim),
          fmt::format("must be divisible by model.n_heads = {}", m.n_heads));
  require(m.n_heads % m.n_kv_heads == 0, "model.n_heads", fmt::format("{}", m.n_heads),
          fmt::format("must be divisible by model.n_kv_heads = {}", m.n_kv_heads));
  require(m.head_dim() % 2 == 0, "model.dim", fmt::format("{}", m.dim),
          fmt::format("head dim dim/n_heads = {} must be even for rotary embeddings", m.head_dim()));
  require(m.rope_scaling == model::RopeScaling::kNone || m.rope_high_freq_factor > m.rope_low_freq_factor,
          "model.rope_high_freq_factor", fmt::format("{}", m.rope_high_freq_factor),
          fmt::format("must exceed model.rope_low_freq_factor = {} (the blend between them divides by the "
                      "difference)",
                      m.rope_low_freq_factor));
}

// Counts derived from the shape and the batch must fit in int64 (model::kMaxShapeCount).
void validate_sizes(const Config& c) {
  const model::ModelConfig& m = c.model;
  const model::ShapeTotals totals = model::shape_totals(m);
  require(totals.parameters < model::kMaxShapeCount, "model.dim", fmt::format("{}", m.dim),
          fmt::format("{:.3g} parameters: too many to count in an int64", totals.parameters));
  require(totals.layer_cells < model::kMaxShapeCount, "model.seq_len", fmt::format("{}", m.seq_len),
          "model.n_layers x model.seq_len x model.dim must fit in an int64");
  const int64_t batch = c.train.batch_size;
  require(
      static_cast<double>(batch) * static_cast<double>(m.seq_len) < model::kMaxShapeCount, "train.batch_size",
      fmt::format("{}", batch),
      fmt::format("tokens per step train.batch_size x model.seq_len = {} x {} must fit in an int64", batch, m.seq_len));
}

// Tensor parallelism divides the heads, key/value heads, hidden units and vocabulary among the
// group's ranks.
void validate_tensor_parallel(const Config& c) {
  const int64_t T = c.parallel.tensor;
  require(c.parallel.nproc % T == 0, "parallel.tensor", fmt::format("{}", T),
          fmt::format("must divide parallel.nproc = {}", c.parallel.nproc));
  const model::ModelConfig& m = c.model;
  for (const auto& [key, v] : {std::pair{"model.n_heads", m.n_heads},
                               {"model.n_kv_heads", m.n_kv_heads},
                               {"model.ffn_hidden", m.ffn_hidden},
                               {"model.vocab_size", m.vocab_size}}) {
    require(v % T == 0, key, fmt::format("{}", v),
            fmt::format("must be divisible by parallel.tensor = {} (each tensor-parallel rank holds 1/{})", T, T));
  }
}

// Pipeline stages hold consecutive blocks, at least one each.
void validate_pipeline(const Config& c) {
  const int64_t P = c.parallel.pipeline;
  require(c.parallel.nproc % (P * c.parallel.tensor) == 0, "parallel.pipeline", fmt::format("{}", P),
          fmt::format("x parallel.tensor = {} must divide parallel.nproc = {}", c.parallel.tensor, c.parallel.nproc));
  if (P == 1) return;
  require(P <= c.model.n_layers, "parallel.pipeline", fmt::format("{}", P),
          fmt::format("must be <= model.n_layers = {} (each stage holds a block at least)", c.model.n_layers));
}

// Blocks per stage set by hand.
void validate_pipeline_layers(const Config& c) {
  const std::vector<int64_t>& layers = c.parallel.pipeline_layers;
  const int64_t P = c.parallel.pipeline;
  if (layers.empty()) return;
  const std::string shown = integers_text(layers);
  require(std::ssize(layers) == P, "parallel.pipeline_layers", shown,
          fmt::format("needs one block count per stage: {} for parallel.pipeline = {}", P, P));
  require(std::all_of(layers.begin(), layers.end(), [](int64_t n) { return n >= 1; }), "parallel.pipeline_layers",
          shown, "every stage needs a block at least");
  require(std::accumulate(layers.begin(), layers.end(), int64_t{0}) == c.model.n_layers, "parallel.pipeline_layers",
          shown, fmt::format("must add up to model.n_layers = {}", c.model.n_layers));
}

// The batch is cut among the data-parallel ranks, D = nproc / (pipeline x tensor).
void validate_batch_and_ranks(const Config& c) {
  const TrainConfig& t = c.train;
  const ParallelConfig& p = c.parallel;
  const int64_t D = c.data_parallel();
  const std::string ranks = p.tensor == 1 && p.pipeline == 1 ? "parallel.nproc"
                            : p.pipeline == 1                ? "(parallel.nproc / parallel.tensor)"
                                              : "(parallel.nproc / (parallel.pipeline x parallel.tensor))";
  require(p.shard_group_size == 0 || D % p.shard_group_size == 0, "parallel.shard_group_size",
          fmt::format("{}", p.shard_group_size), fmt::format("must divide {} = {} (0: all of them)", ranks, D));
  require(t.batch_size % D == 0, "train.batch_size", fmt::format("{}", t.batch_size),
          fmt::format("must be divisible by {} = {}", ranks, D));
  // Also keeps D x micro_batch_size (below, and in accumulation_steps()) inside int64.
  require(t.micro_batch_size <= t.batch_size / D, "train.micro_batch_size", fmt::format("{}", t.micro_batch_size),
          fmt::format("must be <= train.batch_size / {} = {}", ranks, t.batch_size / D));
  require(t.batch_size % (D * c.micro_batch()) == 0, "train.batch_size", fmt::format("{}", t.batch_size),
          fmt::format("must be divisible by {} x train.micro_batch_size = {} x {}", ranks, D, c.micro_batch()));
}

// Sequence parallelism cuts each micro-batch's tokens among the tensor-parallel ranks.
void validate_sequence_parallel(const Config& c) {
  const int64_t T = c.parallel.tensor;
  if (!c.sequence_parallel()) return;
  require(c.micro_batch() * c.model.seq_len % T == 0, "parallel.sequence_parallel", "true",
          fmt::format("needs train.micro_batch_size x model.seq_len = {} x {} divisible by parallel.tensor = {}",
                      c.micro_batch(), c.model.seq_len, T));
}

}  // namespace

std::vector<std::pair<std::string, Bounds>> numeric_key_bounds() {
  std::vector<std::pair<std::string, Bounds>> out;
  for (const Key& k : schema()) {
    if (k.number) out.emplace_back(k.name, k.bounds);
  }
  return out;
}

void validate(const Config& c) {
  for (const Key& k : schema()) {
    if (!k.number) continue;
    const double v = k.number(c);
    require(k.bounds.contains(v) && std::isfinite(v), k.name, k.get(c), describe(k.bounds, k.real));
  }
  validate_model(c.model);
  validate_sizes(c);
  validate_tensor_parallel(c);
  validate_pipeline(c);
  validate_pipeline_layers(c);
  validate_batch_and_ranks(c);
  validate_sequence_parallel(c);
  const TrainConfig& t = c.train;
  require(t.min_lr <= t.lr, "train.min_lr", fmt::format("{}", t.min_lr),
          fmt::format("must be in [0, train.lr = {}]", t.lr));
  require(t.lr_decay != LrDecay::kNone || t.lr_decay_steps == 0, "train.lr_decay_steps",
          fmt::format("{}", t.lr_decay_steps), "has no effect with train.lr_decay = \"none\": set 0");
  storage::check_location(c.checkpoint.mirror_dir, "checkpoint.mirror_dir");
  storage::check_location(c.data.dataset, "data.dataset");
  require(c.data.synthetic || !c.data.dataset.empty(), "data.dataset", "\"\"",
          "name a prepared dataset directory, \"bundled\", or set data.synthetic = true");
  require(!c.metrics.prometheus_host.empty(), "metrics.prometheus_host", "\"\"",
          "name an address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)");
}

std::string to_toml(const Config& c) {
  std::ostringstream out;
  std::string section;
  for (const Key& k : schema()) {
    const size_t dot = k.name.find('.');
    const std::string s = k.name.substr(0, dot);
    if (s != section) {
      out << (section.empty() ? "" : "\n") << "[" << s << "]\n";
      section = s;
    }
    out << k.name.substr(dot + 1) << " = " << k.get(c) << "\n";
  }
  return out.str();
}

}  // namespace tessera::config
