// An S3 client on libcurl: SigV4 signing by curl itself (CURLOPT_AWS_SIGV4), XML replies parsed
// by tinyxml2. PUT, ranged GET, HEAD, DELETE, ListObjectsV2 with continuation, multipart upload
// (initiate, parts in parallel, complete; abort on failure). Every request has a timeout; a 5xx
// reply (503 SlowDown included), 429 or a connection error is retried with exponential backoff
// and full jitter; a 4xx reply is not (wrong credentials, a missing bucket or key) and throws at
// once, naming the bucket and key and S3's error code, never a secret. Safe to use from several
// threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "storage/object_url.h"

namespace tessera::storage {

struct S3Options {
  // "http://127.0.0.1:4568" for an S3-compatible server (path-style requests); "" for AWS
  // (https://BUCKET.s3.REGION.amazonaws.com/KEY).
  std::string endpoint;
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;  // never logged
  long connect_timeout_ms = 10'000;
  long request_timeout_ms = 300'000;  // one request, a whole part included
  int attempts = 8;                   // tries of one request before it fails
  double backoff_ms = 250;            // the first pause; doubles per try, full jitter, at most 20 s
  int parallelism = 8;                // concurrent requests of one upload
  uint64_t part_bytes = 64ull << 20;  // objects larger than this are uploaded in parts this size
};

// The standard AWS settings: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else
// the profile AWS_PROFILE ("default") of AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials);
// AWS_REGION or AWS_DEFAULT_REGION, else the profile's region in AWS_CONFIG_FILE (~/.aws/config),
// else us-east-1; AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL. Throws ConfigError when no credentials
// are found, naming where it looked. TESSERA_S3_PART_MIB sets part_bytes, TESSERA_S3_ATTEMPTS
// attempts.
S3Options s3_options_from_environment();

// An S3 reply other than success, or a request that failed every try. Exit 10 (kExitIo).
class S3Error : public IoError {
 public:
  S3Error(const std::string& what, long status, std::string code)
      : IoError(what), status_(status), code_(std::move(code)) {}
  long status() const { return status_; }            // 0: no reply (connection error, timeout)
  const std::string& code() const { return code_; }  // S3's <Code>, e.g. "NoSuchBucket"

 private:
  long status_;
  std::string code_;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

// Bytes [offset, offset + bytes) of a local file: what one upload sends, in order.
struct FileSlice {
  std::string path;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Requests sent, each try counted once (retries counts the tries after a first).
struct RequestCounts {
  int64_t put = 0, get = 0, head = 0, remove = 0, list = 0;
  int64_t create_multipart = 0, upload_part = 0, complete_multipart = 0, abort_multipart = 0;
  int64_t retries = 0;
  int64_t puts() const { return put + upload_part; }  // objects and parts written
};

class S3Client {
 public:
  explicit S3Client(S3Options options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;
  const S3Options& options() const { return options_; }

  void put(const ObjectUrl& url, const std::string& body);
  // The concatenation of `slices` as one object: a single PUT up to options().part_bytes, else a
  // multipart upload whose parts go `parallelism` at a time (aborted when one fails for good).
  void upload(const ObjectUrl& url, const std::vector<FileSlice>& slices);
  // The whole object; throws S3Error (status 404) when it does not exist, DataError when it is
  // larger than max_bytes.
  std::string get(const ObjectUrl& url, uint64_t max_bytes = 64ull << 20);
  // Bytes [offset, offset + bytes) of the object into out; throws S3Error when fewer arrive.
  void get_range(const ObjectUrl& url, uint64_t offset, uint64_t bytes, void* out);
  // The object's size, or nullopt when it does not exist.
  std::optional<uint64_t> head(const ObjectUrl& url);
  void remove(const ObjectUrl& url);  // succeeds when the object is already gone
  // Every object whose key starts with prefix.key (all pages of page_size keys), in key order.
  std::vector<ObjectInfo> list(const ObjectUrl& prefix, int page_size = 1000);

  RequestCounts counts() const;

 private:
  struct Request;
  struct Response;
  Response send(Request& request);  // with retries; throws S3Error
  // A multipart upload: created, its parts put (options_.parallelism at a time), completed; aborted
  // on any failure, whose error it rethrows.
  void upload_parts(const ObjectUrl& url, const std::vector<FileSlice>& slices, uint64_t total);
  std::string create_multipart(const ObjectUrl& url);  // the upload id
  std::vector<std::string> put_parts(const ObjectUrl& url, const std::string& upload_id,
                                     const std::vector<FileSlice>& slices, uint64_t total);  // their ETags
  void complete_multipart(const ObjectUrl& url, const std::string& upload_id, const std::vector<std::string>& etags);
  void abort_multipart(const ObjectUrl& url, const std::string& upload_id);  // logs a failure, never throws

  // Easy handles kept between requests, so their connections are reused (keep-alive: no new
  // TCP or TLS handshake per request, no socket per part left in TIME_WAIT).
  void* take_handle();
  void give_back(void* handle);

  S3Options options_;
  std::mutex handles_mu_;
  std::vector<void*> handles_;
  struct Counters {
    std::atomic<int64_t> put{0}, get{0}, head{0}, remove{0}, list{0};
    std::atomic<int64_t> create_multipart{0}, upload_part{0}, complete_multipart{0}, abort_multipart{0};
    std::atomic<int64_t> retries{0};
  } counters_;
};

// The process's client, made from s3_options_from_environment() on first use.
S3Client& default_s3_client();

}  // namespace tessera::storage
