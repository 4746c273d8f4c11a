// Store and leases in etcd through its v3 JSON gateway (POST /v3/kv/*, /v3/lease/*) over libcurl.
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "comm/etcd_reply.h"
#include "comm/job_auth.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/store_impl.h"
#include "core/json.h"

namespace tessera::comm {
namespace {

using namespace etcd;  // NOLINT: the reply readers
using Clock = std::chrono::steady_clock;

// Backoff of polls (get, wait) and of retries against an unreachable etcd: a key that appears
// soon is seen within milliseconds, a long wait costs ~10 requests a second per process.
constexpr Millis kFirstBackoff{2};
constexpr Millis kMaxBackoff{100};
// One HTTP request never blocks the store's connection longer than this, whatever the
// operation's timeout: a stalled etcd is retried on a fresh connection.
constexpr Millis kMaxRequest{10000};
constexpr Millis kMinRequest{20};
// etcd's default --max-txn-ops is 128.
constexpr size_t kTxnChunk = 100;

using etcd::base64_encode;  // beside this overload, for values
std::string base64_encode(const Bytes& in) { return base64_encode(std::string(in.begin(), in.end())); }

// Transactions (/v3/kv/txn): one compare, one operation on each branch.
json create_compare(const std::string& k64) {  // the key does not exist
  return json::object({{"key", k64}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}});
}
json put_op(const std::string& k64, const std::string& v64) {
  return json::object({{"request_put", json::object({{"key", k64}, {"value", v64}})}});
}
json range_op(const std::string& k64) { return json::object({{"request_range", json::object({{"key", k64}})}}); }
json txn(const json& compare, const json& success, const json& failure) {
  return json::object(
      {{"compare", json::array({compare})}, {"success", json::array({success})}, {"failure", json::array({failure})}});
}

struct Deadline {
  Clock::time_point at;
  Millis budget;  // for messages: the timeout the caller gave
  static Deadline after(Millis t) { return {Clock::now() + t, t}; }
  Millis left() const { return std::max(Millis(0), std::chrono::duration_cast<Millis>(at - Clock::now())); }
  bool passed() const { return Clock::now() >= at; }
};

void sleep_backoff(Millis* backoff, const Deadline& d) {
  std::this_thread::sleep_for(std::min(*backoff, d.left()));
  *backoff = std::min(*backoff * 2, kMaxBackoff);
}

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct HttpResult {
  CURLcode code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string body;
  bool sent = false;  // some bytes of the request left this process
};

// One reused HTTP connection to the gateway (keep-alive), one request at a time.
class Http {
 public:
  explicit Http(const std::string& endpoint) : base_("http://" + endpoint) {
    init_curl_once();
    handle_ = curl_easy_init();
    if (handle_ == nullptr) throw StoreError("etcd store " + endpoint + ": curl_easy_init failed");
    headers_ = curl_slist_append(nullptr, "Content-Type: application/json");
  }
  ~Http() {
    curl_easy_cleanup(handle_);
    curl_slist_free_all(headers_);
  }
  Http(const Http&) = delete;
  Http& operator=(const Http&) = delete;

  // fresh: on a new connection. curl silently re-sends a request whose reused connection died
  // before any reply, which must not happen to a request that is not idempotent.
  HttpResult post(const std::string& path, const std::string& body, Millis timeout, bool fresh = false) {
    std::lock_guard<std::mutex> lock(mu_);
    HttpResult r;
    error_[0] = '\0';
    std::string url = base_ + path;
    long ms = static_cast<long>(std::clamp(timeout, kMinRequest, kMaxRequest).count());
    curl_easy_reset(handle_);  // keeps the connection cache
    curl_easy_setopt(handle_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(handle_, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(handle_, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(handle_, CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(handle_, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(handle_, CURLOPT_ERRORBUFFER, error_);
    curl_easy_setopt(handle_, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT_MS, ms);
    curl_easy_setopt(handle_, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM from resolver timeouts in threads
    curl_easy_setopt(handle_, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(handle_, CURLOPT_FRESH_CONNECT, fresh ? 1L : 0L);
    r.code = curl_easy_perform(handle_);
    long request_size = 0;
    curl_easy_getinfo(handle_, CURLINFO_REQUEST_SIZE, &request_size);
    r.sent = request_size > 0;
    if (r.code != CURLE_OK) {
      r.curl_error = error_[0] ? error_ : curl_easy_strerror(r.code);
    } else {
      curl_easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &r.status);
    }
    return r;
  }

 private:
  std::mutex mu_;
  std::string base_;
  CURL* handle_ = nullptr;
  curl_slist* headers_ = nullptr;
  char error_[CURL_ERROR_SIZE] = {0};  // curl keeps the pointer between requests
};

// A request the deadline cut off: sent, and still unanswered when the deadline passed (an etcd
// that is there but stalled or slow, not an unreachable one). Its message is call()'s "cannot
// reach etcd"; wait() reports its own timeout instead.
class CutOff : public StoreError {
 public:
  using StoreError::StoreError;
};

enum class Retry {
  kAlways,  // idempotent: retry any failure until the deadline
  kUnsent,  // not idempotent: retry only requests that never left this process
};

// POSTs a request to the gateway and returns its JSON reply, retrying as `retry` allows until
// the deadline. Messages name the store (`who`, which holds the endpoint) and the key (`what`).
json call(Http& http, const std::string& who, const std::string& path, const json& request, const Deadline& deadline,
          const std::string& what, Retry retry) {
  std::string body = dump_json(request);
  Millis backoff = kFirstBackoff;
  for (;;) {
    HttpResult r = http.post(path, body, deadline.left(), /*fresh=*/retry == Retry::kUnsent);
    std::string failure;
    if (r.code != CURLE_OK) {
      failure = r.curl_error;
    } else {
      Reply reply;
      if (!read_reply(r.status, r.body, &reply))
        throw StoreError("etcd store " + who + ": " + path + " for " + what + ": reply is not JSON (HTTP " +
                         std::to_string(r.status) + ")");
      if (reply.ok) return std::move(reply.body);
      failure = reply.failure;
      if (!reply.transient || retry == Retry::kUnsent)
        throw StoreError("etcd store " + who + ": " + path + " for " + what + " failed: " + failure);
    }
    if (retry == Retry::kUnsent && r.sent)
      throw StoreError("etcd store " + who + ": connection lost during " + path + " for " + what +
                       "; it may or may not have been applied: " + failure);
    if (deadline.passed()) {
      const std::string message = "etcd store " + who + ": cannot reach etcd for " + what + " within " +
                                  std::to_string(deadline.budget.count()) + " ms: " + failure;
      if (r.code == CURLE_OPERATION_TIMEDOUT && r.sent) throw CutOff(message);
      throw StoreError(message);
    }
    sleep_backoff(&backoff, deadline);
  }
}

class LeaseImpl final : public EtcdLease {
 public:
  LeaseImpl(const std::string& endpoint, int64_t id, Millis ttl, Millis timeout)
      : endpoint_(endpoint), http_(endpoint), id_(id), ttl_(ttl), timeout_(timeout) {
    thread_ = std::thread([this] { renew_loop(); });
  }
  ~LeaseImpl() override {
    stop_renewing();
    // Best effort and short: if it fails the keys still go after ttl.
    json req = {{"ID", std::to_string(id_)}};
    try {
      call(http_, endpoint_, "/v3/lease/revoke", req, Deadline::after(std::min(timeout_, Millis(2000))),
           "lease " + std::to_string(id_), Retry::kAlways);
    } catch (const StoreError&) {
    }
  }
  int64_t id() const override { return id_; }
  Millis ttl() const override { return ttl_; }
  bool alive() const override { return alive_.load(); }
  void stop_renewing() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  // Renews every ttl/3; after a failed renewal (etcd unreachable) retries every 200 ms, since
  // by then a third of the ttl is already spent.
  void renew_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    Millis period = ttl_ / 3;
    for (;;) {
      if (cv_.wait_for(lock, period, [this] { return stop_; })) return;
      lock.unlock();
      int result = renew();
      lock.lock();
      if (result < 0) {
        alive_ = false;
        return;
      }
      period = result > 0 ? ttl_ / 3 : std::min(ttl_ / 3, Millis(200));
    }
  }

  // 1: renewed; 0: etcd unreachable or failing; -1: the lease is gone.
  int renew() {
    json req = {{"ID", std::to_string(id_)}};
    HttpResult r = http_.post("/v3/lease/keepalive", dump_json(req), ttl_ / 3);
    if (r.code != CURLE_OK || r.status != 200) return 0;
    return keepalive_result(r.body);
  }

  std::string endpoint_;
  Http http_;  // its own connection: renewals never queue behind the store's requests
  int64_t id_;
  Millis ttl_;
  Millis timeout_;
  std::atomic<bool> alive_{true};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class EtcdStoreImpl final : public EtcdStore {
 public:
  EtcdStoreImpl(std::string endpoint, std::string prefix, std::string job, std::string round, Millis timeout)
      : endpoint_(std::move(endpoint)),
        http_(endpoint_),
        base_("/" + prefix + "/" + job + "/" + round + "/"),
        name_("etcd://" + endpoint_ + "/" + prefix + "/" + job + "/" + round),
        timeout_(timeout) {}

  // The first opener writes /PREFIX/job (the job's namespace) in a transaction (create if
  // absent), so exactly one job wins; a retried transaction that had been applied reads back
  // its own namespace.
  void claim(const std::string& prefix, const std::string& job) {
    std::string key = "/" + prefix + "/job";
    std::string k64 = base64_encode(key);
    json req = txn(create_compare(k64), put_op(k64, base64_encode(job)), range_op(k64));
    json reply = call(http_, name_, "/v3/kv/txn", req, Deadline::after(timeout_), "key '" + key + "'", Retry::kAlways);
    if (succeeded(reply)) return;
    if (range_value(txn_range(reply, 0), name_).value_or("") != job)
      throw StoreError("etcd store: etcd://" + endpoint_ + "/" + prefix + " belongs to another job: wrong job token");
  }

  void set(const std::string& key, const Bytes& value) override { put(key, value, 0); }

  Bytes get(const std::string& key, Millis timeout) override {
    Deadline d = Deadline::after(timeout);
    Millis backoff = kFirstBackoff;
    for (;;) {
      json reply = call(http_, name_, "/v3/kv/range", {{"key", base64_encode(base_ + key)}}, d, "key '" + key + "'",
                        Retry::kAlways);
      if (const std::optional<std::string> v = range_value(reply, name_)) return Bytes(v->begin(), v->end());
      if (d.passed()) throw timed_out(d, "key '" + key + "'");
      sleep_backoff(&backoff, d);
    }
  }

  // A compare-and-swap loop: create the key if absent, else replace the value read at
  // mod_revision r only if the key is still at r. A failed compare returns the current value in
  // the same round trip, so contention costs one request per lost race.
  int64_t add(const std::string& key, int64_t delta) override {
    Deadline d = Deadline::after(timeout_);
    std::string k64 = base64_encode(base_ + key);
    std::string what = "key '" + key + "'";
    bool exists = false;
    int64_t value = 0, mod_revision = 0;
    for (;;) {
      int64_t next = value + delta;
      std::string text = std::to_string(next);
      json compare = exists ? json::object({{"key", k64},
                                            {"target", "MOD"},
                                            {"result", "EQUAL"},
                                            {"mod_revision", std::to_string(mod_revision)}})
                            : create_compare(k64);
      json req = txn(compare, put_op(k64, base64_encode(text)), range_op(k64));
      // add(key, 0) reads a counter (creating it at 0): applying it twice changes nothing, so it
      // is retried through an outage like a read; any other delta is sent at most once.
      json reply = call(http_, name_, "/v3/kv/txn", req, d, what, delta == 0 ? Retry::kAlways : Retry::kUnsent);
      const TxnOutcome outcome = txn_outcome(reply, name_);
      if (outcome.succeeded) return next;
      exists = outcome.current.has_value();
      value = 0;
      if (exists) {
        mod_revision = outcome.current->mod_revision;
        if (!detail::parse_counter(outcome.current->value, &value))
          throw StoreError("etcd store " + name_ + ": add() on key '" + key + "' whose value is not an integer");
      }
      if (d.passed())
        throw StoreError("etcd store " + name_ + ": add() on key '" + key + "' lost every race for " +
                         std::to_string(d.budget.count()) + " ms");
    }
  }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    Deadline d = Deadline::after(timeout);
    Millis backoff = kFirstBackoff;
    std::vector<std::string> missing = keys;
    for (;;) {
      bool cut_off = false;
      missing = absent(missing, d, &cut_off);
      if (missing.empty()) return;
      if (cut_off || d.passed()) throw timed_out(d, "key(s) " + detail::join_keys(missing));
      sleep_backoff(&backoff, d);
    }
  }

  bool check(const std::vector<std::string>& keys) override { return absent(keys, Deadline::after(timeout_)).empty(); }

  std::vector<std::string> list(const std::string& prefix) override {
    std::string from = base_ + prefix;
    json req = {{"key", base64_encode(from)}, {"range_end", base64_encode(prefix_end(from))}, {"keys_only", true}};
    json reply = call(http_, name_, "/v3/kv/range", req, Deadline::after(timeout_), "keys with prefix '" + prefix + "'",
                      Retry::kAlways);
    return range_keys(reply, base_, name_);
  }

  std::unique_ptr<EtcdLease> grant_lease(Millis ttl) override {
    int64_t seconds = std::max<int64_t>(1, (ttl.count() + 999) / 1000);
    json reply = call(http_, name_, "/v3/lease/grant", {{"TTL", seconds}}, Deadline::after(timeout_),
                      "a lease of " + std::to_string(seconds) + " s", Retry::kAlways);
    const Grant grant = lease_grant(reply, name_);
    return std::make_unique<LeaseImpl>(endpoint_, grant.id, Millis(grant.ttl_s * 1000), timeout_);
  }

  void set_with_lease(const std::string& key, const Bytes& value, const EtcdLease& lease) override {
    put(key, value, lease.id());
  }

 private:
  void put(const std::string& key, const Bytes& value, int64_t lease) {
    json req = {{"key", base64_encode(base_ + key)}, {"value", base64_encode(value)}};
    if (lease != 0) req["lease"] = std::to_string(lease);
    call(http_, name_, "/v3/kv/put", req, Deadline::after(timeout_), "key '" + key + "'", Retry::kAlways);
  }

  // The keys among `keys` that do not exist, asked in read-only transactions of kTxnChunk ranges.
  // With `cut_off`, a request the deadline cuts off sets it and ends the scan: the keys not known
  // to exist are returned (those of the unanswered chunks too) instead of a CutOff thrown.
  std::vector<std::string> absent(const std::vector<std::string>& keys, const Deadline& d, bool* cut_off = nullptr) {
    std::vector<std::string> out;
    for (size_t begin = 0; begin < keys.size(); begin += kTxnChunk) {
      size_t end = std::min(keys.size(), begin + kTxnChunk);
      json ops = json::array();
      for (size_t i = begin; i < end; ++i)
        ops.push_back({{"request_range", {{"key", base64_encode(base_ + keys[i])}, {"count_only", true}}}});
      std::vector<std::string> chunk(keys.begin() + begin, keys.begin() + end);
      json reply;
      try {
        reply = call(http_, name_, "/v3/kv/txn", json::object({{"success", ops}}), d,
                     "key(s) " + detail::join_keys(chunk), Retry::kAlways);
      } catch (const CutOff&) {
        if (cut_off == nullptr) throw;
        *cut_off = true;
        out.insert(out.end(), keys.begin() + begin, keys.end());
        return out;
      }
      const std::vector<bool> exists = txn_exists(reply, end - begin, name_);
      for (size_t i = begin; i < end; ++i)
        if (!exists[i - begin]) out.push_back(keys[i]);
    }
    return out;
  }

  StoreError timed_out(const Deadline& d, const std::string& what) const {
    return StoreError("etcd store " + name_ + ": timed out after " + std::to_string(d.budget.count()) +
                      " ms waiting for " + what);
  }

  std::string endpoint_;
  Http http_;
  std::string base_;  // "/PREFIX/JOB/ROUND/", JOB = auth::job_namespace(token)
  std::string name_;  // for messages: etcd://ENDPOINT/PREFIX/JOB/ROUND
  Millis timeout_;
};

}  // namespace

std::unique_ptr<EtcdStore> make_etcd_store(const std::string& endpoint, const std::string& prefix,
                                           const std::string& job_token, const std::string& round, Millis timeout) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size() ||
      endpoint.find_first_of("/?# ") != std::string::npos)
    throw StoreError("etcd store: invalid endpoint '" + endpoint + "' (use HOST:PORT)");
  std::string clean = detail::clean_store_prefix(prefix);
  if (clean.empty())
    throw StoreError("etcd store: invalid prefix '" + prefix + "' (use NAME[/NAME...] of [A-Za-z0-9_.-])");
  if (!detail::valid_store_name(job_token)) throw StoreError("etcd store: invalid job token (use [A-Za-z0-9_.-])");
  if (!detail::valid_store_name(round))
    throw StoreError("etcd store: invalid round '" + round + "' (use [A-Za-z0-9_.-])");
  const std::string job = auth::job_namespace(job_token);
  auto store = std::make_unique<EtcdStoreImpl>(endpoint, clean, job, round, timeout);
  store->claim(clean, job);
  return store;
}

}  // namespace tessera::comm
