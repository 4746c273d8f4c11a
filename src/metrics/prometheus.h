// Prometheus: metrics in the text exposition format (0.0.4) and an HTTP endpoint serving them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace httplib {
class Server;
}

namespace tessera::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// A page of metric families; samples of one family stay together, in the order first added.
class Exposition {
 public:
  void gauge(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  // `name` must end in _total.
  void counter(const std::string& name, const std::string& help, double value, const Labels& labels = {});
  // A counter whose name another exporter fixed (DCGM's DCGM_FI_DEV_*), so dashboards written for
  // it apply: exempt from the _total rule, which the text format does not require.
  void counter_named_elsewhere(const std::string& name, const std::string& help, double value,
                               const Labels& labels = {});
  std::string text() const;

 private:
  struct Family {
    std::string name, help, type;
    std::vector<std::string> samples;  // "name{labels} value"
  };
  void add(const std::string& name, const std::string& help, const char* type, double value, const Labels& labels);
  std::vector<Family> families_;
  std::map<std::string, size_t> index_;
};

// GET /metrics on host:port from a thread of its own, serving the last page published.
class PrometheusServer {
 public:
  // Throws IoError naming host:port (and the config keys) when it cannot listen there.
  PrometheusServer(const std::string& host, int port);
  ~PrometheusServer();
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  void publish(std::string page);

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::mutex mutex_;
  std::string page_;
};

}  // namespace tessera::metrics
