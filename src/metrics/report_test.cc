// The run report's pieces: tick values, downsampling, escaping, metrics.jsonl parsing and errors.
#include "metrics/report.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace tessera::metrics::detail {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the test temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::path(::testing::TempDir()) / fmt::format("report_{}_{}", name, ::getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The DataError message read_metrics throws for `text`, or "" when it does not throw.
std::string metrics_error(const std::string& text) {
  TempDir dir("error");
  const std::string path = dir.file("metrics.jsonl", text);
  try {
    read_metrics(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(ReportNiceTicks, KnownRanges) {
  Ticks t = nice_ticks(0, 1, 5);
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  ASSERT_EQ(t.values.size(), 6u);
  EXPECT_DOUBLE_EQ(t.values.front(), 0);
  EXPECT_NEAR(t.values.back(), 1, 1e-12);

  t = nice_ticks(3.2, 7.9, 5);
  EXPECT_DOUBLE_EQ(t.step, 1);
  EXPECT_EQ(t.values, (std::vector<double>{3, 4, 5, 6, 7, 8}));

  t = nice_ticks(1, 100000, 8);
  EXPECT_DOUBLE_EQ(t.step, 20000);
  EXPECT_EQ(t.values, (std::vector<double>{0, 20000, 40000, 60000, 80000, 100000}));

  t = nice_ticks(-0.3, 0.7, 5);  // zero is a tick, and not "-0"
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  EXPECT_EQ(std::count(t.values.begin(), t.values.end(), 0.0), 1);
  for (const double v : t.values) EXPECT_FALSE(v == 0 && std::signbit(v));
}

TEST(ReportNiceTicks, DegenerateRanges) {
  Ticks t = nice_ticks(5, 5, 5);
  EXPECT_LE(t.values.front(), 4.5);
  EXPECT_GE(t.values.back(), 5.5);
  t = nice_ticks(0, 0, 5);
  EXPECT_LE(t.values.front(), -1);
  EXPECT_GE(t.values.back(), 1);
  t = nice_ticks(NAN, INFINITY, 5);
  EXPECT_GE(t.values.size(), 2u);
}

TEST(ReportNiceTicks, CoverTheRangeWithFewRoundSteps) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-6, 9), unit(-1, 1);
  for (int i = 0; i < 2000; ++i) {
    const double scale = std::pow(10.0, exponent(rng));
    double lo = unit(rng) * scale, hi = unit(rng) * scale;
    if (lo > hi) std::swap(lo, hi);
    if (lo == hi) continue;
    const int target = 3 + i % 6;
    const Ticks t = nice_ticks(lo, hi, target);
    SCOPED_TRACE(fmt::format("[{}, {}] target {}: step {}", lo, hi, target, t.step));
    ASSERT_GE(t.values.size(), 2u);
    EXPECT_LE(t.values.front(), lo + 1e-9 * scale);
    EXPECT_GE(t.values.back(), hi - 1e-9 * scale);
    EXPECT_LE(static_cast<int>(t.values.size()) - 1, target + 2);
    const double mantissa = t.step / std::pow(10.0, std::floor(std::log10(t.step) + 1e-9));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9)
        << mantissa;
  }
}

TEST(ReportTickLabel, DecimalsFromTheStepAndUnits) {
  EXPECT_EQ(tick_label(0.1 * 3, 0.1, 1), "0.3");
  EXPECT_EQ(tick_label(0, 0.2, 1), "0");
  EXPECT_EQ(tick_label(-0.0, 0.2, 1), "0");
  EXPECT_EQ(tick_label(4.5, 0.5, 6), "4.5");
  EXPECT_EQ(tick_label(0.0003, 0.0001, 0.0005), "0.0003");
  EXPECT_EQ(tick_label(40000, 20000, 100000), "40k");
  EXPECT_EQ(tick_label(200, 200, 1000), "200");
  EXPECT_EQ(tick_label(5000, 1000, 9000), "5000");
  EXPECT_EQ(tick_label(1.5e6, 5e5, 2e6), "1.5M");
  EXPECT_EQ(tick_label(2e11, 1e11, 4e11), "200G");
}

TEST(ReportDownsample, ShortSeriesUnchanged) {
  const std::vector<double> x = {1, 2, 3}, y = {3, 1, 2};
  std::vector<double> ox, oy;
  downsample_minmax(x, y, 1000, &ox, &oy);
  EXPECT_EQ(ox, x);
  EXPECT_EQ(oy, y);
}

TEST(ReportDownsample, BoundedKeepsExtremesAndOrder) {
  const size_t n = 100000;
  std::vector<double> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i + 1), y[i] = std::sin(0.001 * static_cast<double>(i));
  y[54321] = 50;   // a spike
  y[77777] = -50;  // and a dip, both kept
  std::vector<double> ox, oy;
  downsample_minmax(x, y, 1000, &ox, &oy);
  ASSERT_EQ(ox.size(), oy.size());
  EXPECT_LE(ox.size(), 1000u);
  EXPECT_GE(ox.size(), 500u);
  EXPECT_TRUE(std::is_sorted(ox.begin(), ox.end()));
  EXPECT_EQ(std::adjacent_find(ox.begin(), ox.end()), ox.end());  // no point twice
  EXPECT_EQ(*std::max_element(oy.begin(), oy.end()), 50);
  EXPECT_EQ(*std::min_element(oy.begin(), oy.end()), -50);
  EXPECT_NE(std::find(ox.begin(), ox.end(), 54322.0), ox.end());
  for (size_t i = 0; i < ox.size(); ++i) EXPECT_EQ(oy[i], y[static_cast<size_t>(ox[i]) - 1]);  // real points
}

TEST(ReportHtmlEscape, AllFiveCharacters) {
  EXPECT_EQ(html_escape(R"(<a href="x">Tom & 'Jerry'</a>)"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
  EXPECT_EQ(html_escape("plain text"), "plain text");
  EXPECT_EQ(html_escape(""), "");
}

TEST(ReportReadMetrics, ColumnsWithGapsNullsAndRanks) {
  TempDir dir("columns");
  const std::string path = dir.file("metrics.jsonl",
                                    "{\"step\":1,\"loss\":6.0,\"rank_busy_s\":[0.1,0.2]}\n"
                                    "\n"
                                    "{\"step\":2,\"loss\":null,\"val_loss\":5.5,\"skipped\":true,\"note\":\"x\"}\n"
                                    "{\"step\":3,\"loss\":5.0,\"rank_busy_s\":[0.1,0.4],\"stragglers\":[1]}\n");
  const Metrics m = read_metrics(path);
  ASSERT_EQ(m.records, 3u);
  EXPECT_EQ(m.step, (std::vector<double>{1, 2, 3}));
  const auto* loss = m.column("loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ((*loss)[0], 6.0);
  EXPECT_TRUE(std::isnan((*loss)[1]));  // null: a non-finite loss
  EXPECT_EQ((*loss)[2], 5.0);
  const auto* val = m.column("val_loss");
  ASSERT_NE(val, nullptr);
  EXPECT_TRUE(std::isnan((*val)[0]) && std::isnan((*val)[2]));
  EXPECT_EQ((*val)[1], 5.5);
  EXPECT_EQ(m.column("mfu"), nullptr);
  EXPECT_EQ(m.column("note"), nullptr);  // strings of unknown keys are ignored
  const auto& busy = m.per_rank.at("rank_busy_s");
  ASSERT_EQ(busy.size(), 2u);
  EXPECT_EQ(busy[1][2], 0.4);
  EXPECT_TRUE(std::isnan(busy[1][1]));
  EXPECT_EQ(m.straggler_steps.at(1), 1);
}

TEST(ReportReadMetrics, MalformedLinesNameFileAndLine) {
  const std::string good = "{\"step\":1,\"loss\":6.0}\n";
  // Blank lines count: the number is the line in the file.
  std::string e = metrics_error(good + "\n{\"step\":2,\"loss\":\n");
  EXPECT_NE(e.find("metrics.jsonl:3: not JSON"), std::string::npos) << e;
  e = metrics_error(good + "[1,2]\n");
  EXPECT_NE(e.find("metrics.jsonl:2: not a JSON object"), std::string::npos) << e;
  e = metrics_error(good + "{\"loss\":1}\n");
  EXPECT_NE(e.find("metrics.jsonl:2: no integer \"step\""), std::string::npos) << e;
  e = metrics_error(good + "{\"step\":2,\"loss\":\"low\"}\n");
  EXPECT_NE(e.find("metrics.jsonl:2: \"loss\" is not a number"), std::string::npos) << e;
  e = metrics_error(good + "{\"step\":2,\"rank_busy_s\":0.5}\n");
  EXPECT_NE(e.find("metrics.jsonl:2: \"rank_busy_s\" is not an array"), std::string::npos) << e;
  e = metrics_error(good + good);
  EXPECT_NE(e.find("metrics.jsonl:2: step 1 after step 1"), std::string::npos) << e;
  EXPECT_EQ(metrics_error(good + "\n"), "");
  // An unfinished last record (no newline yet: a live run, or a crash mid-write) is left out.
  EXPECT_EQ(metrics_error(good + "{\"step\":2,\"lo"), "");
  EXPECT_NE(metrics_error(good + "{\"step\":2,\"lo\n").find("metrics.jsonl:2: not JSON"), std::string::npos);
}

// What fuzz/metrics_jsonl_fuzz.cc found: a number beyond double's range is not a parse_error but
// nlohmann's out_of_range, which escaped read_metrics (and write_report's read of run.json), so
// `tessera report` aborted instead of naming the line.
TEST(ReportReadMetrics, NumberOutOfRangeNamesTheLine) {
  const std::string good = "{\"step\":1,\"loss\":6.0}\n";
  const std::string e = metrics_error(good + "{\"step\":2,\"loss\":1e999}\n");
  EXPECT_NE(e.find("metrics.jsonl:2: not JSON (a number out of range)"), std::string::npos) << e;
  EXPECT_EQ(metrics_error(good + "{\"step\":2,\"loss\":1e999"), "");  // unfinished: left out
  TempDir dir("info_range");
  dir.file("metrics.jsonl", good);
  dir.file("run.json", "{\"peak_flops_per_s\": 1e999}\n");
  EXPECT_THROW(write_report(dir.path(), dir.path() + "/report.html"), DataError);
}

// Found by the same target: "stragglers" is the list of ranks a record flags, and the summary
// counts the records that flag each rank. A negative rank was accepted, a rank listed twice
// counted twice, an object's values passed for the list, and 2^32 + 1 became rank 1.
TEST(ReportReadMetrics, StragglersAreDistinctRanksOfARecord) {
  const std::string good = "{\"step\":1,\"loss\":6.0}\n";
  for (const char* bad : {"[-1]", "{\"a\":1}", "[4294967297]", "[0.5]"}) {
    const std::string e = metrics_error(good + "{\"step\":2,\"stragglers\":" + bad + "}\n");
    EXPECT_NE(e.find("metrics.jsonl:2: \"stragglers\""), std::string::npos) << bad << ": " << e;
  }
  TempDir dir("stragglers");
  const Metrics m = read_metrics(dir.file("metrics.jsonl", good + "{\"step\":2,\"stragglers\":[1,1,3]}\n"));
  EXPECT_EQ(m.straggler_steps, (std::map<int, int>{{1, 1}, {3, 1}}));
}

TEST(ReportChartSvg, OneSeriesElementPerSeriesAndEscapedLegend) {
  const Series a{"a <b>", {1, 2, 3}, {1, 2, 3}}, b{"b", {1, 2, 3}, {3, 2, 1}};
  ChartOptions o;
  o.title = "t";
  const std::string lines = chart_svg({a, b}, o);
  EXPECT_EQ(count(lines, "class=\"series\""), 2u);
  EXPECT_EQ(count(lines, "<polyline"), 2u);
  EXPECT_NE(lines.find("a &lt;b&gt;"), std::string::npos);
  EXPECT_EQ(lines.find("<b>"), std::string::npos);
  o.stacked = true;
  const std::string stacked = chart_svg({a, b}, o);
  EXPECT_EQ(count(stacked, "class=\"series\""), 2u);
  EXPECT_EQ(count(stacked, "<path"), 2u);
  EXPECT_EQ(count(chart_svg({}, o), "class=\"series\""), 0u);  // no data: axes only, no crash
}

TEST(ReportWrite, NotARunDirectory) {
  TempDir dir("not_a_run");
  try {
    write_report(dir.path(), dir.path() + "/report.html");
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path() + ": not a run directory: no metrics.jsonl"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.path() + "/report.html"));
}

TEST(ReportWrite, EmptyMetricsGivesANote) {
  TempDir dir("empty");
  dir.file("metrics.jsonl", "");
  write_report(dir.path(), dir.path() + "/report.html");
  const std::string page = read_file(dir.path() + "/report.html");
  EXPECT_NE(page.find("no steps recorded"), std::string::npos);
  EXPECT_NE(page.find("no run.json"), std::string::npos);
}

TEST(ReportWrite, OldRecordsGetNotesNotFigures) {
  TempDir dir("old");
  std::string lines;
  for (int s = 1; s <= 20; ++s) {
    lines += fmt::format(
        "{{\"step\":{},\"loss\":{},\"lr\":0.001,\"grad_norm\":1,\"tokens\":{},\"step_s\":0.1,\"tokens_per_s\":5120,"
        "\"model_flops_per_s\":1e9{}}}\n",
        s, 6.0 - 0.1 * s, 512 * s, s % 10 == 0 ? ",\"val_loss\":5.0" : "");
  }
  dir.file("metrics.jsonl", lines);
  dir.file("run.json", R"({"config": "config.toml", "dataset": "/data/<x> & y"})");
  dir.file("config.toml", "[model]\npreset = \"tiny\" # <tag>\n");
  write_report(dir.path(), dir.path() + "/out.html");
  const std::string page = read_file(dir.path() + "/out.html");
  for (const char* id : {"plot-loss", "plot-throughput", "plot-mfu", "plot-time-split", "plot-memory", "plot-ranks"}) {
    EXPECT_NE(page.find(fmt::format("<figure id=\"{}\">", id)), std::string::npos) << id;
  }
  EXPECT_EQ(count(page, "class=\"series\""), 3u);  // loss, validation loss, tokens/s
  EXPECT_NE(page.find("no MFU: no peak known for this run"), std::string::npos);
  EXPECT_NE(page.find("no time split"), std::string::npos);
  EXPECT_NE(page.find("/data/&lt;x&gt; &amp; y"), std::string::npos);
  EXPECT_NE(page.find("# &lt;tag&gt;"), std::string::npos);
  EXPECT_NE(page.find("sum of step_s"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
}

// A GPU run's "gpu" records: utilization and power plotted, the hottest reading and the XIDs told;
// a CPU run gets no GPU figure, a GPU run without readings a note.
TEST(ReportWrite, GpuReadingsGetFigures) {
  TempDir dir("gpu");
  std::string lines;
  for (int s = 1; s <= 5; ++s) {
    lines += fmt::format(
        "{{\"step\":{},\"loss\":6,\"gpu\":{{\"index\":0,\"uuid\":\"GPU-1\",\"xid_count\":{},\"last_xid\":{},"
        "\"gpu_util_pct\":{},\"mem_copy_util_pct\":40,\"temperature_c\":{},\"power_w\":600.5}}}}\n",
        s, s >= 4 ? 1 : 0, s >= 4 ? 79 : 0, 90 + s, 60 + s);
  }
  dir.file("metrics.jsonl", lines);
  dir.file("run.json", R"j({"device": "cuda:0 (NVIDIA H200)"})j");
  write_report(dir.path(), dir.path() + "/out.html");
  std::string page = read_file(dir.path() + "/out.html");
  EXPECT_NE(page.find("<figure id=\"plot-gpu\">"), std::string::npos);
  EXPECT_NE(page.find("<figure id=\"plot-gpu-power\">"), std::string::npos);
  EXPECT_NE(page.find("data-name=\"GPU utilization\""), std::string::npos);
  EXPECT_NE(page.find("data-name=\"memory copy utilization\""), std::string::npos);
  EXPECT_NE(page.find("Hottest reading 65 C. 1 XID event(s), the last XID 79."), std::string::npos);
  const Metrics m = read_metrics(dir.path() + "/metrics.jsonl");
  EXPECT_EQ((*m.column("gpu.gpu_util_pct"))[2], 93);
  EXPECT_EQ(m.column("gpu.uuid"), nullptr);  // strings are not columns

  dir.file("metrics.jsonl", "{\"step\":1,\"loss\":6}\n");
  write_report(dir.path(), dir.path() + "/out.html");
  EXPECT_NE(read_file(dir.path() + "/out.html").find("no GPU readings"), std::string::npos);
  dir.file("run.json", R"({"device": "cpu"})");
  write_report(dir.path(), dir.path() + "/out.html");
  page = read_file(dir.path() + "/out.html");
  EXPECT_EQ(page.find("plot-gpu"), std::string::npos);
}

TEST(ReportWrite, ConfigNamedByRunJsonIsReadOnlyBesideIt) {
  TempDir dir("config_path");
  fs::create_directories(dir.path() + "/run");
  dir.file("run/metrics.jsonl", "{\"step\":1,\"loss\":6.0}\n");
  dir.file("run/run.json", R"({"config": "../secret.toml"})");
  dir.file("run/config.toml", "[model]\npreset = \"beside\"\n");
  dir.file("secret.toml", "not for the page\n");
  write_report(dir.path() + "/run", dir.path() + "/out.html");
  const std::string page = read_file(dir.path() + "/out.html");
  EXPECT_EQ(page.find("not for the page"), std::string::npos);
  EXPECT_NE(page.find("preset = &quot;beside&quot;"), std::string::npos);
}

TEST(ReportWrite, CorruptRunJsonNamesTheFile) {
  TempDir dir("bad_info");
  dir.file("metrics.jsonl", "{\"step\":1,\"loss\":6.0}\n");
  dir.file("run.json", "{\"config\": ");
  EXPECT_THROW(write_report(dir.path(), dir.path() + "/report.html"), DataError);
}

}  // namespace
}  // namespace tessera::metrics::detail
