// Batch encoder and decoder; the format is described in batch_codec.h.
#include "migration/batch_codec.h"

#include <cstring>
#include <string>

#include "common/crc32c.h"
#include "common/thread_pool.h"
#include "migration/wire.h"

namespace rlboost::migration {
namespace {

constexpr uint8_t kBatchMagic[4] = {'R', 'L', 'B', 'B'};
constexpr uint64_t kAlign = 64;
constexpr uint64_t kTableEntryBytes = 16;
constexpr uint64_t kChunkBytes = 256 << 10;
constexpr size_t kMetaCrcAt = 60;
// Batches whose KV bytes outgrow the cache are copied with streaming stores.
constexpr uint64_t kStreamingBytes = uint64_t{64} << 20;

struct Region {
  const uint8_t* src;
  uint8_t* dst;  // copy src here first, when set
  uint64_t len;
};

// Copies (where asked) and checksums every region in chunks spread over the pool; a copy
// takes its checksum from the bytes as it moves them (one pass).
std::vector<uint32_t> CopyAndChecksum(const std::vector<Region>& regions) {
  struct Chunk {
    size_t region;
    uint64_t off, len;
  };
  std::vector<Chunk> chunks;
  for (size_t r = 0; r < regions.size(); ++r) {
    for (uint64_t off = 0; off < regions[r].len; off += kChunkBytes) {
      chunks.push_back({r, off, std::min(kChunkBytes, regions[r].len - off)});
    }
  }
  std::vector<uint32_t> chunk_crc(chunks.size());
  uint64_t total = 0;
  for (const Region& r : regions) total += r.len;
  const bool streaming = total >= kStreamingBytes;
  ParallelFor(chunks.size(), [&](size_t i) {
    const Chunk& c = chunks[i];
    const Region& r = regions[c.region];
    const uint8_t* p = r.src + c.off;
    chunk_crc[i] = r.dst != nullptr ? Crc32cCopy(0, r.dst + c.off, p, c.len, streaming) : Crc32c(p, c.len);
  });
  std::vector<uint32_t> crcs(regions.size(), 0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    crcs[chunks[i].region] = Crc32cCombine(crcs[chunks[i].region], chunk_crc[i], chunks[i].len);
  }
  return crcs;
}

uint64_t ItemSize(uint8_t dtype) {
  switch (dtype) {
    case 1: return 4;  // float32
    case 2: return 2;  // float16
    case 3: return 2;  // bfloat16
    default: return 0;
  }
}

bool LayoutFieldsZero(const BatchLayout& l) {
  return l.num_layers == 0 && l.num_kv_heads == 0 && l.head_dim == 0 && l.block_size == 0 &&
         l.dtype == 0;
}

uint32_t MetaCrc(const uint8_t* header, const uint8_t* table, uint64_t table_len) {
  return Crc32cExtend(Crc32c(header, kMetaCrcAt), table, table_len);
}

// Decode helper: the region [from, to) must be zero padding.
Status CheckPadding(const uint8_t* buf, uint64_t from, uint64_t to) {
  if (!AllZero(buf + from, to - from)) return ProtocolErr("batch padding bytes are not zero");
  return Status::Ok();
}

Status ReadHeader(const uint8_t* buf, size_t len, BatchLayout* l) {
  if (len < kBatchHeaderBytes) return ProtocolErr("batch buffer truncated: " + std::to_string(len) + " bytes");
  if (std::memcmp(buf, kBatchMagic, 4) != 0) return ProtocolErr("not a migration batch (bad magic)");
  uint16_t version = Load<uint16_t>(buf + 4), flags = Load<uint16_t>(buf + 6);
  if (version != kBatchWireVersion) {
    return ProtocolErr("batch wire version " + std::to_string(version) + " is not supported (expected " +
                       std::to_string(kBatchWireVersion) + ")");
  }
  if ((flags & ~1u) != 0 || !AllZero(buf + 49, kMetaCrcAt - 49)) {
    return ProtocolErr("batch header has unknown flags or non-zero reserved bytes");
  }
  l->has_kv = (flags & 1) != 0;
  l->count = Load<uint32_t>(buf + 8);
  l->batch_version = Load<uint16_t>(buf + 12);
  l->kv_version = Load<uint16_t>(buf + 14);
  l->total = Load<uint64_t>(buf + 16);
  l->states_len = Load<uint64_t>(buf + 24);
  l->num_layers = Load<uint32_t>(buf + 32);
  l->num_kv_heads = Load<uint32_t>(buf + 36);
  l->head_dim = Load<uint32_t>(buf + 40);
  l->block_size = Load<uint32_t>(buf + 44);
  l->dtype = buf[48];
  if (l->total != len) {
    return ProtocolErr("batch length field says " + std::to_string(l->total) + " bytes, got " +
                       std::to_string(len));
  }
  if (l->count > kMaxStates || l->states_len > len - kBatchHeaderBytes) {
    return ProtocolErr("batch counts exceed the buffer or the format's limits");
  }
  if (l->has_kv ? TokenBytes(*l) == 0 : !LayoutFieldsZero(*l)) {
    return ProtocolErr("batch KV layout fields are invalid");
  }
  return Status::Ok();
}

// Reads the KV table and places every sample's bytes, all bounded by `len`.
Status ReadKV(const uint8_t* buf, size_t len, BatchLayout* l) {
  const uint64_t token_bytes = TokenBytes(*l);
  l->kv.reserve(l->count);  // the table was bounded by len before this
  uint64_t cursor = l->table_offset + l->count * kTableEntryBytes;
  for (uint64_t i = 0; i < l->count; ++i) {
    const uint8_t* e = buf + l->table_offset + i * kTableEntryBytes;
    BatchKV kv;
    kv.kv_tokens = Load<uint64_t>(e);
    if (Load<uint32_t>(e + 12) != 0) return ProtocolErr("batch KV table has non-zero reserved bytes");
    uint64_t start = AlignUp(cursor, kAlign);
    if (start > len) return ProtocolErr("batch truncated inside its KV bytes");
    RLB_RETURN_IF_ERROR(CheckPadding(buf, cursor, start));
    if (kv.kv_tokens > (len - start) / token_bytes) {
      return ProtocolErr("sample " + std::to_string(i) + " claims more KV bytes than the buffer holds");
    }
    kv.offset = start;
    kv.nbytes = kv.kv_tokens * token_bytes;
    kv.src = buf + start;
    cursor = start + kv.nbytes;
    l->kv.push_back(kv);
  }
  if (cursor != len) return ProtocolErr("batch has trailing bytes after its KV data");
  return Status::Ok();
}

}  // namespace

uint64_t TokenBytes(const BatchLayout& l) {
  uint64_t itemsize = ItemSize(l.dtype), out;
  for (uint64_t v : {uint64_t{l.num_layers}, uint64_t{l.num_kv_heads}, uint64_t{l.head_dim},
                     uint64_t{l.block_size}}) {
    if (v < 1 || v > kMaxLayoutDim) return 0;
  }
  // Each factor is at most 2^20 and itemsize at most 4: the product is below 2^63.
  out = uint64_t{l.num_layers} * 2 * l.num_kv_heads * l.head_dim * itemsize;
  return out;
}

uint32_t ParallelCrc32c(const uint8_t* data, size_t n) {
  return CopyAndChecksum({Region{data, nullptr, n}})[0];
}

Status PlanBatch(const uint8_t* states, BatchLayout* l) {
  StateLayout sl;
  Status st = DecodeStates(states, l->states_len, &sl);
  if (!st.ok()) return ArgErr("embedded states: " + st.message());
  if (sl.count != l->count) return ArgErr("batch count differs from the number of states");
  l->states_offset = kBatchHeaderBytes;
  if (!l->has_kv) {
    if (!LayoutFieldsZero(*l) || !l->kv.empty()) return ArgErr("a batch without KV carries no KV fields");
    l->total = kBatchHeaderBytes + l->states_len;
    return Status::Ok();
  }
  const uint64_t token_bytes = TokenBytes(*l);
  if (token_bytes == 0) return ArgErr("KV layout dimensions must be in [1, 2**20] with a known dtype");
  if (l->kv.size() != l->count) return ArgErr("need one KV entry per state");
  l->table_offset = AlignUp(kBatchHeaderBytes + l->states_len, kAlign);
  uint64_t cursor = l->table_offset + l->count * kTableEntryBytes;
  for (size_t i = 0; i < l->kv.size(); ++i) {
    BatchKV& kv = l->kv[i];
    uint64_t need;
    if (!MulAdd(kv.kv_tokens, token_bytes, 0, &need) || need != kv.nbytes) {
      return ArgErr("sample " + std::to_string(i) + ": KV bytes do not match kv_tokens * token bytes");
    }
    if (kv.nbytes != 0 && kv.src == nullptr) return ArgErr("KV source address is null");
    kv.offset = AlignUp(cursor, kAlign);
    if (__builtin_add_overflow(kv.offset, kv.nbytes, &cursor)) return ArgErr("batch too large");
  }
  l->total = cursor;
  return Status::Ok();
}

void WriteBatch(const uint8_t* states, const BatchLayout& l, uint8_t* out) {
  std::memset(out, 0, kBatchHeaderBytes);
  std::memcpy(out, kBatchMagic, 4);
  Store<uint16_t>(out + 4, kBatchWireVersion);
  Store<uint16_t>(out + 6, l.has_kv ? 1 : 0);
  Store<uint32_t>(out + 8, static_cast<uint32_t>(l.count));
  Store<uint16_t>(out + 12, l.batch_version);
  Store<uint16_t>(out + 14, l.kv_version);
  Store<uint64_t>(out + 16, l.total);
  Store<uint64_t>(out + 24, l.states_len);
  Store<uint32_t>(out + 32, l.num_layers);
  Store<uint32_t>(out + 36, l.num_kv_heads);
  Store<uint32_t>(out + 40, l.head_dim);
  Store<uint32_t>(out + 44, l.block_size);
  out[48] = l.dtype;
  std::memcpy(out + kBatchHeaderBytes, states, l.states_len);
  if (!l.has_kv) {
    Store<uint32_t>(out + kMetaCrcAt, MetaCrc(out, nullptr, 0));
    return;
  }
  uint64_t cursor = kBatchHeaderBytes + l.states_len;
  std::vector<Region> regions;
  for (const BatchKV& kv : l.kv) {
    regions.push_back({kv.src, out + kv.offset, kv.nbytes});
  }
  // Zero every gap: after the states, and before each KV region (the table is rewritten).
  std::memset(out + cursor, 0, l.table_offset + l.count * kTableEntryBytes - cursor);
  cursor = l.table_offset + l.count * kTableEntryBytes;
  for (const BatchKV& kv : l.kv) {
    std::memset(out + cursor, 0, kv.offset - cursor);
    cursor = kv.offset + kv.nbytes;
  }
  std::vector<uint32_t> crcs = CopyAndChecksum(regions);
  uint8_t* table = out + l.table_offset;
  for (size_t i = 0; i < l.kv.size(); ++i) {
    Store<uint64_t>(table + i * kTableEntryBytes, l.kv[i].kv_tokens);
    Store<uint32_t>(table + i * kTableEntryBytes + 8, crcs[i]);
  }
  Store<uint32_t>(out + kMetaCrcAt, MetaCrc(out, table, l.count * kTableEntryBytes));
}

Status DecodeBatch(const uint8_t* buf, size_t len, BatchLayout* layout) {
  BatchLayout l;
  RLB_RETURN_IF_ERROR(ReadHeader(buf, len, &l));
  const uint64_t states_end = kBatchHeaderBytes + l.states_len;
  uint64_t table_len = 0;
  if (l.has_kv) {
    l.table_offset = AlignUp(states_end, kAlign);
    table_len = l.count * kTableEntryBytes;
    if (l.table_offset > len || table_len > len - l.table_offset) {
      return ProtocolErr("batch truncated inside its KV table");
    }
  } else if (states_end != len) {
    return ProtocolErr("batch without KV has bytes after its states");
  }
  if (MetaCrc(buf, buf + l.table_offset, table_len) != Load<uint32_t>(buf + kMetaCrcAt)) {
    return ProtocolErr("batch header checksum mismatch");
  }
  StateLayout sl;
  RLB_RETURN_IF_ERROR(DecodeStates(buf + kBatchHeaderBytes, l.states_len, &sl));
  if (sl.count != l.count) return ProtocolErr("batch count differs from the number of states");
  if (l.has_kv) {
    RLB_RETURN_IF_ERROR(CheckPadding(buf, states_end, l.table_offset));
    RLB_RETURN_IF_ERROR(ReadKV(buf, len, &l));
    std::vector<Region> regions;
    for (const BatchKV& kv : l.kv) regions.push_back({kv.src, nullptr, kv.nbytes});
    std::vector<uint32_t> crcs = CopyAndChecksum(regions);
    for (size_t i = 0; i < l.kv.size(); ++i) {
      if (crcs[i] != Load<uint32_t>(buf + l.table_offset + i * kTableEntryBytes + 8)) {
        return ProtocolErr("sample " + std::to_string(i) + ": KV bytes checksum mismatch");
      }
    }
  }
  *layout = std::move(l);
  return Status::Ok();
}

}  // namespace rlboost::migration
