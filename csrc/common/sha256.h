// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), self-contained so the native module
// needs no crypto library. Used for the connect-time challenge-response and the
// per-connection manifest MAC (channel/handshake.h).
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

// HMAC-SHA256 under one key, with the padded key's two hash states computed once: each
// message then costs its own blocks plus two. The one place the key padding is written.
class HmacKey {
 public:
  HmacKey(const void* key, size_t n);
  explicit HmacKey(const std::string& key) : HmacKey(key.data(), key.size()) {}
  // A hash to feed the message into, then Finish() it.
  Sha256 Start() const { return inner_; }
  Digest256 Finish(Sha256 inner) const;
  Digest256 Mac(const void* msg, size_t n) const;

 private:
  Sha256 inner_, outer_;
};

Digest256 HmacSha256(const std::string& key, const void* msg, size_t n);

// Compares without an early exit so timing does not reveal the first differing byte.
bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace rlboost
