// POLYVAL (RFC 8452, section 3): a polynomial hash over GF(2^128) keyed by a secret H.
// Two different messages of n blocks collide for at most n/2^128 of the keys, so behind a
// pseudo-random function (weights/chunk_tag.h) it makes a MAC that a party without the
// key cannot forge, at the speed of a carry-less multiply per block: the per-chunk
// integrity check of weight transfers, checked while the bytes are still in cache.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace rlboost {

using Block128 = std::array<uint8_t, 16>;

// H and its first powers (in POLYVAL's Montgomery form), so 32 blocks are multiplied
// before one reduction.
struct PolyvalKey {
  static constexpr int kPowers = 32;
  explicit PolyvalKey(const Block128& h);
  // powers[i] = H^(i+1), as two little-endian 64-bit halves each.
  uint64_t powers[kPowers][2];
};

// A running POLYVAL over bytes fed in pieces of any size. A message whose length is not
// a multiple of 16 is zero-padded: callers bind the length elsewhere (the chunk tag does).
class Polyval {
 public:
  explicit Polyval(const PolyvalKey& key) : key_(&key) {}
  void Update(const void* data, size_t n);
  // Copies n bytes src -> dst and hashes them from the loaded registers (one pass).
  // streaming: non-temporal stores, for large copies not read again soon.
  void UpdateCopy(void* dst, const void* src, size_t n, bool streaming);
  Block128 Finish();

 private:
  void Blocks(const uint8_t* p, size_t nblocks);
  const PolyvalKey* key_;
  uint64_t acc_[2] = {0, 0};
  uint8_t partial_[16];
  size_t partial_len_ = 0;
};

// POLYVAL of a whole buffer.
Block128 PolyvalOf(const PolyvalKey& key, const void* data, size_t n);
// The bit-by-bit definition (no carry-less multiply instruction); tests compare both.
Block128 PolyvalPortable(const Block128& h, const void* data, size_t n);
// True when this CPU runs the carry-less multiply path (PCLMULQDQ; wide when VPCLMULQDQ).
bool PolyvalUsesHardware();

}  // namespace rlboost
