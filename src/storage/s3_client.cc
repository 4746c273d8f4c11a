#include "storage/s3_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <tinyxml2.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "core/io_progress.h"
#include "core/log.h"
#include "core/text.h"

namespace tessera::storage {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// INI sections of an AWS credentials or config file: section name -> key -> value.
std::map<std::string, std::map<std::string, std::string>> read_ini(const std::string& path) {
  std::map<std::string, std::map<std::string, std::string>> out;
  std::ifstream in(path);
  std::string line, section;
  while (std::getline(in, line)) {
    line = std::string(trim(line));
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      if (section.rfind("profile ", 0) == 0) section = trim(section.substr(8));  // ~/.aws/config's form
      continue;
    }
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[section][std::string(trim(line.substr(0, eq)))] = trim(line.substr(eq + 1));
  }
  return out;
}

// RFC 3986 unreserved characters stay; everything else is %XX (SigV4's canonical encoding).
std::string uri_encode(const std::string& s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string base64_md5(const char* data, size_t n) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data, n, digest, &len, EVP_md5(), nullptr);
  unsigned char b64[64];
  const int m = EVP_EncodeBlock(b64, digest, static_cast<int>(len));
  return std::string(reinterpret_cast<char*>(b64), static_cast<size_t>(m));
}

std::string xml_child(const tinyxml2::XMLElement* e, const char* name) {
  const tinyxml2::XMLElement* c = e == nullptr ? nullptr : e->FirstChildElement(name);
  return c == nullptr || c->GetText() == nullptr ? "" : c->GetText();
}

// S3's <Error><Code/><Message/></Error>; empty strings when the body is not one.
std::pair<std::string, std::string> xml_error(const std::string& body) {
  tinyxml2::XMLDocument doc;
  if (body.empty() || doc.Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS) return {};
  const tinyxml2::XMLElement* root = doc.RootElement();
  if (root == nullptr || std::strcmp(root->Name(), "Error") != 0) return {};
  return {xml_child(root, "Code"), xml_child(root, "Message")};
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Reads bytes [begin, begin + n) of the concatenation of slices into out.
void read_slices(const std::vector<FileSlice>& slices, uint64_t begin, uint64_t n, char* out) {
  uint64_t at = 0;  // the concatenation's offset of the current slice
  for (const FileSlice& s : slices) {
    const uint64_t lo = std::max(begin, at), hi = std::min(begin + n, at + s.bytes);
    if (lo < hi) {
      const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw IoError(fmt::format("cannot open {} to upload it: {}", s.path, std::strerror(errno)));
      uint64_t done = 0;
      while (done < hi - lo) {
        const ssize_t r =
            ::pread(fd, out + (lo - begin) + done, hi - lo - done, static_cast<off_t>(s.offset + (lo - at) + done));
        if (r <= 0) {
          const int err = errno;
          ::close(fd);
          throw IoError(fmt::format("cannot read {} to upload it: {}", s.path,
                                    r == 0 ? "unexpected end of file" : std::strerror(err)));
        }
        done += static_cast<uint64_t>(r);
      }
      ::close(fd);
    }
    at += s.bytes;
  }
}

}  // namespace

S3Options s3_options_from_environment() {
  S3Options o;
  const std::string home = env("HOME");
  const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
  o.access_key = env("AWS_ACCESS_KEY_ID");
  o.secret_key = env("AWS_SECRET_ACCESS_KEY");
  o.session_token = env("AWS_SESSION_TOKEN");
  const std::string credentials =
      env("AWS_SHARED_CREDENTIALS_FILE").empty() ? home + "/.aws/credentials" : env("AWS_SHARED_CREDENTIALS_FILE");
  if (o.access_key.empty() || o.secret_key.empty()) {
    auto ini = read_ini(credentials);
    auto& p = ini[profile];
    o.access_key = p["aws_access_key_id"];
    o.secret_key = p["aws_secret_access_key"];
    o.session_token = p["aws_session_token"];
  }
  if (o.access_key.empty() || o.secret_key.empty()) {
    throw ConfigError(fmt::format(
        "no object-store credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile [{}] in {}", profile,
        credentials));
  }
  o.region = !env("AWS_REGION").empty() ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
  if (o.region.empty()) {
    const std::string config = env("AWS_CONFIG_FILE").empty() ? home + "/.aws/config" : env("AWS_CONFIG_FILE");
    o.region = read_ini(config)[profile]["region"];
  }
  if (o.region.empty()) o.region = "us-east-1";
  // Tessera's own knobs: the multipart part size (S3 requires 5 MiB or more but for the last
  // part) and the tries of one request.
  if (const std::string part = env("TESSERA_S3_PART_MIB"); !part.empty()) {
    double mib = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), mib);
    if (ec != std::errc() || end != part.data() + part.size() || !(mib > 0 && mib <= 5 * 1024))
      throw ConfigError(fmt::format("TESSERA_S3_PART_MIB = \"{}\": expected a number of MiB in (0, 5120]", part));
    o.part_bytes = static_cast<uint64_t>(mib * (1 << 20));
  }
  if (const std::string tries = env("TESSERA_S3_ATTEMPTS"); !tries.empty()) {
    const auto [end, ec] = std::from_chars(tries.data(), tries.data() + tries.size(), o.attempts);
    if (ec != std::errc() || end != tries.data() + tries.size() || o.attempts < 1 || o.attempts > 100)
      throw ConfigError(fmt::format("TESSERA_S3_ATTEMPTS = \"{}\": expected a whole number in [1, 100]", tries));
  }
  o.endpoint = !env("AWS_ENDPOINT_URL_S3").empty() ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  return o;
}

struct S3Client::Request {
  const char* method = "GET";
  const char* op = "GET";  // what the messages and counters call it
  ObjectUrl url;
  std::vector<std::pair<std::string, std::string>> query;  // sorted by name (SigV4's canonical order)
  std::vector<std::string> headers;
  const char* body = nullptr;
  uint64_t body_bytes = 0;
  char* out = nullptr;  // a GET's bytes go here (out_bytes at most), else into Response::body
  uint64_t out_bytes = 0;
  uint64_t max_body = 16ull << 20;
  std::atomic<int64_t>* counter = nullptr;
};

struct S3Client::Response {
  long status = 0;
  std::string body;
  std::string etag;
  uint64_t received = 0;
  int64_t content_length = -1;
};

S3Client::S3Client(S3Options options) : options_(std::move(options)) { global_init(); }

S3Client::~S3Client() {
  for (void* h : handles_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* S3Client::take_handle() {
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    if (!handles_.empty()) {
      void* h = handles_.back();
      handles_.pop_back();
      curl_easy_reset(static_cast<CURL*>(h));  // options cleared, connections kept
      return h;
    }
  }
  return curl_easy_init();
}

void S3Client::give_back(void* handle) {
  std::lock_guard<std::mutex> lock(handles_mu_);
  handles_.push_back(handle);
}

RequestCounts S3Client::counts() const {
  RequestCounts c;
  c.put = counters_.put;
  c.get = counters_.get;
  c.head = counters_.head;
  c.remove = counters_.remove;
  c.list = counters_.list;
  c.create_multipart = counters_.create_multipart;
  c.upload_part = counters_.upload_part;
  c.complete_multipart = counters_.complete_multipart;
  c.abort_multipart = counters_.abort_multipart;
  c.retries = counters_.retries;
  return c;
}

namespace {

constexpr uint64_t kMaxErrorBody = 64 << 10;

struct Transfer {
  CURL* curl;
  const char* body;
  uint64_t body_bytes, sent = 0;
  char* out;
  uint64_t out_bytes, max_body;
  std::string* text;
  uint64_t received = 0;
  bool overflow = false;
  std::string* etag;
};

size_t on_write(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const uint64_t bytes = size * n;
  io_progress::add(bytes);
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 300) {  // an error reply: its XML goes to the text, never into the caller's buffer
    if (t->text->size() + bytes <= kMaxErrorBody) t->text->append(data, bytes);
    return bytes;
  }
  const uint64_t cap = t->out != nullptr ? t->out_bytes : t->max_body;
  if (t->received + bytes > cap) {
    t->overflow = true;
    return 0;  // aborts the transfer
  }
  if (t->out != nullptr) {
    std::memcpy(t->out + t->received, data, bytes);
  } else {
    t->text->append(data, bytes);
  }
  t->received += bytes;
  return bytes;
}

size_t on_read(char* buffer, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const uint64_t take = std::min<uint64_t>(size * n, t->body_bytes - t->sent);
  std::memcpy(buffer, t->body + t->sent, take);
  t->sent += take;
  io_progress::add(take);
  return take;
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  io_progress::add(size * n);  // a reply's headers: every reply counts, a HEAD's and a PUT's too
  const std::string line(data, size * n);
  if (line.size() > 5 && strncasecmp(line.c_str(), "etag:", 5) == 0) {
    std::string v = line.substr(5);
    v.erase(0, v.find_first_not_of(" \t"));
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
    *t->etag = v;
  }
  return size * n;
}

double jittered_pause_s(double backoff_ms, int attempt) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const double cap = std::min(20'000.0, backoff_ms * static_cast<double>(1ull << std::min(attempt - 1, 20)));
  return std::uniform_real_distribution<double>(0.0, cap)(rng) / 1e3;
}

// The request's address, path-style on an endpoint, virtual-hosted on AWS; its query sorted by name
// (SigV4's canonical order).
std::string request_url(const S3Options& o, const ObjectUrl& object,
                        std::vector<std::pair<std::string, std::string>>& query) {
  std::string url =
      o.endpoint.empty()
          ? fmt::format("https://{}.s3.{}.amazonaws.com/{}", object.bucket, o.region, uri_encode(object.key, true))
          : fmt::format("{}/{}/{}", o.endpoint, object.bucket, uri_encode(object.key, true));
  std::sort(query.begin(), query.end());
  for (size_t i = 0; i < query.size(); ++i) {
    url += (i == 0 ? "?" : "&") + uri_encode(query[i].first, false) + "=" + uri_encode(query[i].second, false);
  }
  return url;
}

using HeaderList = std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)>;

// The headers of every request (unsigned payload, no 100-continue, the session token), then its own.
HeaderList request_headers(const S3Options& o, const std::vector<std::string>& own) {
  curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  headers = curl_slist_append(headers, "Expect:");
  if (!o.session_token.empty())
    headers = curl_slist_append(headers, ("x-amz-security-token: " + o.session_token).c_str());
  for (const std::string& h : own) headers = curl_slist_append(headers, h.c_str());
  return HeaderList(headers, &curl_slist_free_all);
}

// One try's options on an easy handle: address, method, SigV4 signing, timeouts, and the transfer's
// callbacks (a PUT or POST uploads t's body).
void set_options(CURL* c, const S3Options& o, const char* method, const std::string& url, curl_slist* headers,
                 Transfer* t) {
  const std::string sigv4 = fmt::format("aws:amz:{}:s3", o.region);  // libcurl copies string options
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(c, CURLOPT_USERNAME, o.access_key.c_str());
  curl_easy_setopt(c, CURLOPT_PASSWORD, o.secret_key.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, o.connect_timeout_ms);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, o.request_timeout_ms);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, t);
  if (std::strcmp(method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (std::strcmp(method, "PUT") == 0 || std::strcmp(method, "POST") == 0) {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, t);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t->body_bytes));
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);  // CURLOPT_UPLOAD alone would send PUT
  }
}

}  // namespace

S3Client::Response S3Client::send(Request& r) {
  const std::string url = request_url(options_, r.url, r.query);
  const std::string what = fmt::format("S3 {} {}", r.op, r.url.str());
  std::string last_error;
  long last_status = 0;
  std::string last_code;
  for (int attempt = 1; attempt <= options_.attempts; ++attempt) {
    if (attempt > 1) {
      ++counters_.retries;
      const double pause = jittered_pause_s(options_.backoff_ms, attempt - 1);
      log::warn("{}: {} (try {} of {}); retrying in {:.2f} s", what, last_error, attempt - 1, options_.attempts, pause);
      std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    }
    if (r.counter != nullptr) ++*r.counter;
    Response res;
    std::unique_ptr<void, std::function<void(void*)>> curl(take_handle(), [this](void* h) { give_back(h); });
    CURL* c = static_cast<CURL*>(curl.get());
    Transfer t{c, r.body, r.body_bytes, 0, r.out, r.out_bytes, r.max_body, &res.body, 0, false, &res.etag};
    const HeaderList headers = request_headers(options_, r.headers);
    set_options(c, options_, r.method, url, headers.get(), &t);
    char detail[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, detail);
    const CURLcode rc = curl_easy_perform(c);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
    if (rc != CURLE_OK && !t.overflow) {
      curl_easy_cleanup(static_cast<CURL*>(curl.release()));  // never reused: its connections may be broken
      last_error = detail[0] != '\0' ? detail : curl_easy_strerror(rc);
      last_status = 0;
      last_code.clear();
      continue;  // no reply, a dropped connection or a timeout: try again
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &res.status);
    curl_off_t length = -1;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    res.content_length = length;
    res.received = t.received;
    if (t.overflow) {
      throw DataError(fmt::format("{}: the reply is larger than the {} bytes expected", what,
                                  r.out != nullptr ? r.out_bytes : r.max_body));
    }
    auto [code, message] = xml_error(res.body);
    if (res.status >= 200 && res.status < 300 && code.empty()) return res;
    last_status = res.status;
    last_code = code.empty() ? fmt::format("HTTP {}", res.status) : code;
    last_error = message.empty() ? last_code : fmt::format("{} {} ({})", res.status, code, message);
    // 2xx with an <Error> body: CompleteMultipartUpload's way of failing after it started; retry.
    if (res.status >= 500 || res.status == 429 || (res.status >= 200 && res.status < 300)) continue;
    const char* hint = res.status == 403 ? "; check the object-store credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE)" : "";
    throw S3Error(fmt::format("{}: {}{}", what, last_error, hint), res.status, last_code);
  }
  throw S3Error(fmt::format("{}: {} (gave up after {} tries)", what, last_error, options_.attempts), last_status,
                last_code);
}

void S3Client::put(const ObjectUrl& url, const std::string& body) {
  Request r;
  r.method = r.op = "PUT";
  r.url = url;
  r.body = body.data();
  r.body_bytes = body.size();
  r.headers = {"Content-Type: application/octet-stream", "Content-MD5: " + base64_md5(body.data(), body.size())};
  r.counter = &counters_.put;
  send(r);
}

void S3Client::upload(const ObjectUrl& url, const std::vector<FileSlice>& slices) {
  uint64_t total = 0;
  for (const FileSlice& s : slices) total += s.bytes;
  if (total > options_.part_bytes) {
    upload_parts(url, slices, total);
    return;
  }
  std::string body(total, '\0');
  read_slices(slices, 0, total, body.data());
  put(url, body);
}

void S3Client::upload_parts(const ObjectUrl& url, const std::vector<FileSlice>& slices, uint64_t total) {
  const std::string upload_id = create_multipart(url);
  try {
    complete_multipart(url, upload_id, put_parts(url, upload_id, slices, total));
  } catch (...) {
    abort_multipart(url, upload_id);  // nothing of a failed upload stays: its parts are dropped
    throw;
  }
}

std::string S3Client::create_multipart(const ObjectUrl& url) {
  Request create;
  create.method = "POST";
  create.op = "CreateMultipartUpload";
  create.url = url;
  create.query = {{"uploads", ""}};
  create.headers = {"Content-Type: application/octet-stream"};
  create.counter = &counters_.create_multipart;
  tinyxml2::XMLDocument doc;
  const std::string reply = send(create).body;
  doc.Parse(reply.data(), reply.size());
  const std::string upload_id = xml_child(doc.RootElement(), "UploadId");
  if (upload_id.empty()) {
    throw S3Error(fmt::format("S3 CreateMultipartUpload {}: no UploadId in the reply", url.str()), 200, "");
  }
  return upload_id;
}

std::vector<std::string> S3Client::put_parts(const ObjectUrl& url, const std::string& upload_id,
                                             const std::vector<FileSlice>& slices, uint64_t total) {
  const uint64_t part = options_.part_bytes;
  const auto parts = static_cast<int>((total + part - 1) / part);
  std::vector<std::string> etags(static_cast<size_t>(parts));
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    std::string buffer;
    for (int i = next++; i < parts && !failed; i = next++) {
      try {
        const uint64_t begin = static_cast<uint64_t>(i) * part, bytes = std::min(part, total - begin);
        buffer.resize(bytes);
        read_slices(slices, begin, bytes, buffer.data());
        Request r;
        r.method = "PUT";
        r.op = "UploadPart";
        r.url = url;
        r.query = {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}};
        r.body = buffer.data();
        r.body_bytes = bytes;
        r.headers = {"Content-MD5: " + base64_md5(buffer.data(), bytes)};
        r.counter = &counters_.upload_part;
        etags[static_cast<size_t>(i)] = send(r).etag;
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int k = 0; k < std::min(options_.parallelism, parts); ++k) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return etags;
}

void S3Client::complete_multipart(const ObjectUrl& url, const std::string& upload_id,
                                  const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", i + 1, etags[i]);
  }
  xml += "</CompleteMultipartUpload>";
  Request complete;
  complete.method = "POST";
  complete.op = "CompleteMultipartUpload";
  complete.url = url;
  complete.query = {{"uploadId", upload_id}};
  complete.body = xml.data();
  complete.body_bytes = xml.size();
  complete.headers = {"Content-Type: application/xml"};
  complete.counter = &counters_.complete_multipart;
  send(complete);
}

void S3Client::abort_multipart(const ObjectUrl& url, const std::string& upload_id) {
  try {
    Request abort;
    abort.method = "DELETE";
    abort.op = "AbortMultipartUpload";
    abort.url = url;
    abort.query = {{"uploadId", upload_id}};
    abort.counter = &counters_.abort_multipart;
    send(abort);
  } catch (const Error& e) {
    log::warn("{} (its parts stay until the bucket's lifecycle rule removes them)", e.what());
  }
}

std::string S3Client::get(const ObjectUrl& url, uint64_t max_bytes) {
  Request r;
  r.url = url;
  r.max_body = max_bytes;
  r.counter = &counters_.get;
  return send(r).body;
}

void S3Client::get_range(const ObjectUrl& url, uint64_t offset, uint64_t bytes, void* out) {
  if (bytes == 0) return;
  Request r;
  r.op = "GET (range)";
  r.url = url;
  r.headers = {fmt::format("Range: bytes={}-{}", offset, offset + bytes - 1)};
  r.out = static_cast<char*>(out);
  r.out_bytes = bytes;
  r.counter = &counters_.get;
  const Response res = send(r);
  if (res.received != bytes) {
    throw S3Error(fmt::format("S3 GET {}: bytes {} to {} asked, {} arrived (the object is shorter?)", url.str(), offset,
                              offset + bytes, res.received),
                  res.status, "ShortRead");
  }
}

std::optional<uint64_t> S3Client::head(const ObjectUrl& url) {
  Request r;
  r.method = r.op = "HEAD";
  r.url = url;
  r.counter = &counters_.head;
  try {
    const Response res = send(r);
    return res.content_length < 0 ? 0 : static_cast<uint64_t>(res.content_length);
  } catch (const S3Error& e) {
    if (e.status() == 404) return std::nullopt;  // a HEAD reply has no body to tell a missing bucket
    throw;
  }
}

void S3Client::remove(const ObjectUrl& url) {
  Request r;
  r.method = "DELETE";
  r.op = "DELETE";
  r.url = url;
  r.counter = &counters_.remove;
  try {
    send(r);
  } catch (const S3Error& e) {
    if (e.status() != 404 || e.code() == "NoSuchBucket") throw;
  }
}

std::vector<ObjectInfo> S3Client::list(const ObjectUrl& prefix, int page_size) {
  std::vector<ObjectInfo> out;
  std::string token;
  for (int page = 0;; ++page) {
    Request r;
    r.op = "ListObjectsV2";
    r.url = {prefix.bucket, ""};
    r.query = {{"list-type", "2"}, {"max-keys", std::to_string(page_size)}, {"prefix", prefix.key}};
    if (!token.empty()) r.query.push_back({"continuation-token", token});
    r.counter = &counters_.list;
    const std::string body = send(r).body;
    tinyxml2::XMLDocument doc;
    if (doc.Parse(body.data(), body.size()) != tinyxml2::XML_SUCCESS || doc.RootElement() == nullptr) {
      throw S3Error(fmt::format("S3 ListObjectsV2 {}: the reply is not XML", prefix.str()), 200, "");
    }
    const tinyxml2::XMLElement* root = doc.RootElement();
    for (const tinyxml2::XMLElement* e = root->FirstChildElement("Contents"); e != nullptr;
         e = e->NextSiblingElement("Contents")) {
      ObjectInfo info{xml_child(e, "Key"), 0};
      info.size = std::strtoull(xml_child(e, "Size").c_str(), nullptr, 10);
      out.push_back(std::move(info));
    }
    token = xml_child(root, "NextContinuationToken");
    if (xml_child(root, "IsTruncated") != "true") break;
    if (token.empty())
      throw S3Error(fmt::format("S3 ListObjectsV2 {}: truncated without a token", prefix.str()), 200, "");
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

S3Client& default_s3_client() {
  static S3Client client(s3_options_from_environment());
  return client;
}

}  // namespace tessera::storage
