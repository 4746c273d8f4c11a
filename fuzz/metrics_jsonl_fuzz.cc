// Fuzzes the reader of metrics.jsonl (metrics::detail::read_metrics, what `tessera report` reads
// back). The input is tried as the whole file and as one record between two valid ones. What an
// accepted file promises (report.h): one step per record, integral and increasing; every column
// as long as the records; a straggler count per rank of at most one per record, for a rank >= 0.
// And it round-trips: the columns written back as records (nulls where a record has no value)
// read back to the same columns.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "harness.h"
#include "metrics/report.h"

namespace tessera::fuzz {
namespace {

using metrics::detail::Metrics;

// Equal columns, a non-finite value (written back as null) equal to any other.
bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(a[i]) != std::isfinite(b[i]) || (std::isfinite(a[i]) && a[i] != b[i])) return false;
  }
  return true;
}

bool same_metrics(const Metrics& a, const Metrics& b) {
  if (a.records != b.records || a.step != b.step || a.straggler_steps != b.straggler_steps) return false;
  if (a.scalars.size() != b.scalars.size() || a.per_rank.size() != b.per_rank.size()) return false;
  for (const auto& [key, column] : a.scalars) {
    auto it = b.scalars.find(key);
    if (it == b.scalars.end() || !same_values(column, it->second)) return false;
  }
  for (const auto& [key, ranks] : a.per_rank) {
    auto it = b.per_rank.find(key);
    if (it == b.per_rank.end() || it->second.size() != ranks.size()) return false;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (!same_values(ranks[r], it->second[r])) return false;
    }
  }
  return true;
}

// The columns as metrics.jsonl records, or "" when they cannot be (a key both a number and an
// array in different records, a step beyond int64).
std::string write_back(const Metrics& m) {
  for (const auto& [key, ranks] : m.per_rank) {
    if (m.scalars.count(key)) return "";
  }
  std::string out;
  for (size_t i = 0; i < m.records; ++i) {
    if (!(m.step[i] < 0x1p63)) return "";
    nlohmann::ordered_json r = {{"step", static_cast<int64_t>(m.step[i])}};
    for (const auto& [key, column] : m.scalars) r[key] = column[i];  // NaN, inf: null
    for (const auto& [key, ranks] : m.per_rank) {
      nlohmann::ordered_json values = nlohmann::ordered_json::array();
      for (const auto& column : ranks) values.push_back(column[i]);
      r[key] = values;
    }
    nlohmann::ordered_json stragglers = nlohmann::ordered_json::array();
    for (const auto& [rank, count] : m.straggler_steps) {
      if (static_cast<size_t>(count) > i) stragglers.push_back(rank);  // the first `count` records
    }
    if (!stragglers.empty()) r["stragglers"] = stragglers;
    out += dump_json(r) + "\n";
  }
  return out;
}

void check(const std::string& text) {
  const std::string path = write_input("metrics.jsonl", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  Metrics m;
  if (!parses([&] { m = metrics::detail::read_metrics(path); })) return;
  FUZZ_CHECK(m.step.size() == m.records);
  for (size_t i = 0; i < m.records; ++i) {
    FUZZ_CHECK(std::floor(m.step[i]) == m.step[i] && (i == 0 || m.step[i] > m.step[i - 1]));
  }
  for (const auto& [key, column] : m.scalars) {
    FUZZ_CHECK(column.size() == m.records);
    const bool finite = std::any_of(column.begin(), column.end(), [](double v) { return std::isfinite(v); });
    FUZZ_CHECK((m.column(key) != nullptr) == finite);
  }
  for (const auto& [key, ranks] : m.per_rank) {
    for (const auto& column : ranks) FUZZ_CHECK(column.size() == m.records);
  }
  for (const auto& [rank, count] : m.straggler_steps) {
    FUZZ_CHECK(rank >= 0 && count >= 1 && static_cast<size_t>(count) <= m.records);
  }
  const std::string again = write_back(m);
  if (again.empty()) return;
  write_input("metrics.jsonl", reinterpret_cast<const uint8_t*>(again.data()), again.size());
  Metrics back;
  try {
    back = metrics::detail::read_metrics(path);
  } catch (const Error& e) {
    finding(std::string("the records of an accepted metrics.jsonl do not read back: ") + e.what() + "\n" + again);
  }
  FUZZ_CHECK(same_metrics(m, back));
}

// Records as the trainer writes them (train/step_log.cc), one a line.
const char* const kFirst =
    R"({"step":1,"time":1767225600.25,"elapsed_s":0.5,"loss":8.3125,"lr":1e-05,"grad_norm":3.5,"tokens":4096,)"
    R"("step_s":0.5,"data_wait_s":0.001,"forward_s":0.2,"backward_s":0.25,"comm_s":0.02,"optimizer_s":0.02,)"
    R"("other_s":0.009,"checkpoint_s":0.0,"tokens_per_s":8192.0,"model_flops_per_s":2.5e11,"mfu":0.31,)"
    R"("rss_bytes":104857600,"peak_rss_bytes":110100480,"rank_busy_s":[0.45,0.47],)"
    R"("rank_rss_bytes":[104857600,103809024]})";
const char* const kLast =
    R"({"step":9000000,"time":1767229200.5,"elapsed_s":3600.25,"loss":null,"lr":0.0003,"grad_norm":null,)"
    R"("tokens":36864000000,"step_s":0.5,"val_loss":3.125,"val_tokens":33536,"eval_s":9.0,)"
    R"("rank_busy_s":[0.45,0.9],"rank_rss_bytes":[104857600,103809024],"stragglers":[1],"skipped":true,)"
    R"("skipped_steps":2})";

}  // namespace

void write_seeds(const std::string& dir) {
  std::ofstream(dir + "/run.jsonl", std::ios::binary)
      << kFirst << "\n"
      << R"({"step":2,"time":1767225600.75,"loss":8.25,"lr":2e-05,"grad_norm":3.25,"tokens":8192,"step_s":0.5})"
      << "\n\n"
      << kLast << "\n";
  // A live run's file: the last record still being written.
  std::ofstream(dir + "/live.jsonl", std::ios::binary) << kFirst << "\n"
                                                       << R"({"step":2,"time":17672)";
  std::ofstream(dir + "/one-rank.jsonl", std::ios::binary)
      << R"({"step":5,"loss":6.0,"lr":0.001,"tokens_per_s":1300.5,"mfu":null,"note":"x"})"
      << "\n";
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::fuzz;
  std::string text(reinterpret_cast<const char*>(data), size);
  check(text);
  // The input as one record between two: the line parser, with records before and after it.
  std::replace(text.begin(), text.end(), '\n', ' ');
  check(std::string(kFirst) + "\n" + text + "\n" + kLast + "\n");
  return 0;
}
