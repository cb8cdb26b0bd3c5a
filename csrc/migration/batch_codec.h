// Wire format of a MigrationBatch: packed request states plus, optionally, the KV pages
// of every sample (all little-endian):
//
//   header 64 B  magic "RLBB", wire version u16, flags u16 (bit 0: has KV), count u32,
//                batch record version u16, KV layout record version u16, total length u64,
//                states length u64, num_layers u32, num_kv_heads u32, head_dim u32,
//                block_size u32, dtype u8 (1 float32, 2 float16, 3 bfloat16), 11 zero
//                bytes, crc32c u32 of the header's first 60 bytes and the KV table
//   states       a state buffer (state_codec.h), which carries its own checksum
//   KV table     (has KV) per sample: kv_tokens u64, crc32c u32 of its KV bytes, 4 zero bytes
//   KV bytes     (has KV) per sample, each starting at a multiple of 64 bytes
//
// The states start at byte 64; the table and every KV region start at the next multiple
// of 64; all padding is zero, so every byte is covered by a checksum or a zero check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "migration/state_codec.h"

namespace rlboost::migration {

constexpr uint16_t kBatchWireVersion = 1;
constexpr size_t kBatchHeaderBytes = 64;
constexpr uint64_t kMaxLayoutDim = uint64_t{1} << 20;

struct BatchKV {
  uint64_t kv_tokens = 0;
  uint64_t offset = 0;  // where its bytes start in the buffer (decode) ...
  uint64_t nbytes = 0;
  const uint8_t* src = nullptr;  // ... or where they come from (encode)
};

struct BatchLayout {
  uint64_t count = 0;
  bool has_kv = false;
  uint16_t batch_version = 0, kv_version = 0;
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  uint8_t dtype = 0;
  uint64_t states_offset = kBatchHeaderBytes, states_len = 0;
  uint64_t table_offset = 0, total = 0;
  std::vector<BatchKV> kv;  // `count` entries when has_kv
};

// Bytes of one token's K and V across layers; 0 if the layout fields are invalid.
uint64_t TokenBytes(const BatchLayout& l);

// Checks the inputs (kInvalidArgument) and fills in offsets and the total length. The
// caller sets every field except offsets/total, and kv[i].src/nbytes/kv_tokens.
Status PlanBatch(const uint8_t* states, BatchLayout* layout);

// Writes a planned batch into out[0, layout.total); copies and checksums KV bytes on the
// thread pool.
void WriteBatch(const uint8_t* states, const BatchLayout& layout, uint8_t* out);

// Checks a whole buffer (every length, checksum and padding byte) without copying; any
// fault is kProtocol.
Status DecodeBatch(const uint8_t* buf, size_t len, BatchLayout* layout);

// CRC-32C of a large buffer computed in chunks on the thread pool.
uint32_t ParallelCrc32c(const uint8_t* data, size_t n);

}  // namespace rlboost::migration
