// FrameSeal: what binds every frame after a login to that login (wire format 4). Each
// direction of a connection has its own key (from the login, handshake.h) and an implicit
// frame counter, so a frame cannot be forged, altered, replayed, reordered or dropped
// without the receiver noticing. Two modes, chosen at login:
//   kMac:  HMAC-SHA256(key, counter | header | body)[:16] after the body. A chunk frame's
//          tag covers its header and prefix; its bytes are covered by the chunk's own tag
//          in the (MACed) manifest, so they go out of the region with no copy.
//   kAead: AES-256-GCM (OpenSSL's libcrypto) seals the body under the header as associated
//          data, the counter as nonce; chunk bytes included. Built when CMake finds
//          libcrypto (rlboost._C.HAS_AEAD).
// The tag always follows the body, and the header's length never counts it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/frame.h"
#include "common/sha256.h"
#include "common/status.h"

namespace rlboost {

constexpr size_t kFrameTagBytes = 16;
using Key256 = std::array<uint8_t, 32>;

// transfer.encrypt: off (never ask), auto (ask when the peer is off loopback), on (require).
enum class EncryptPolicy : int { kOff = 0, kAuto = 1, kOn = 2 };
enum class SealMode : uint32_t { kMac = 1, kAead = 2 };

// Whether this build can seal with AES-256-GCM.
bool AeadBuilt();

// One direction of one connection. Frames go through Begin, then Cover (bytes the tag
// covers in either mode) and Carry (chunk bytes: covered only when sealing), then Tag
// (sender) or Check (receiver). In kAead mode Cover and Carry encrypt or decrypt from `in`
// to `out` (which may be the same memory); in kMac mode they never write.
class FrameCipher {
 public:
  FrameCipher(SealMode mode, const Key256& key, bool sending);
  ~FrameCipher();
  FrameCipher(const FrameCipher&) = delete;
  FrameCipher& operator=(const FrameCipher&) = delete;

  bool encrypts() const { return mode_ == SealMode::kAead; }
  void Begin(const uint8_t head[kFrameHeaderBytes]);
  void Cover(const uint8_t* in, uint8_t* out, size_t n);
  void Carry(const uint8_t* in, uint8_t* out, size_t n);
  void Tag(uint8_t tag[kFrameTagBytes]);
  bool Check(const uint8_t tag[kFrameTagBytes]);

 private:
  void Crypt(const uint8_t* in, uint8_t* out, size_t n);
  SealMode mode_;
  bool sending_;
  uint64_t counter_ = 0;
  Sha256 inner0_, outer0_, inner_;  // kMac: HMAC's padded-key states, and this frame's
  void* ctx_ = nullptr;             // kAead: an EVP_CIPHER_CTX keyed once
};

class FrameSeal {
 public:
  // server_side: this end accepted the connection (its failed checks are the peer's
  // AuthError; a client's are IntegrityError: what arrived was altered on the way).
  FrameSeal(SealMode mode, const Key256& send_key, const Key256& recv_key, bool server_side)
      : mode_(mode), server_side_(server_side), send_(mode, send_key, true), recv_(mode, recv_key, false) {}
  SealMode mode() const { return mode_; }
  bool server_side() const { return server_side_; }
  bool encrypts() const { return mode_ == SealMode::kAead; }
  FrameCipher& send() { return send_; }
  FrameCipher& recv() { return recv_; }
  // The header of the frame being received, between RecvHeader and the body's check.
  uint8_t received_head[kFrameHeaderBytes] = {};

 private:
  SealMode mode_;
  bool server_side_;
  FrameCipher send_, recv_;
};

}  // namespace rlboost
