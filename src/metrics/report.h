// Layer metrics: MFU peaks, process memory, the Prometheus endpoint and the run report. It must
// not know the trainer: figures arrive as numbers and files.
//
// The run report: one self-contained HTML page (inline CSS, SVG drawn here) over a run
// directory's metrics.jsonl and run.json (docs/metrics.md), for `tessera report`.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::metrics {

// Writes the page for `run_dir` to `out_path` (through a temporary file). Works with any subset
// of metrics.jsonl's optional keys: a plot without data is replaced by a note saying why.
// DataError: no metrics.jsonl in run_dir, a line of it that is not a record (file:line), or an
// unreadable run.json; IoError: out_path cannot be written.
void write_report(const std::string& run_dir, const std::string& out_path);

namespace detail {

// metrics.jsonl as columns, one value per record (NaN where the record lacks the key or holds
// null, as a non-finite loss is written).
struct Metrics {
  size_t records = 0;
  std::vector<double> step;
  std::map<std::string, std::vector<double>> scalars;                // key -> [record]
  std::map<std::string, std::vector<std::vector<double>>> per_rank;  // key -> [rank][record]
  std::map<int, int> straggler_steps;                                // rank -> records flagging it
  // The column of `key`, or nullptr when no record has a finite value for it.
  const std::vector<double>* column(const std::string& key) const;
};

// Parses `path` (JSON Lines; blank lines allowed). DataError naming path:line for a line that is
// not a JSON object with an integer "step", or a known key of the wrong type.
Metrics read_metrics(const std::string& path);

// Axis ticks at 1, 2 or 5 x 10^k spacing covering [lo, hi] with about `target` intervals; the
// axis spans [ticks.front(), ticks.back()]. lo == hi gets a range around the value.
struct Ticks {
  double step = 1;
  std::vector<double> values;
};
Ticks nice_ticks(double lo, double hi, int target = 5);

// A tick label: the value in k (from 10^4), M or G units chosen by `unit_of` (the axis's largest
// magnitude), with as many decimals as the tick step needs.
std::string tick_label(double value, double step, double unit_of);

// At most `max_points` points (>= 2) of a series sorted by x: the minimum and the maximum of each
// of max_points / 2 buckets of consecutive points, in x order, so spikes survive. Shorter series
// come back unchanged.
void downsample_minmax(const std::vector<double>& x, const std::vector<double>& y, size_t max_points,
                       std::vector<double>* out_x, std::vector<double>* out_y);

// Escapes & < > " ' for HTML text and attribute values.
std::string html_escape(std::string_view text);

// One curve of a chart; x and y of equal length, sorted by x, finite.
struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct ChartOptions {
  std::string title, y_label, x_label = "step";
  bool stacked = false;    // series are areas stacked in order (all on the same x)
  bool zero_based = true;  // the y axis includes 0
  int width = 900, height = 300;
};

// An <svg> line chart (or stacked area chart): axes with ticks and labels, grid lines, a legend,
// and one element of class "series" per series.
std::string chart_svg(const std::vector<Series>& series, const ChartOptions& options);

}  // namespace detail
}  // namespace tessera::metrics
