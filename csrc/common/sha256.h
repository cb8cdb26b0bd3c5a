// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained so the native module
// needs no crypto library. Used for the connect-time challenge-response and the
// per-connection manifest MAC (transport/tcp/handshake.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rlboost {

using Digest256 = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  Digest256 Finish();

 private:
  void Block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Digest256 Sha256Of(const void* data, size_t n);
Digest256 HmacSha256(const std::string& key, const void* msg, size_t n);

// Compares without an early exit so timing does not reveal the first differing byte.
bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace rlboost
