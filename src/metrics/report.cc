// `tessera report`: metrics.jsonl and run.json as one HTML page with inline SVG charts.
#include "metrics/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/log.h"
#include "core/timer.h"
#include "tessera/build_config.h"

namespace tessera::metrics {
namespace detail {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Keys docs/metrics.md defines, checked for type; other keys (from newer writers) are read if
// numeric and otherwise ignored.
const std::set<std::string> kScalarKeys = {
    "time",         "elapsed_s",         "loss",       "lr",        "grad_norm",      "tokens",   "step_s",
    "data_wait_s",  "forward_s",         "backward_s", "comm_s",    "optimizer_s",    "other_s",  "checkpoint_s",
    "tokens_per_s", "model_flops_per_s", "mfu",        "rss_bytes", "peak_rss_bytes", "val_loss", "eval_s",
    "val_tokens",   "skipped",           "skipped_steps"};
const std::set<std::string> kRankKeys = {"rank_busy_s", "rank_rss_bytes"};

void append(std::vector<double>* column, size_t record, double value) {
  column->resize(record, kNaN);
  column->push_back(value);
}

}  // namespace

const std::vector<double>* Metrics::column(const std::string& key) const {
  auto it = scalars.find(key);
  if (it == scalars.end()) return nullptr;
  const bool any = std::any_of(it->second.begin(), it->second.end(), [](double v) { return std::isfinite(v); });
  return any ? &it->second : nullptr;
}

Metrics read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("cannot read {}", path));
  Metrics m;
  std::string line;
  size_t line_no = 0;
  auto fail = [&](const std::string& why) { throw DataError(fmt::format("{}:{}: {}", path, line_no, why)); };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json r;
    try {
      r = parse_json_or_throw(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range for a number like 1e999
      // A last line without its newline is a record being written (a live run) or cut off by a
      // crash: the report covers the records before it.
      if (in.eof()) {
        log::warn("{}:{}: an unfinished last record, left out", path, line_no);
        break;
      }
      const auto* syntax = dynamic_cast<const nlohmann::json::parse_error*>(&e);
      fail(syntax != nullptr ? fmt::format("not JSON (syntax error at column {})", syntax->byte)
                             : std::string("not JSON (a number out of range)"));
    }
    if (!r.is_object()) fail("not a JSON object");
    if (!r.contains("step") || !r["step"].is_number_integer()) fail("no integer \"step\"");
    const double step = r["step"].get<double>();
    if (!m.step.empty() && step <= m.step.back()) {
      fail(fmt::format("step {} after step {}: records out of order", step, m.step.back()));
    }
    const size_t i = m.records++;
    m.step.push_back(step);
    for (const auto& [key, v] : r.items()) {
      if (key == "step") continue;
      if (v.is_number() || v.is_boolean() || v.is_null()) {  // null: a non-finite value
        if (kRankKeys.count(key) || key == "stragglers") fail(fmt::format("\"{}\" is not an array", key));
        append(&m.scalars[key], i, v.is_null() ? kNaN : v.is_boolean() ? double(v.get<bool>()) : v.get<double>());
      } else if (key == "stragglers") {
        if (!v.is_array()) fail("\"stragglers\" is not an array");
        std::set<int> flagged;  // a rank counts once per record
        for (const auto& rank : v) {
          if (!rank.is_number_integer() || rank.get<int64_t>() < 0 || rank.get<int64_t>() > INT_MAX) {
            fail("\"stragglers\" holds something other than a rank (an integer >= 0)");
          }
          flagged.insert(rank.get<int>());
        }
        for (const int rank : flagged) ++m.straggler_steps[rank];
      } else if (v.is_array()) {
        if (kScalarKeys.count(key)) fail(fmt::format("\"{}\" is not a number", key));
        std::vector<std::vector<double>>& ranks = m.per_rank[key];
        if (ranks.size() < v.size()) ranks.resize(v.size());
        for (size_t k = 0; k < v.size(); ++k) {
          if (!v[k].is_number() && !v[k].is_null()) fail(fmt::format("\"{}\"[{}] is not a number", key, k));
          append(&ranks[k], i, v[k].is_null() ? kNaN : v[k].get<double>());
        }
      } else if (kScalarKeys.count(key) || kRankKeys.count(key)) {
        fail(fmt::format("\"{}\" is not a number", key));
      } else if (v.is_object()) {  // e.g. "gpu": its numbers as "gpu.temperature_c", ...
        for (const auto& [member, x] : v.items()) {
          if (x.is_number()) append(&m.scalars[key + "." + member], i, x.get<double>());
        }
      }
    }
  }
  if (in.bad()) throw IoError(fmt::format("error reading {}", path));
  for (auto& [key, column] : m.scalars) column.resize(m.records, kNaN);
  for (auto& [key, ranks] : m.per_rank) {
    for (auto& column : ranks) column.resize(m.records, kNaN);
  }
  return m;
}

Ticks nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  Ticks t;
  t.step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * magnitude;
  // The tolerance keeps a bound that is a multiple of the step from adding a tick.
  const double first = std::floor(lo / t.step + 1e-9), last = std::ceil(hi / t.step - 1e-9);
  for (double k = first; k <= last; ++k) t.values.push_back(k * t.step + 0.0);  // + 0.0: no -0
  return t;
}

std::string tick_label(double value, double step, double unit_of) {
  const double a = std::abs(unit_of);
  // Plain numbers up to 9999 (a 1000-step axis reads 200, 400, ..., not 0.2k).
  const double unit = a >= 1e9 ? 1e9 : a >= 1e6 ? 1e6 : a >= 1e4 ? 1e3 : 1;
  const char* suffix = a >= 1e9 ? "G" : a >= 1e6 ? "M" : a >= 1e4 ? "k" : "";
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step / unit) - 1e-9)), 0, 12);
  std::string s = fmt::format("{:.{}f}", value / unit, decimals);
  if (s.find_first_not_of("-0.") == std::string::npos) s = "0";
  return s + (s == "0" ? "" : suffix);
}

void downsample_minmax(const std::vector<double>& x, const std::vector<double>& y, size_t max_points,
                       std::vector<double>* out_x, std::vector<double>* out_y) {
  const size_t n = x.size();
  out_x->clear();
  out_y->clear();
  if (n <= max_points) {
    *out_x = x;
    *out_y = y;
    return;
  }
  const size_t buckets = std::max<size_t>(1, max_points / 2);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    size_t imin = lo, imax = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (y[i] < y[imin]) imin = i;
      if (y[i] > y[imax]) imax = i;
    }
    const size_t first = std::min(imin, imax), second = std::max(imin, imax);
    out_x->push_back(x[first]);
    out_y->push_back(y[first]);
    if (second != first) {
      out_x->push_back(x[second]);
      out_y->push_back(y[second]);
    }
  }
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// Tableau 10: distinct hues that stay apart for the colour-blind.
const char* color(size_t i) {
  static const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kPalette[i % std::size(kPalette)];
}

// Stacked series are drawn as steps: point i covers x from the midpoint with its left neighbour
// to the midpoint with its right one (a bucket of steps after downsampling; 1 step for a lone point).
std::vector<double> step_edges(const std::vector<double>& x) {
  const size_t n = x.size();
  std::vector<double> edges(n + 1);
  for (size_t i = 1; i < n; ++i) edges[i] = 0.5 * (x[i - 1] + x[i]);
  edges[0] = n > 1 ? x[0] - (edges[1] - x[0]) : x[0] - 0.5;
  edges[n] = n > 1 ? x[n - 1] + (x[n - 1] - edges[n - 1]) : x[0] + 0.5;
  return edges;
}

// Legend entries flow in rows across the top; DejaVu Sans at 12 px is under 8 px a character.
struct Legend {
  std::string svg;
  double height = 0;
};
Legend legend_svg(const std::vector<Series>& series, double width) {
  Legend out;
  double lx = 0, ly = 0;
  for (size_t i = 0; i < series.size(); ++i) {
    const double w = 32 + 8.0 * static_cast<double>(series[i].name.size());
    if (lx > 0 && lx + w > width) lx = 0, ly += 18;
    out.svg += fmt::format(
        "<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n",
        72 + lx, 8 + ly, color(i), 72 + lx + 16, 18 + ly, html_escape(series[i].name));
    lx += w;
  }
  out.height = series.empty() ? 0 : ly + 24;
  return out;
}

// The plot area (pixels), the axes' data ranges and ticks, and the mapping between them. A
// stacked chart's top is the sum of its series, drawn as steps between `edges`.
struct Plot {
  double x0, x1, y0, y1;  // pixels
  double xa, xb, ya, yb;  // data at the axes' ends
  Ticks xt, yt;
  std::vector<double> edges, tops;  // stacked only
  double px(double x) const { return x0 + (x - xa) / (xb - xa) * (x1 - x0); }
  double py(double y) const { return y1 - (y - ya) / (yb - ya) * (y1 - y0); }
};

Plot plot_area(const std::vector<Series>& series, const ChartOptions& o, double top, double bottom) {
  Plot p;
  p.x0 = 72, p.x1 = o.width - 16, p.y0 = top, p.y1 = bottom;
  double xmin = INFINITY, xmax = -INFINITY, ymin = o.zero_based ? 0 : INFINITY, ymax = o.zero_based ? 0 : -INFINITY;
  if (o.stacked && !series.empty() && !series[0].x.empty()) {
    p.edges = step_edges(series[0].x);
    p.tops.assign(series[0].x.size(), 0.0);
    for (const Series& s : series) {
      for (size_t i = 0; i < std::min(s.y.size(), p.tops.size()); ++i) p.tops[i] += s.y[i];
    }
    xmin = series[0].x.front(), xmax = series[0].x.back();
    for (const double v : p.tops) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
  } else {
    for (const Series& s : series) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        xmin = std::min(xmin, s.x[i]), xmax = std::max(xmax, s.x[i]);
        ymin = std::min(ymin, s.y[i]), ymax = std::max(ymax, s.y[i]);
      }
    }
  }
  if (!(xmax >= xmin)) xmin = 0, xmax = 1;
  if (!(ymax >= ymin)) ymin = 0, ymax = 1;
  if (xmax - xmin < 5) xmax = xmin + 5;  // steps are integers: no fractional step ticks
  p.xt = nice_ticks(xmin, xmax, 8), p.yt = nice_ticks(ymin, ymax, 5);
  // A stacked chart's outer steps reach half a step past the data: widen the axis, not the ticks.
  p.xa = std::min(p.xt.values.front(), p.edges.empty() ? xmin : p.edges.front());
  p.xb = std::max(p.xt.values.back(), p.edges.empty() ? xmax : p.edges.back());
  p.ya = p.yt.values.front(), p.yb = p.yt.values.back();
  return p;
}

std::string grid_svg(const Plot& p) {
  std::string svg;
  const double y_unit_of = std::max(std::abs(p.ya), std::abs(p.yb));
  const double x_unit_of = std::max(std::abs(p.xa), std::abs(p.xb));
  for (const double v : p.yt.values) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{1:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        p.x0, p.x1, p.py(v), p.x0 - 6, p.py(v) + 4, tick_label(v, p.yt.step, y_unit_of));
  }
  for (const double v : p.xt.values) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#f0f0f0\"/>"
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{2:.1f}\" y2=\"{3:.1f}\" stroke=\"#555\"/>"
        "<text x=\"{0:.1f}\" y=\"{4:.1f}\" text-anchor=\"middle\">{5}</text>\n",
        p.px(v), p.y0, p.y1, p.y1 + 5, p.y1 + 18, tick_label(v, p.xt.step, x_unit_of));
  }
  return svg;
}

// Each series a band of steps on top of the ones before it.
std::string stacked_svg(const std::vector<Series>& series, const Plot& p) {
  std::string svg;
  std::vector<double> below(p.tops.size(), 0.0);
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    std::string upper, lower;
    for (size_t i = 0; i < std::min(s.y.size(), below.size()); ++i) {
      const double top = below[i] + s.y[i];
      upper += fmt::format("{}{:.1f},{:.1f} {:.1f},{:.1f} ", i == 0 ? "M" : "L", p.px(p.edges[i]), p.py(top),
                           p.px(p.edges[i + 1]), p.py(top));
      lower = fmt::format("L{:.1f},{:.1f} {:.1f},{:.1f} ", p.px(p.edges[i + 1]), p.py(below[i]), p.px(p.edges[i]),
                          p.py(below[i])) +
              lower;
      below[i] = top;
    }
    svg += fmt::format("<path class=\"series\" data-name=\"{}\" fill=\"{}\" stroke=\"none\" d=\"{}{}Z\"/>\n",
                       html_escape(s.name), color(k), upper, lower);
  }
  return svg;
}

std::string lines_svg(const std::vector<Series>& series, const Plot& p) {
  std::string svg;
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    std::string points;
    for (size_t i = 0; i < s.x.size(); ++i) points += fmt::format("{:.1f},{:.1f} ", p.px(s.x[i]), p.py(s.y[i]));
    if (!points.empty()) points.pop_back();
    svg += fmt::format(
        "<polyline class=\"series\" data-name=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" "
        "stroke-linejoin=\"round\" points=\"{}\"/>\n",
        html_escape(s.name), color(k), points);
    if (s.x.size() <= 60) {  // few points (evaluations, short runs): mark each one
      for (size_t i = 0; i < s.x.size(); ++i) {
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>", p.px(s.x[i]), p.py(s.y[i]),
                           color(k));
      }
      svg += "\n";
    }
  }
  return svg;
}

}  // namespace

std::string chart_svg(const std::vector<Series>& series, const ChartOptions& o) {
  const Legend legend = legend_svg(series, o.width - 80);
  const double height = o.height + legend.height;
  const Plot p = plot_area(series, o, legend.height + 8, height - 42);
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {0} {1:.0f}\" width=\"{0}\" height=\"{1:.0f}\" "
      "role=\"img\" aria-label=\"{2}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"12\">\n",
      o.width, height, html_escape(o.title));
  svg += legend.svg + grid_svg(p) + (o.stacked ? stacked_svg(series, p) : lines_svg(series, p));
  svg += fmt::format(
      "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#555\"/>"
      "<line x1=\"{0:.1f}\" x2=\"{3:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#555\"/>\n"
      "<text x=\"{4:.1f}\" y=\"{5:.1f}\" text-anchor=\"middle\">{6}</text>\n"
      "<text transform=\"translate(16 {7:.1f}) rotate(-90)\" text-anchor=\"middle\">{8}</text>\n</svg>\n",
      p.x0, p.y0, p.y1, p.x1, 0.5 * (p.x0 + p.x1), height - 6, html_escape(o.x_label), 0.5 * (p.y0 + p.y1),
      html_escape(o.y_label));
  return svg;
}

namespace {

constexpr size_t kMaxPoints = 1000;  // per line series (min/max buckets beyond)
constexpr size_t kMaxBars = 500;     // per stacked chart (mean buckets beyond)

// The finite values of `column` against step, times `scale`, downsampled to `max_points`.
Series make_series(const std::string& name, const Metrics& m, const std::vector<double>& column, double scale = 1,
                   size_t max_points = kMaxPoints) {
  std::vector<double> x, y;
  for (size_t i = 0; i < m.records; ++i) {
    if (std::isfinite(column[i])) x.push_back(m.step[i]), y.push_back(column[i] * scale);
  }
  Series s{name, {}, {}};
  downsample_minmax(x, y, max_points, &s.x, &s.y);
  return s;
}

// Mean of each column over buckets of consecutive records (missing values count as 0), at most
// max_buckets of them; x is the bucket's mean step.
std::vector<Series> bucket_means(const Metrics& m,
                                 const std::vector<std::pair<std::string, const std::vector<double>*>>& columns,
                                 size_t max_buckets) {
  const size_t n = m.records, buckets = std::min(n, max_buckets);
  std::vector<Series> out;
  for (const auto& [name, column] : columns) out.push_back(Series{name, {}, {}});
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * n / buckets, hi = (b + 1) * n / buckets;
    double x = 0;
    for (size_t i = lo; i < hi; ++i) x += m.step[i];
    for (size_t k = 0; k < columns.size(); ++k) {
      double sum = 0;
      for (size_t i = lo; i < hi; ++i) sum += std::isfinite((*columns[k].second)[i]) ? (*columns[k].second)[i] : 0.0;
      out[k].x.push_back(x / static_cast<double>(hi - lo));
      out[k].y.push_back(sum / static_cast<double>(hi - lo));
    }
  }
  return out;
}

// A figure: the chart, or a note saying why there is none.
std::string figure(const std::string& id, const std::string& caption, const std::string& body_or_note, bool note,
                   const std::string& remark = "") {
  return fmt::format("<figure id=\"{}\">\n<figcaption>{}</figcaption>\n{}{}</figure>\n", id, html_escape(caption),
                     note ? fmt::format("<p class=\"note\">{}</p>\n", html_escape(body_or_note)) : body_or_note,
                     remark.empty() ? "" : fmt::format("<p class=\"remark\">{}</p>\n", html_escape(remark)));
}

std::string format_seconds(double s) {
  if (s < 120) return fmt::format("{:.1f} s", s);
  const long long t = std::llround(s);
  if (t < 3600) return fmt::format("{}m {:02}s", t / 60, t % 60);
  return fmt::format("{}h {:02}m {:02}s", t / 3600, t / 60 % 60, t % 60);
}

// 3 significant digits and an SI prefix: "400 G", "1.23 M", "512".
std::string format_si(double v) {
  const double a = std::abs(v);
  const auto [unit, prefix] = a >= 1e12  ? std::pair{1e12, "T"}
                              : a >= 1e9 ? std::pair{1e9, "G"}
                              : a >= 1e6 ? std::pair{1e6, "M"}
                              : a >= 1e3 ? std::pair{1e3, "k"}
                                         : std::pair{1.0, ""};
  return fmt::format("{:.3g}{}{}", v / unit, *prefix ? " " : "", prefix);
}

std::string format_mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1 << 20)); }

// The last finite value of a column and its record index; false when none.
bool last_finite(const std::vector<double>* column, double* value, size_t* at) {
  if (column == nullptr) return false;
  for (size_t i = column->size(); i-- > 0;) {
    if (std::isfinite((*column)[i])) {
      *value = (*column)[i];
      *at = i;
      return true;
    }
  }
  return false;
}

double mean_from(const std::vector<double>& column, size_t first) {
  double sum = 0;
  size_t n = 0;
  for (size_t i = first; i < column.size(); ++i) {
    if (std::isfinite(column[i])) sum += column[i], ++n;
  }
  return n ? sum / static_cast<double>(n) : kNaN;
}

double max_of(const std::vector<double>& column) {
  double best = kNaN;
  for (const double v : column) {
    if (std::isfinite(v) && !(v <= best)) best = v;
  }
  return best;
}

constexpr const char* kCss = R"(
body { font-family: "DejaVu Sans", sans-serif; color: #222; max-width: 940px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 14px; }
th, td { text-align: left; vertical-align: top; padding: 3px 12px 3px 0; border-bottom: 1px solid #eee; }
th { font-weight: normal; color: #555; }
figure { margin: 20px 0; } figcaption { font-weight: bold; margin-bottom: 4px; }
svg { max-width: 100%; height: auto; } svg text { fill: #333; }
.note { color: #666; font-style: italic; } .remark { color: #444; font-size: 13px; margin: 2px 0; }
pre { background: #f6f6f6; padding: 8px; overflow: auto; font-size: 12px; }
)";

std::string table_row(const std::string& key, const std::string& value) {
  return fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", html_escape(key), html_escape(value));
}

// Steps, tokens, wall time and losses.
std::string progress_rows(const Metrics& m, const nlohmann::ordered_json& info) {
  std::string rows;
  const size_t n = m.records;
  std::string steps = fmt::format("{} records, last step {:.0f}", n, m.step.back());
  if (info.contains("max_steps")) steps += fmt::format(" of {}", dump_json(info["max_steps"]));
  rows += table_row("steps", steps);
  double v = kNaN;
  size_t at = 0;
  if (last_finite(m.column("tokens"), &v, &at)) {
    rows += table_row("tokens", fmt::format("{:.0f} ({})", v, format_si(v)));
  }
  if (last_finite(m.column("elapsed_s"), &v, &at)) {
    rows += table_row("wall time", format_seconds(v) + " (elapsed_s at the last step)");
  } else if (const auto* step_s = m.column("step_s")) {
    double sum = 0;
    for (const double s : *step_s) sum += std::isfinite(s) ? s : 0;
    rows += table_row("wall time", format_seconds(sum) + " (sum of step_s: no elapsed_s recorded)");
  }
  if (last_finite(m.column("loss"), &v, &at)) {
    rows += table_row("final loss", fmt::format("{:.4f} (step {:.0f})", v, m.step[at]));
  }
  if (const auto* val = m.column("val_loss")) {
    size_t best = n;
    for (size_t i = 0; i < n; ++i) {
      if (std::isfinite((*val)[i]) && (best == n || (*val)[i] < (*val)[best])) best = i;
    }
    last_finite(val, &v, &at);
    rows += table_row("validation loss", fmt::format("best {:.4f} (step {:.0f}), last {:.4f} (step {:.0f})",
                                                     (*val)[best], m.step[best], v, m.step[at]));
  }
  return rows;
}

// Means after the first `warm` steps, and the checkpoint stalls.
std::string speed_rows(const Metrics& m, size_t warm) {
  std::string rows;
  const std::string window = warm > 0 ? fmt::format(" (mean over steps after the first {})", warm) : " (mean)";
  if (const auto* c = m.column("tokens_per_s")) {
    rows += table_row("throughput", format_si(mean_from(*c, warm)) + " tokens/s" + window);
  }
  if (const auto* c = m.column("mfu")) {
    rows += table_row("MFU", fmt::format("{:.1f} %", 100 * mean_from(*c, warm)) + window);
  } else {
    rows += table_row("MFU", "not recorded");
  }
  if (const auto* c = m.column("step_s")) {
    std::vector<double> s;
    for (const double t : *c) {
      if (std::isfinite(t)) s.push_back(t);
    }
    std::sort(s.begin(), s.end());
    rows += table_row("median step time", fmt::format("{:.3f} s", s[s.size() / 2]));
  }
  if (const auto* c = m.column("checkpoint_s")) {
    double total = 0;
    int saves = 0;
    for (const double t : *c) {
      if (std::isfinite(t) && t > 0) total += t, ++saves;
    }
    if (saves > 0) {
      rows +=
          table_row("checkpoint stalls", fmt::format("{} save{}, {:.3f} s in all", saves, saves > 1 ? "s" : "", total));
    }
  }
  return rows;
}

std::string memory_rows(const Metrics& m) {
  std::string rows;
  const auto* peak = m.column("peak_rss_bytes");
  const auto* rss = peak ? peak : m.column("rss_bytes");
  if (rss) rows += table_row("peak RSS (rank 0)", format_mib(max_of(*rss)));
  if (auto it = m.per_rank.find("rank_rss_bytes"); it != m.per_rank.end()) {
    double most = 0;
    int rank = 0;
    for (size_t r = 0; r < it->second.size(); ++r) {
      const double x = max_of(it->second[r]);
      if (x > most) most = x, rank = static_cast<int>(r);
    }
    rows += table_row("largest rank RSS", fmt::format("{} (rank {})", format_mib(most), rank));
  }
  if (!rss && !m.per_rank.count("rank_rss_bytes")) rows += table_row("peak RSS", "not recorded");
  return rows;
}

std::string summary(const Metrics& m, const nlohmann::ordered_json& info, size_t warm) {
  std::string rows = progress_rows(m, info) + speed_rows(m, warm) + memory_rows(m);
  double v = kNaN;
  size_t at = 0;
  if (last_finite(m.column("skipped_steps"), &v, &at)) rows += table_row("skipped steps", fmt::format("{:.0f}", v));
  if (!m.straggler_steps.empty()) {
    std::string s;
    for (const auto& [rank, count] : m.straggler_steps) {
      s += fmt::format("{}rank {} on {} steps", s.empty() ? "" : ", ", rank, count);
    }
    rows += table_row("stragglers flagged", s);
  }
  return "<table>\n" + rows + "</table>\n";
}

std::string line_chart(const std::vector<Series>& s, const std::string& title, const std::string& y_label,
                       bool zero_based) {
  ChartOptions o;
  o.title = title;
  o.y_label = y_label;
  o.zero_based = zero_based;
  return chart_svg(s, o);
}

std::string loss_figure(const Metrics& m) {
  std::vector<Series> loss;
  if (const auto* c = m.column("loss")) loss.push_back(make_series("training loss", m, *c));
  if (const auto* c = m.column("val_loss")) loss.push_back(make_series("validation loss", m, *c));
  return loss.empty() ? figure("plot-loss", "Loss", "no loss: metrics.jsonl records no finite loss", true)
                      : figure("plot-loss", "Loss (nats/token)", line_chart(loss, "loss", "nats/token", false), false);
}

std::string throughput_figure(const Metrics& m) {
  if (const auto* c = m.column("tokens_per_s")) {
    return figure("plot-throughput", "Throughput (tokens/s, whole job)",
                  line_chart({make_series("tokens/s", m, *c)}, "throughput", "tokens/s", true), false);
  }
  return figure("plot-throughput", "Throughput", "no throughput: metrics.jsonl has no tokens_per_s", true);
}

std::string mfu_figure(const Metrics& m, const nlohmann::ordered_json& info) {
  if (const auto* c = m.column("mfu")) {
    std::string remark;
    if (info.contains("peak_flops_per_s")) {
      remark = fmt::format("job peak {} FLOP/s{}", format_si(info["peak_flops_per_s"].get<double>()),
                           info.contains("peak_source") && info["peak_source"].is_string()
                               ? " (" + info["peak_source"].get<std::string>() + ")"
                               : "");
    }
    return figure("plot-mfu", "Model FLOPs utilization (%)",
                  line_chart({make_series("MFU", m, *c, 100)}, "MFU", "%", true), false, remark);
  }
  return figure("plot-mfu", "Model FLOPs utilization",
                info.contains("peak_flops_per_s") ? "no MFU: metrics.jsonl records no mfu"
                                                  : "no MFU: no peak known for this run (run.json has no "
                                                    "peak_flops_per_s)",
                true);
}

// Stacked in the order of a step, then the checkpoint stall after it.
std::string time_split_figure(const Metrics& m) {
  std::vector<std::pair<std::string, const std::vector<double>*>> split;
  for (const char* key :
       {"data_wait_s", "forward_s", "backward_s", "comm_s", "optimizer_s", "other_s", "checkpoint_s"}) {
    if (const auto* c = m.column(key)) split.emplace_back(key, c);
  }
  if (split.empty()) {
    return figure("plot-time-split", "Step time split",
                  "no time split: metrics.jsonl has none of data_wait_s, forward_s, backward_s, comm_s, optimizer_s, "
                  "other_s, checkpoint_s",
                  true);
  }
  ChartOptions o;
  o.title = "step time split";
  o.y_label = "seconds";
  o.stacked = true;
  const bool bucketed = m.records > kMaxBars;
  return figure("plot-time-split", "Step time split (seconds per step)", chart_svg(bucket_means(m, split, kMaxBars), o),
                false,
                std::string("checkpoint_s is the step loop's stall after the step, outside step_s.") +
                    (bucketed ? fmt::format(" Means over buckets of about {} steps.", m.records / kMaxBars) : ""));
}

// One series per rank of a per-rank column, named prefix + rank + suffix, within a shared budget
// of points.
std::vector<Series> rank_series(const Metrics& m, const std::vector<std::vector<double>>& columns,
                                const std::string& prefix, const std::string& suffix, double scale) {
  std::vector<Series> out;
  const size_t budget = std::clamp<size_t>(4000 / columns.size(), 100, kMaxPoints);
  for (size_t r = 0; r < columns.size(); ++r) {
    out.push_back(make_series(prefix + std::to_string(r) + suffix, m, columns[r], scale, budget));
  }
  return out;
}

std::string memory_figure(const Metrics& m) {  // in MiB
  std::vector<Series> memory;
  const double mib = 1.0 / (1 << 20);
  if (const auto* c = m.column("rss_bytes")) memory.push_back(make_series("rss_bytes (rank 0)", m, *c, mib));
  if (const auto* c = m.column("peak_rss_bytes")) memory.push_back(make_series("peak_rss_bytes (rank 0)", m, *c, mib));
  if (auto it = m.per_rank.find("rank_rss_bytes"); it != m.per_rank.end()) {
    for (Series& s : rank_series(m, it->second, "rank_rss_bytes[", "]", mib)) memory.push_back(std::move(s));
  }
  return memory.empty()
             ? figure("plot-memory", "Memory", "no memory figures: metrics.jsonl has no rss_bytes", true)
             : figure("plot-memory", "Resident memory (MiB)", line_chart(memory, "memory", "MiB", true), false);
}

std::string ranks_figure(const Metrics& m, const nlohmann::ordered_json& info) {
  if (auto it = m.per_rank.find("rank_busy_s"); it != m.per_rank.end() && it->second.size() > 1) {
    std::string remark;
    for (const auto& [rank, count] : m.straggler_steps) {
      remark += fmt::format("{}rank {} on {} steps", remark.empty() ? "Flagged as stragglers: " : ", ", rank, count);
    }
    return figure("plot-ranks", "Compute time per rank (forward + backward seconds per step)",
                  line_chart(rank_series(m, it->second, "rank ", "", 1), "rank busy time", "seconds", true), false,
                  remark);
  }
  const bool several = info.contains("world_size") && info["world_size"].is_number() && info["world_size"] > 1;
  return figure("plot-ranks", "Compute time per rank",
                several ? "no per-rank busy times: metrics.jsonl has no rank_busy_s"
                        : "one rank: no per-rank busy times (rank_busy_s)",
                true);
}

// Rank 0's GPU as NVML read it at each step (metrics.jsonl "gpu"): utilization and power, with
// the hottest reading and the XIDs seen in the remark. Only for runs on a GPU.
std::string gpu_figures(const Metrics& m, const nlohmann::ordered_json& info) {
  const bool on_gpu =
      info.contains("device") && info["device"].is_string() && info["device"].get<std::string>().rfind("cuda", 0) == 0;
  const auto* util = m.column("gpu.gpu_util_pct");
  if (util == nullptr) {
    return on_gpu ? figure("plot-gpu", "GPU",
                           "no GPU readings: metrics.jsonl has no \"gpu\" records (NVML could not be loaded: see "
                           "the run's log)",
                           true)
                  : "";
  }
  std::vector<Series> busy = {make_series("GPU utilization", m, *util)};
  if (const auto* c = m.column("gpu.mem_copy_util_pct")) busy.push_back(make_series("memory copy utilization", m, *c));
  std::string remark;
  const auto* temperature = m.column("gpu.temperature_c");
  if (temperature != nullptr && std::isfinite(max_of(*temperature))) {
    remark = fmt::format("Hottest reading {:.0f} C.", max_of(*temperature));
  }
  double xids = 0, last_xid = 0;
  size_t at = 0;
  if (last_finite(m.column("gpu.xid_count"), &xids, &at) && xids > 0 &&
      last_finite(m.column("gpu.last_xid"), &last_xid, &at)) {
    remark += fmt::format("{}{:.0f} XID event(s), the last XID {:.0f}.", remark.empty() ? "" : " ", xids, last_xid);
  }
  std::string out = figure("plot-gpu", "GPU utilization (%, NVML, rank 0)",
                           line_chart(busy, "GPU utilization", "%", true), false, remark);
  if (const auto* power = m.column("gpu.power_w")) {
    out += figure("plot-gpu-power", "GPU power draw (W, rank 0)",
                  line_chart({make_series("power", m, *power)}, "GPU power", "W", true), false);
  }
  return out;
}

std::string figures(const Metrics& m, const nlohmann::ordered_json& info) {
  return loss_figure(m) + throughput_figure(m) + mfu_figure(m, info) + time_split_figure(m) + memory_figure(m) +
         ranks_figure(m, info) + gpu_figures(m, info);
}

}  // namespace
}  // namespace detail

void write_report(const std::string& run_dir, const std::string& out_path) {
  namespace fs = std::filesystem;
  using namespace detail;
  const fs::path dir(run_dir);
  const std::string metrics_path = (dir / "metrics.jsonl").string();
  std::error_code ec;
  if (!fs::is_regular_file(metrics_path, ec)) {
    throw DataError(fmt::format("{}: not a run directory: no metrics.jsonl", run_dir));
  }
  const Metrics m = read_metrics(metrics_path);

  nlohmann::ordered_json info = nlohmann::ordered_json::object();
  const std::string info_path = (dir / "run.json").string();
  if (const FileBytes text = try_read_file(info_path)) {
    try {
      info = parse_ordered_json_or_throw(text.bytes);
    } catch (const nlohmann::json::exception& e) {  // parse_error; out_of_range for a number like 1e999
      throw DataError(fmt::format("{}: not JSON: {}", info_path, e.what()));
    }
    if (!info.is_object()) throw DataError(fmt::format("{}: not a JSON object", info_path));
  }

  fs::path canonical = fs::canonical(dir, ec);
  std::string name = (ec ? dir : canonical).lexically_normal().filename().string();
  if (name.empty() || name == ".") name = (ec ? dir : canonical).lexically_normal().parent_path().filename().string();
  if (name.empty()) name = run_dir;

  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
      "<title>Tessera run {0}</title>\n<style>{1}</style>\n</head>\n<body>\n<h1>Tessera run {0}</h1>\n",
      html_escape(name), kCss);

  html += "<h2>Summary</h2>\n";
  // Mean throughput and MFU skip the first steps, which warm caches and start the prefetcher.
  const size_t warm = m.records > 6 ? 3 : 0;
  html += m.records == 0 ? "<p class=\"note\">no steps recorded</p>\n" : summary(m, info, warm);
  if (m.records > 0) html += "<h2>Plots</h2>\n" + figures(m, info);

  html += "<h2>Run</h2>\n";
  if (info.empty()) {
    html += fmt::format("<p class=\"note\">no run.json in {}</p>\n", html_escape(run_dir));
  } else {
    html += "<table>\n";
    for (const auto& [key, value] : info.items()) {
      std::string text = value.is_string() ? value.get<std::string>() : dump_json(value);
      if (value.is_number() && std::abs(value.get<double>()) >= 1e4) {
        text += " (" + format_si(value.get<double>()) + ")";
      }
      html += table_row(key, text);
    }
    html += "</table>\n";
  }
  // run.json names the config file beside it; nothing elsewhere (no path) goes into the page.
  std::string config_name = "config.toml";
  if (info.contains("config") && info["config"].is_string()) {
    const std::string named = info["config"].get<std::string>();
    if (!named.empty() && fs::path(named).filename() == named && named != "..") config_name = named;
  }
  if (fs::is_symlink(dir / config_name, ec)) {  // shows what is in the run, not a file it points at
    html += fmt::format("<p class=\"note\">{} is a symbolic link: not shown</p>\n", html_escape(config_name));
  } else if (const FileBytes text = try_read_file((dir / config_name).string())) {
    html += fmt::format("<details>\n<summary>{}</summary>\n<pre>{}</pre>\n</details>\n", html_escape(config_name),
                        html_escape(text.bytes));
  } else {
    html += fmt::format("<p class=\"note\">no {} in the run directory</p>\n", html_escape(config_name));
  }
  html += fmt::format("<p class=\"remark\">Written by tessera report {} at {} from {}.</p>\n</body>\n</html>\n",
                      TESSERA_VERSION, utc_now(), html_escape(metrics_path));
  write_file_atomic(out_path, html);
}

}  // namespace tessera::metrics
