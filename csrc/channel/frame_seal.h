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
// The tag always follows the body, and the header's length never counts it. Every
// libcrypto call is checked: a failure is a kInternal Status, and the connection ends.
// A seal belongs to the process that made it: a forked child never sends or receives
// under its parent's keys and counters (which would reuse a nonce).
#pragma once

#include <sys/types.h>

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

// transfer.encrypt: off (never ask), auto (ask unless the peer is this host's process
// that proved itself, reached directly), on (require).
enum class EncryptPolicy : int { kOff = 0, kAuto = 1, kOn = 2 };
enum class SealMode : uint32_t { kMac = 1, kAead = 2 };

// Whether this build can seal with AES-256-GCM.
bool AeadBuilt();
const char* SealModeName(SealMode mode);

// One direction of one connection. Frames go through Begin, then Cover (bytes the tag
// covers in either mode) and Carry (chunk bytes: covered only when sealing), then Tag
// (sender) or Check (receiver). In kAead mode Cover and Carry encrypt or decrypt from `in`
// to `out` (which may be the same memory); in kMac mode they never write.
class FrameCipher {
 public:
  static Status Create(SealMode mode, const Key256& key, bool sending, std::unique_ptr<FrameCipher>* out);
  ~FrameCipher();
  FrameCipher(const FrameCipher&) = delete;
  FrameCipher& operator=(const FrameCipher&) = delete;

  bool encrypts() const { return mode_ == SealMode::kAead; }
  Status Begin(const uint8_t head[kFrameHeaderBytes]);
  Status Cover(const uint8_t* in, uint8_t* out, size_t n);
  Status Carry(const uint8_t* in, uint8_t* out, size_t n);
  Status Tag(uint8_t tag[kFrameTagBytes]);
  // False when the frame is not authentic (or its check could not be made).
  bool Check(const uint8_t tag[kFrameTagBytes]);

 private:
  FrameCipher(SealMode mode, const Key256& key, bool sending);
  Status Crypt(const uint8_t* in, uint8_t* out, size_t n);
  SealMode mode_;
  bool sending_;
  uint64_t counter_ = 0;
  HmacKey mac_key_;    // kMac
  Sha256 inner_;       // kMac: this frame's hash
  void* ctx_ = nullptr;  // kAead: an EVP_CIPHER_CTX keyed once
};

class FrameSeal {
 public:
  // server_side: this end accepted the connection (its failed checks are the peer's
  // AuthError; a client's are IntegrityError: what arrived was altered on the way).
  static Status Create(SealMode mode, const Key256& send_key, const Key256& recv_key, bool server_side,
                       std::shared_ptr<FrameSeal>* out);
  SealMode mode() const { return mode_; }
  bool server_side() const { return server_side_; }
  bool encrypts() const { return mode_ == SealMode::kAead; }
  // kClosed in a process other than the one whose login made this seal (a forked child).
  Status CheckOwner() const;
  FrameCipher& send() { return *send_; }
  FrameCipher& recv() { return *recv_; }

 private:
  FrameSeal() = default;
  SealMode mode_ = SealMode::kMac;
  bool server_side_ = false;
  pid_t owner_ = 0;
  std::unique_ptr<FrameCipher> send_, recv_;
};

}  // namespace rlboost
