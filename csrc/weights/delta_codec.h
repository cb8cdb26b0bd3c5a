// Delta codec: version k+1 of a payload as the bit-pattern XOR against version k, in
// blocks that encode and apply independently (so both spread over threads). A block is
// unchanged (no bytes), sparse, or raw XOR, whichever is smallest. Sparse blocks list the
// changed 16-bit words (bf16 values) as (gap, value) entries: the gap, two bits of value
// class and a varint share one to three bytes, and the value classes cover the XOR of a
// one-ULP step (0x0001, 0x0003: the flipped trailing bits of +-1) with no byte at all,
// which is what most changed bf16 values at RL learning rates are. Every field is bounds
// checked on apply: a malformed delta is a kProtocol error, never a write out of bounds.
//
// Layout (little-endian): header (magic, format, base, target, total_bytes, block_bytes,
// num_blocks), a table of one u32 per block ((length << 2) | mode), then the block bodies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace rlboost {

constexpr uint32_t kDeltaMagic = 0x4C44524Cu;  // "LRDL"
constexpr uint32_t kDeltaFormat = 1;
constexpr uint32_t kDeltaHeaderBytes = 40;
constexpr uint32_t kDefaultDeltaBlockBytes = 256 << 10;  // stays in cache between the two passes
constexpr uint32_t kMinDeltaBlockBytes = 4096;
constexpr uint32_t kMaxDeltaBlockBytes = 64 << 20;

struct DeltaHeader {
  int64_t base = 0;
  int64_t target = 0;
  uint64_t total_bytes = 0;
  uint32_t block_bytes = kDefaultDeltaBlockBytes;
  uint32_t num_blocks = 0;
};

struct DeltaCounts {
  uint64_t same_blocks = 0, sparse_blocks = 0, raw_blocks = 0;
  uint64_t changed_words = 0;  // in sparse blocks
};

// An encoded delta, in per-thread parts (copied once, into wherever it is served from).
class EncodedDelta {
 public:
  EncodedDelta() = default;
  EncodedDelta(EncodedDelta&&) noexcept = default;
  EncodedDelta& operator=(EncodedDelta&&) noexcept = default;
  ~EncodedDelta();

  uint64_t size() const;
  void WriteTo(uint8_t* out) const;  // size() bytes
  std::string ToString() const;
  const DeltaHeader& header() const { return header_; }
  const DeltaCounts& counts() const { return counts_; }

 private:
  friend Status EncodeDelta(const uint8_t*, const uint8_t*, const DeltaHeader&, int, EncodedDelta*, uint64_t, bool*);
  struct Part {
    uint8_t* data = nullptr;
    uint64_t size = 0, capacity = 0;
  };
  DeltaHeader header_;
  DeltaCounts counts_;
  std::vector<uint32_t> table_;
  std::vector<Part> parts_;
};

// Encodes target against base (both header.total_bytes long) in up to `threads` tasks.
// max_bytes (0: no limit): gives up as soon as the delta would be larger, and says so in
// *too_large (then `out` is left empty).
Status EncodeDelta(const uint8_t* base, const uint8_t* target, const DeltaHeader& header, int threads,
                   EncodedDelta* out, uint64_t max_bytes = 0, bool* too_large = nullptr);
// Reads and checks a delta's header and block table (lengths add up to what follows).
Status ReadDeltaHeader(const uint8_t* delta, uint64_t len, DeltaHeader* out);
// dst = base with the delta applied; dst may be base (in place: unchanged bytes are not
// touched). total_bytes must be the delta's. On error dst is partly written.
Status ApplyDelta(const uint8_t* delta, uint64_t len, const uint8_t* base, uint8_t* dst, uint64_t total_bytes,
                  int threads, DeltaHeader* header);

}  // namespace rlboost
