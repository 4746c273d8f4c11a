// The job token is a shared secret: stores prove they hold it and derive public names from it,
// but never send, print or store it in clear (RELIABILITY.md row 23).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera::comm::auth {

// Proofs and nonces are raw bytes of this length (HMAC-SHA256).
inline constexpr size_t kProofBytes = 32;

// `bytes` bytes from the operating system's generator (OpenSSL RAND_bytes); throws StoreError
// if it fails, since a predictable nonce or token would be worse than stopping.
std::string random_bytes(size_t bytes);

// 2 x `bytes` hex digits of random_bytes(bytes): fresh ids (attempts, tokens).
std::string random_hex(size_t bytes);

// A fresh token for a job that did not bring one (`tessera train --nproc N`): 128 random bits.
std::string new_job_token();

// The public name of a job's keys (file store directory, etcd key component): 32 hex digits of
// HMAC-SHA256(token, label). It tells who holds the token which namespace is theirs and tells
// nobody else the token (recovering it means guessing it, so tokens must be random).
std::string job_namespace(const std::string& token);

// HMAC-SHA256(token, role || server_nonce || client_nonce): what a TCP store client (role
// "client") and server (role "server") send to prove they hold the token without sending it.
// The roles differ so neither proof can be replayed as the other.
std::string proof(const std::string& token, std::string_view role, std::string_view server_nonce,
                  std::string_view client_nonce);

// Constant-time equality for proofs (CRYPTO_memcmp): a stranger learns nothing from timing.
bool same_secret(std::string_view a, std::string_view b);

}  // namespace tessera::comm::auth
