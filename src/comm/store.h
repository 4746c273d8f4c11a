// Key-value store for rendezvous (ARCHITECTURE.md, Launcher): set, get, add, wait with timeouts.
// Every key lives under a job token and a round prefix, so a restarted round never reads the
// keys of an earlier one and a process of another job is refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::comm {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

// A value's text as the store holds it, and back.
inline Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string string_of(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Every store is safe to use from several threads: a waiting get() or wait() polls, and holds its
// connection for one request at a time.
class Store {
 public:
  virtual ~Store() = default;
  // Sets key to value (last writer wins).
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The key's value, waiting for it up to `timeout`; throws StoreError naming the key on timeout.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Atomically adds delta to the integer at key (0 when absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists; throws StoreError naming the missing keys on timeout.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Whether every key exists now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // The keys of this round that start with `prefix` ("" for all), sorted bytewise. With leased
  // keys (EtcdStore::set_with_lease) this answers "which agents are alive".
  virtual std::vector<std::string> list(const std::string& prefix) = 0;
};

// The counter at `key` as add() keeps it, read without changing it (on etcd an add of 0 is a
// write): 0 while the key is absent; a StoreError naming the key when it holds no integer.
int64_t read_counter(Store& store, const std::string& key);

// A store in a directory of a local (or shared) file system: one file per key under
// DIR/<job namespace>/<round>/ (auth::job_namespace: derived from the token, never the token),
// written to a temporary name and renamed, so readers never see a partial value; add() is
// serialized with flock(2) and stores the integer as decimal text. Opening checks DIR/job, which
// the first process writes with the namespace: a process with another token for the same
// directory is refused with a StoreError ("wrong job token"). Files are 0600, directories 0700.
// Token and round must match [A-Za-z0-9_.-]+.
std::unique_ptr<Store> make_file_store(const std::string& dir, const std::string& job_token, const std::string& round);

// An etcd lease: keys set with it are deleted when it is revoked or expires, which it does `ttl`
// after its holder last renewed it, so a dead or hung process's keys disappear by themselves.
// A thread of its own renews it every ttl/3 over its own connection and retries a failed renewal
// every 200 ms, so etcd may be away for ~2/3 ttl without the lease expiring (and a restarted etcd
// refreshes the leases it restores).
class EtcdLease {
 public:
  // Stops renewing and revokes the lease (best effort, for at most min(the store's timeout, 2 s)):
  // its keys go at once.
  virtual ~EtcdLease() = default;
  virtual int64_t id() const = 0;
  // As granted: etcd raises a TTL below its minimum (~2 s with default election settings).
  virtual Millis ttl() const = 0;
  // False once a renewal found the lease gone (expired while etcd or this process was stalled).
  virtual bool alive() const = 0;
  // Stops renewing without revoking, as if the holder hung: its keys go after ttl.
  virtual void stop_renewing() = 0;
};

// A store in etcd (v3 JSON gateway over HTTP, etcd >= 3.4): the key K of a round is the etcd key
// /PREFIX/<job namespace>/<round>/K (auth::job_namespace), and /PREFIX/job holds the namespace,
// created by the first opener in a transaction; an opener with another token is refused with a
// StoreError naming the prefix ("wrong job token"). The token itself never reaches etcd. get() and wait() poll with a backoff from 2 ms to 100 ms. An unreachable etcd is
// retried until the operation's deadline (its own timeout for get and wait, `timeout` for the
// others), then a StoreError names the endpoint and the key ("cannot reach etcd"); a wait whose
// deadline passes while etcd holds a request unanswered reports its timeout and the keys still
// missing, as when the deadline passes between two polls. add() is a compare-and-swap on the
// key's mod_revision, each transaction on a fresh connection (curl would silently re-send a
// request whose kept-alive connection died); it retries only requests that provably never left
// this process, and throws a StoreError ("may or may not have been applied") when the connection
// broke mid-request, since a blind retry could count twice. Thread-safe: one connection, one
// request at a time.
class EtcdStore : public Store {
 public:
  // Grants a lease (ttl rounded up to whole seconds) and starts renewing it.
  virtual std::unique_ptr<EtcdLease> grant_lease(Millis ttl) = 0;
  // Sets key to value, attached to the lease: deleted with it.
  virtual void set_with_lease(const std::string& key, const Bytes& value, const EtcdLease& lease) = 0;
};

// endpoint: "HOST:PORT" (plain HTTP); prefix: one or more '/'-separated names of [A-Za-z0-9_.-].
std::unique_ptr<EtcdStore> make_etcd_store(const std::string& endpoint, const std::string& prefix,
                                           const std::string& job_token, const std::string& round, Millis timeout);

// A store kept in memory by one process of the job and served over TCP (torchrun's
// MASTER_ADDR:MASTER_PORT): that process runs a TcpStoreServer, and every process (the server's
// too) opens clients with make_tcp_store or make_store("tcp://HOST:PORT"). Keys live under the
// client's round. Client and server prove to each other that they hold the job token (HMAC of
// fresh nonces, tcp_store_frame.h) without sending it; a client with another token is refused
// with a StoreError that names neither. Waiting polls. IPv4 only.
class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free one) for the job holding `job_token`; throws
  // StoreError naming the address. One thread serves every connection; a stranger costs at
  // most one of 64 pending connections for 5 s and a few hundred bytes (tcp_store.cc).
  TcpStoreServer(const std::string& host, int port, const std::string& job_token);
  ~TcpStoreServer();  // stops serving, joins its thread and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// Connects to a TcpStoreServer at "HOST:PORT", retrying until `timeout` (the server may start
// later), and polls for keys it waits on. Every request and its reply must complete within
// `timeout`, or the connection is dropped and the request throws StoreError.
std::unique_ptr<Store> make_tcp_store(const std::string& endpoint, const std::string& job_token,
                                      const std::string& round, Millis timeout);

// A rendezvous URL (`tessera launch --rdzv URL`): etcd://HOST:PORT/PREFIX, file://DIR or
// tcp://HOST:PORT.
struct StoreUrl {
  enum class Kind { kFile, kEtcd, kTcp } kind = Kind::kFile;
  std::string dir;       // kFile
  std::string endpoint;  // kEtcd, kTcp: "HOST:PORT" ("[v6]:PORT" for IPv6 with etcd)
  std::string prefix;    // kEtcd: without leading or trailing '/'
};
// Throws ConfigError naming the URL.
StoreUrl parse_store_url(const std::string& url);
// The store a URL names; `timeout` bounds etcd operations without one of their own (the file
// store does not need it). A dynamic_cast to EtcdStore reaches the leases.
std::unique_ptr<Store> make_store(const std::string& url, const std::string& job_token, const std::string& round,
                                  Millis timeout);

}  // namespace tessera::comm
