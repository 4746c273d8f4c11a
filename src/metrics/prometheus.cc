#include "metrics/prometheus.h"

#include <fmt/format.h>
#include <httplib.h>

#include <cmath>

#include "core/check.h"
#include "core/error.h"
#include "core/log.h"

namespace tessera::metrics {
namespace {

// Label values escape backslash, double quote and newline; HELP text backslash and newline.
std::string escape(const std::string& text, bool quote) {
  std::string out;
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest text that reads back as the same double
}

}  // namespace

void Exposition::gauge(const std::string& name, const std::string& help, double value, const Labels& labels) {
  add(name, help, "gauge", value, labels);
}

void Exposition::counter(const std::string& name, const std::string& help, double value, const Labels& labels) {
  CHECK_MSG(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0, "a counter's name ends in _total");
  add(name, help, "counter", value, labels);
}

void Exposition::counter_named_elsewhere(const std::string& name, const std::string& help, double value,
                                         const Labels& labels) {
  add(name, help, "counter", value, labels);
}

void Exposition::add(const std::string& name, const std::string& help, const char* type, double value,
                     const Labels& labels) {
  auto [it, added] = index_.emplace(name, families_.size());
  if (added) families_.push_back({name, help, type, {}});
  Family& family = families_[it->second];
  CHECK_MSG(family.type == type, "a metric family has one type");
  std::string sample = name;
  for (size_t i = 0; i < labels.size(); ++i) {
    sample += fmt::format("{}{}=\"{}\"", i == 0 ? "{" : ",", labels[i].first, escape(labels[i].second, true));
  }
  if (!labels.empty()) sample += "}";
  family.samples.push_back(sample + " " + format_value(value));
}

std::string Exposition::text() const {
  std::string out;
  for (const Family& f : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, escape(f.help, false), f.name, f.type);
    for (const std::string& s : f.samples) out += s + "\n";
  }
  return out;
}

PrometheusServer::PrometheusServer(const std::string& host, int port) : server_(std::make_unique<httplib::Server>()) {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard lock(mutex_);
    res.set_content(page_, "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("Tessera training metrics: /metrics\n", "text/plain; charset=utf-8");
  });
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second run share
  // (and silently split) this port instead of failing to bind it.
  server_->set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (!server_->bind_to_port(host.c_str(), port)) {
    throw IoError(
        fmt::format("cannot serve Prometheus metrics on {}:{} (metrics.prometheus_host, "
                    "metrics.prometheus_port): the address is in use or not this machine's",
                    host, port));
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  log::info("Prometheus metrics on http://{}:{}/metrics", host, port);
}

PrometheusServer::~PrometheusServer() {
  server_->stop();
  thread_.join();
}

void PrometheusServer::publish(std::string page) {
  std::lock_guard lock(mutex_);
  page_ = std::move(page);
}

}  // namespace tessera::metrics
