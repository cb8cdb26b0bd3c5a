// Wire format of many RequestStates in one buffer (all little-endian):
//
//   header  48 B  magic "RLBS", wire version u16, record version u16, count u32,
//                 flags u32 (0), total length u64, prompt/output/stop token totals u64
//   records 64 B each: sample_id u64, seed u64, weight_version i64, temperature f64,
//                 top_p f64, top_k u32, max_new_tokens u32, prompt/output/stop lengths
//                 u32, finish u8 (0 running, 1 stop, 2 length), 3 zero bytes
//   prompt ids u32[], output ids u32[], output logprobs f32[], stop ids u32[]
//   crc32c  u32 of every byte before it
//
// Columns rather than rows so both sides move token arrays with a single copy each.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace rlboost::migration {

constexpr uint16_t kStateWireVersion = 1;
constexpr size_t kStateHeaderBytes = 48;
constexpr size_t kStateRecordBytes = 64;
constexpr uint64_t kMaxStates = uint64_t{1} << 24;
constexpr uint64_t kMaxSectionTokens = uint64_t{1} << 36;  // per column, per buffer

struct StateLayout {
  uint64_t count = 0;
  uint16_t record_version = 0;
  uint64_t prompt_tokens = 0, output_tokens = 0, stop_tokens = 0;
  // Byte offsets of each section; `total` is the whole buffer including the checksum.
  uint64_t records = 0, prompt = 0, output = 0, logprobs = 0, stop = 0, checksum = 0,
           total = 0;
};

struct Span {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

struct StateColumns {
  Span records, prompt, output, logprobs, stop;
  uint16_t record_version = 0;
};

// Checks the columns (kInvalidArgument) and computes where each lands in the buffer.
Status PlanStates(const StateColumns& columns, StateLayout* layout);

// Writes a planned buffer of exactly layout.total bytes.
void WriteStates(const StateColumns& columns, const StateLayout& layout, uint8_t* out);

// Checks a whole buffer (lengths, checksum, every record) without allocating; any fault
// is kProtocol. On success `layout` says where each section is.
Status DecodeStates(const uint8_t* buf, size_t len, StateLayout* layout);

}  // namespace rlboost::migration
