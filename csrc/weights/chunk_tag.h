// Chunk tags: the integrity check of every chunk of a published version. The publisher
// computes, once per version, tag = HMAC-SHA256(prf_key, version | index | length |
// POLYVAL_H(chunk))[:16], with H and prf_key derived from the run's shared secret and the
// version; the tags travel in the manifest, whose reply is MACed per connection
// (channel/handshake.h). This is hash-then-PRF: a party without the secret cannot
// find other bytes that match a tag (a POLYVAL collision under an unknown H: at most
// blocks/2^128; the PRF hides H), so a forged or altered chunk fails its check whichever
// source or path it came through. Being deterministic, two publishers of the same bytes
// under the same secret and version list the same tags, so a puller may combine them.
// POLYVAL runs at a carry-less multiply per block, about the cost of a CRC-32C.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/polyval.h"
#include "common/sha256.h"

namespace rlboost {

constexpr size_t kChunkTagBytes = 16;
using ChunkTag = std::array<uint8_t, kChunkTagBytes>;

class ChunkKeys {
 public:
  ChunkKeys(const std::string& secret, int64_t version);

  // The key transports hash received bytes with (Polyval).
  const PolyvalKey& hash_key() const { return hash_; }
  // The tag of chunk `index` (`length` bytes) whose bytes hash to `digest`.
  ChunkTag Tag(uint32_t index, uint32_t length, const Block128& digest) const;

 private:
  int64_t version_;
  PolyvalKey hash_;
  HmacKey tag_key_;  // padded once: two blocks per tag, not four
};

// Whether a chunk's tag matches (in constant time).
bool TagMatches(const ChunkTag& want, const ChunkTag& got);

}  // namespace rlboost
