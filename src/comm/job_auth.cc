// HMAC-SHA256 proofs and names derived from the job token, on OpenSSL's libcrypto.
#include "comm/job_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "comm/process_group.h"

namespace tessera::comm::auth {
namespace {

std::string hmac_sha256(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &n) == nullptr) {
    throw StoreError("job token: HMAC-SHA256 failed in libcrypto");
  }
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string hex(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace

std::string random_bytes(size_t bytes) {
  std::string out(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(bytes)) != 1) {
    throw StoreError("job token: the system's random generator failed (OpenSSL RAND_bytes)");
  }
  return out;
}

std::string random_hex(size_t bytes) { return hex(random_bytes(bytes)); }

std::string new_job_token() { return "job-" + random_hex(16); }

std::string job_namespace(const std::string& token) {
  return hex(hmac_sha256(token, "tessera job namespace v1").substr(0, 16));
}

std::string proof(const std::string& token, std::string_view role, std::string_view server_nonce,
                  std::string_view client_nonce) {
  std::string message = "tessera tcp store v2 ";
  message.append(role).append(1, '\0').append(server_nonce).append(client_nonce);
  return hmac_sha256(token, message);
}

bool same_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tessera::comm::auth
