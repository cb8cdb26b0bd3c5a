// Per-frame MACs (HMAC-SHA256) and, when built with libcrypto, AES-256-GCM sealing.
#include "transport/tcp/frame_seal.h"

#include <cstring>

#ifdef RLBOOST_HAS_AEAD
#include <openssl/evp.h>
#endif

namespace rlboost {

bool AeadBuilt() {
#ifdef RLBOOST_HAS_AEAD
  return true;
#else
  return false;
#endif
}

FrameCipher::FrameCipher(SealMode mode, const Key256& key, bool sending)
    : mode_(mode), sending_(sending) {
  uint8_t ipad[64], opad[64];
  for (size_t i = 0; i < 64; ++i) {
    uint8_t k = i < key.size() ? key[i] : 0;
    ipad[i] = k ^ 0x36;
    opad[i] = k ^ 0x5c;
  }
  inner0_.Update(ipad, 64);
  outer0_.Update(opad, 64);
#ifdef RLBOOST_HAS_AEAD
  if (mode_ == SealMode::kAead) {
    EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
    EVP_CipherInit_ex(c, EVP_aes_256_gcm(), nullptr, key.data(), nullptr, sending ? 1 : 0);
    ctx_ = c;
  }
#endif
}

FrameCipher::~FrameCipher() {
#ifdef RLBOOST_HAS_AEAD
  if (ctx_ != nullptr) EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(ctx_));
#endif
}

void FrameCipher::Begin(const uint8_t head[kFrameHeaderBytes]) {
  uint8_t nonce[12] = {};
  const uint64_t n = counter_++;
  std::memcpy(nonce + 4, &n, 8);
  if (mode_ == SealMode::kMac) {
    inner_ = inner0_;
    inner_.Update(nonce + 4, 8);
    inner_.Update(head, kFrameHeaderBytes);
    return;
  }
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  int outl = 0;
  EVP_CipherInit_ex(c, nullptr, nullptr, nullptr, nonce, sending_ ? 1 : 0);
  EVP_CipherUpdate(c, nullptr, &outl, head, static_cast<int>(kFrameHeaderBytes));
#endif
}

void FrameCipher::Crypt(const uint8_t* in, uint8_t* out, size_t n) {
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  constexpr size_t kStep = size_t{1} << 30;  // EVP lengths are ints
  for (size_t done = 0; done < n;) {
    int outl = 0;
    const size_t step = n - done < kStep ? n - done : kStep;
    EVP_CipherUpdate(c, out + done, &outl, in + done, static_cast<int>(step));
    done += step;
  }
#else
  (void)in;
  (void)out;
  (void)n;
#endif
}

void FrameCipher::Cover(const uint8_t* in, uint8_t* out, size_t n) {
  if (mode_ == SealMode::kMac) {
    inner_.Update(in, n);
  } else {
    Crypt(in, out, n);
  }
}

void FrameCipher::Carry(const uint8_t* in, uint8_t* out, size_t n) {
  if (mode_ == SealMode::kAead) Crypt(in, out, n);
}

void FrameCipher::Tag(uint8_t tag[kFrameTagBytes]) {
  if (mode_ == SealMode::kMac) {
    Digest256 ih = inner_.Finish();
    Sha256 outer = outer0_;
    outer.Update(ih.data(), ih.size());
    Digest256 full = outer.Finish();
    std::memcpy(tag, full.data(), kFrameTagBytes);
    return;
  }
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  uint8_t scratch[16];
  int outl = 0;
  EVP_CipherFinal_ex(c, scratch, &outl);
  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kFrameTagBytes), tag);
#endif
}

bool FrameCipher::Check(const uint8_t tag[kFrameTagBytes]) {
  if (mode_ == SealMode::kMac) {
    uint8_t want[kFrameTagBytes];
    Tag(want);
    return ConstantTimeEqual(want, tag, kFrameTagBytes);
  }
#ifdef RLBOOST_HAS_AEAD
  auto* c = static_cast<EVP_CIPHER_CTX*>(ctx_);
  uint8_t scratch[16];
  int outl = 0;
  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kFrameTagBytes), const_cast<uint8_t*>(tag));
  return EVP_CipherFinal_ex(c, scratch, &outl) > 0;
#else
  return false;
#endif
}

}  // namespace rlboost
