// State encoder and decoder; the format is described in state_codec.h.
#include "migration/state_codec.h"

#include <cstring>
#include <string>

#include "common/crc32c.h"
#include "migration/wire.h"

namespace rlboost::migration {
namespace {

constexpr uint8_t kStateMagic[4] = {'R', 'L', 'B', 'S'};

struct Totals {
  uint64_t prompt = 0, output = 0, stop = 0;
};

// One record's invariants are the same as RequestState/SamplingParams enforce, so a
// buffer that passes never makes the Python constructors fail.
Status CheckRecord(const uint8_t* r, uint64_t index, Code code, Totals* totals) {
  auto fail = [&](const std::string& what) {
    return Status(code, "state record " + std::to_string(index) + ": " + what);
  };
  double temperature = LoadF64(r + 24), top_p = LoadF64(r + 32);
  uint32_t max_new = Load<uint32_t>(r + 44), prompt_len = Load<uint32_t>(r + 48);
  if (!(temperature >= 0.0)) return fail("temperature must be >= 0");
  if (!(top_p > 0.0 && top_p <= 1.0)) return fail("top_p must be in (0, 1]");
  if (max_new < 1) return fail("max_new_tokens must be >= 1");
  if (prompt_len < 1) return fail("prompt must not be empty");
  if (r[60] > 2) return fail("finish reason code " + std::to_string(r[60]) + " is unknown");
  if (r[61] != 0 || r[62] != 0 || r[63] != 0) return fail("reserved bytes are not zero");
  totals->prompt += prompt_len;
  totals->output += Load<uint32_t>(r + 52);
  totals->stop += Load<uint32_t>(r + 56);
  return Status::Ok();
}

Status CheckRecords(const uint8_t* records, uint64_t count, Code code, Totals* totals) {
  for (uint64_t i = 0; i < count; ++i) {
    RLB_RETURN_IF_ERROR(CheckRecord(records + i * kStateRecordBytes, i, code, totals));
  }
  return Status::Ok();
}

// Section offsets from the counts; the caller bounds counts so nothing here overflows.
void Place(StateLayout* l) {
  l->records = kStateHeaderBytes;
  l->prompt = l->records + l->count * kStateRecordBytes;
  l->output = l->prompt + 4 * l->prompt_tokens;
  l->logprobs = l->output + 4 * l->output_tokens;
  l->stop = l->logprobs + 4 * l->output_tokens;
  l->checksum = l->stop + 4 * l->stop_tokens;
  l->total = l->checksum + 4;
}

}  // namespace

Status PlanStates(const StateColumns& c, StateLayout* layout) {
  if (c.records.size % kStateRecordBytes != 0) return ArgErr("records column is not whole records");
  StateLayout l;
  l.count = c.records.size / kStateRecordBytes;
  l.record_version = c.record_version;
  if (l.count > kMaxStates) return ArgErr("too many states for one buffer");
  for (const Span* s : {&c.prompt, &c.output, &c.logprobs, &c.stop}) {
    if (s->size % 4 != 0 || s->size / 4 > kMaxSectionTokens) {
      return ArgErr("a token column is not whole 4-byte items or is too long");
    }
  }
  Totals totals;
  RLB_RETURN_IF_ERROR(CheckRecords(c.records.data, l.count, Code::kInvalidArgument, &totals));
  l.prompt_tokens = c.prompt.size / 4;
  l.output_tokens = c.output.size / 4;
  l.stop_tokens = c.stop.size / 4;
  if (totals.prompt != l.prompt_tokens || totals.output != l.output_tokens ||
      c.logprobs.size != c.output.size || totals.stop != l.stop_tokens) {
    return ArgErr("record lengths do not add up to the token columns");
  }
  Place(&l);
  *layout = l;
  return Status::Ok();
}

void WriteStates(const StateColumns& c, const StateLayout& l, uint8_t* out) {
  std::memcpy(out, kStateMagic, 4);
  Store<uint16_t>(out + 4, kStateWireVersion);
  Store<uint16_t>(out + 6, l.record_version);
  Store<uint32_t>(out + 8, static_cast<uint32_t>(l.count));
  Store<uint32_t>(out + 12, 0);
  Store<uint64_t>(out + 16, l.total);
  Store<uint64_t>(out + 24, l.prompt_tokens);
  Store<uint64_t>(out + 32, l.output_tokens);
  Store<uint64_t>(out + 40, l.stop_tokens);
  const std::pair<const Span*, uint64_t> parts[] = {{&c.records, l.records},
                                                    {&c.prompt, l.prompt},
                                                    {&c.output, l.output},
                                                    {&c.logprobs, l.logprobs},
                                                    {&c.stop, l.stop}};
  for (const auto& [span, offset] : parts) {
    if (span->size != 0) std::memcpy(out + offset, span->data, span->size);
  }
  Store<uint32_t>(out + l.checksum, Crc32c(out, l.checksum));
}

Status DecodeStates(const uint8_t* buf, size_t len, StateLayout* layout) {
  if (len < kStateHeaderBytes + 4) {
    return ProtocolErr("state buffer truncated: " + std::to_string(len) + " bytes");
  }
  if (std::memcmp(buf, kStateMagic, 4) != 0) return ProtocolErr("not a state buffer (bad magic)");
  uint16_t version = Load<uint16_t>(buf + 4);
  if (version != kStateWireVersion) {
    return ProtocolErr("state buffer wire version " + std::to_string(version) +
                       " is not supported (expected " + std::to_string(kStateWireVersion) + ")");
  }
  StateLayout l;
  l.record_version = Load<uint16_t>(buf + 6);
  l.count = Load<uint32_t>(buf + 8);
  l.prompt_tokens = Load<uint64_t>(buf + 24);
  l.output_tokens = Load<uint64_t>(buf + 32);
  l.stop_tokens = Load<uint64_t>(buf + 40);
  if (Load<uint32_t>(buf + 12) != 0) return ProtocolErr("state buffer has unknown flags");
  if (Load<uint64_t>(buf + 16) != len) {
    return ProtocolErr("state buffer length field says " + std::to_string(Load<uint64_t>(buf + 16)) +
                       " bytes, got " + std::to_string(len));
  }
  if (l.count > kMaxStates || l.prompt_tokens > kMaxSectionTokens ||
      l.output_tokens > kMaxSectionTokens || l.stop_tokens > kMaxSectionTokens) {
    return ProtocolErr("state buffer counts exceed the format's limits");
  }
  Place(&l);
  if (l.total != len) return ProtocolErr("state buffer counts do not match its length");
  uint32_t stored = Load<uint32_t>(buf + l.checksum);
  if (Crc32c(buf, l.checksum) != stored) return ProtocolErr("state buffer checksum mismatch");
  Totals totals;
  RLB_RETURN_IF_ERROR(CheckRecords(buf + l.records, l.count, Code::kProtocol, &totals));
  if (totals.prompt != l.prompt_tokens || totals.output != l.output_tokens ||
      totals.stop != l.stop_tokens) {
    return ProtocolErr("state record lengths do not add up to the header's totals");
  }
  *layout = l;
  return Status::Ok();
}

}  // namespace rlboost::migration
