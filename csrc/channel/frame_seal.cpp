// Per-frame MACs (HMAC-SHA256) and, when built with libcrypto, AES-256-GCM sealing; every
// libcrypto call's result is checked.
#include "channel/frame_seal.h"

#include <unistd.h>

#include <cstring>

#ifdef RLBOOST_HAS_AEAD
#include <openssl/evp.h>
#endif

namespace rlboost {
namespace {

Status CipherFailed(const char* call) {
  return Status(Code::kInternal, std::string("AES-256-GCM: ") + call + " failed in OpenSSL's libcrypto");
}

}  // namespace

bool AeadBuilt() {
#ifdef RLBOOST_HAS_AEAD
  return true;
#else
  return false;
#endif
}

const char* SealModeName(SealMode mode) { return mode == SealMode::kAead ? "AES-256-GCM tag" : "MAC"; }

FrameCipher::FrameCipher(SealMode mode, const Key256& key, bool sending)
    : mode_(mode), sending_(sending), mac_key_(key.data(), key.size()) {}

Status FrameCipher::Create(SealMode mode, const Key256& key, bool sending, std::unique_ptr<FrameCipher>* out) {
  std::unique_ptr<FrameCipher> c(new FrameCipher(mode, key, sending));
  if (mode == SealMode::kAead) {
#ifdef RLBOOST_HAS_AEAD
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    if (ctx == nullptr) return CipherFailed("EVP_CIPHER_CTX_new");
    c->ctx_ = ctx;  // freed by the destructor from here on
    if (EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key.data(), nullptr, sending ? 1 : 0) != 1) {
      return CipherFailed("EVP_CipherInit_ex (key)");
    }
#else
    return Status(Code::kInvalidArgument, "AES-256-GCM is not built into this module (HAS_AEAD=False)");
#endif
  }
  *out = std::move(c);
  return Status::Ok();
}

FrameCipher::~FrameCipher() {
#ifdef RLBOOST_HAS_AEAD
  if (ctx_ != nullptr) EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(ctx_));
#endif
}

Status FrameCipher::Begin(const uint8_t head[kFrameHeaderBytes]) {
  uint8_t nonce[12] = {};
  const uint64_t n = counter_++;
  std::memcpy(nonce + 4, &n, 8);
  if (mode_ == SealMode::kMac) {
    inner_ = mac_key_.Start();
    inner_.Update(nonce + 4, 8);
    inner_.Update(head, kFrameHeaderBytes);
    return Status::Ok();
  }
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  int outl = 0;
  if (EVP_CipherInit_ex(c, nullptr, nullptr, nullptr, nonce, sending_ ? 1 : 0) != 1) {
    return CipherFailed("EVP_CipherInit_ex (nonce)");
  }
  if (EVP_CipherUpdate(c, nullptr, &outl, head, static_cast<int>(kFrameHeaderBytes)) != 1) {
    return CipherFailed("EVP_CipherUpdate (header)");
  }
  return Status::Ok();
#else
  return CipherFailed("sealing");
#endif
}

Status FrameCipher::Crypt(const uint8_t* in, uint8_t* out, size_t n) {
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  constexpr size_t kStep = size_t{1} << 30;  // EVP lengths are ints
  for (size_t done = 0; done < n;) {
    int outl = 0;
    const size_t step = n - done < kStep ? n - done : kStep;
    if (EVP_CipherUpdate(c, out + done, &outl, in + done, static_cast<int>(step)) != 1 ||
        outl != static_cast<int>(step)) {
      return CipherFailed("EVP_CipherUpdate");
    }
    done += step;
  }
  return Status::Ok();
#else
  (void)in;
  (void)out;
  (void)n;
  return CipherFailed("sealing");
#endif
}

Status FrameCipher::Cover(const uint8_t* in, uint8_t* out, size_t n) {
  if (mode_ == SealMode::kMac) {
    inner_.Update(in, n);
    return Status::Ok();
  }
  return Crypt(in, out, n);
}

Status FrameCipher::Carry(const uint8_t* in, uint8_t* out, size_t n) {
  return mode_ == SealMode::kAead ? Crypt(in, out, n) : Status::Ok();
}

Status FrameCipher::Tag(uint8_t tag[kFrameTagBytes]) {
  if (mode_ == SealMode::kMac) {
    Digest256 full = mac_key_.Finish(inner_);
    std::memcpy(tag, full.data(), kFrameTagBytes);
    return Status::Ok();
  }
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  uint8_t scratch[16];
  int outl = 0;
  if (EVP_CipherFinal_ex(c, scratch, &outl) != 1) return CipherFailed("EVP_CipherFinal_ex");
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kFrameTagBytes), tag) != 1) {
    return CipherFailed("EVP_CIPHER_CTX_ctrl (get tag)");
  }
  return Status::Ok();
#else
  return CipherFailed("sealing");
#endif
}

bool FrameCipher::Check(const uint8_t tag[kFrameTagBytes]) {
  if (mode_ == SealMode::kMac) {
    uint8_t want[kFrameTagBytes];
    Digest256 full = mac_key_.Finish(inner_);
    std::memcpy(want, full.data(), kFrameTagBytes);
    return ConstantTimeEqual(want, tag, kFrameTagBytes);
  }
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  uint8_t scratch[16];
  int outl = 0;
  if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kFrameTagBytes), const_cast<uint8_t*>(tag)) != 1) {
    return false;
  }
  return EVP_CipherFinal_ex(c, scratch, &outl) == 1;
#else
  return false;
#endif
}

Status FrameSeal::Create(SealMode mode, const Key256& send_key, const Key256& recv_key, bool server_side,
                         std::shared_ptr<FrameSeal>* out) {
  std::shared_ptr<FrameSeal> s(new FrameSeal());
  s->mode_ = mode;
  s->server_side_ = server_side;
  s->owner_ = getpid();
  RLB_RETURN_IF_ERROR(FrameCipher::Create(mode, send_key, true, &s->send_));
  RLB_RETURN_IF_ERROR(FrameCipher::Create(mode, recv_key, false, &s->recv_));
  *out = std::move(s);
  return Status::Ok();
}

Status FrameSeal::CheckOwner() const {
  if (getpid() == owner_) return Status::Ok();
  return Status(Code::kClosed, "this connection belongs to the parent process (inherited across fork); "
                               "a forked child opens its own");
}

}  // namespace rlboost
