// Delta encoding and application (see delta_codec.h for the format).
#include "weights/delta_codec.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "common/bytes.h"
#include "common/thread_pool.h"

namespace rlboost {
namespace {

enum Mode : uint32_t { kSame = 0, kSparse = 1, kRaw = 2 };
// The value class of a sparse entry (the two low bits of its varint).
enum Kind : uint32_t { kOne = 0, kThree = 1, kLowByte = 2, kWord = 3 };
constexpr uint32_t kMaxEntryBytes = 6;  // a varint of up to 4 bytes, then up to 2 value bytes
constexpr uint32_t kMaxVarintBytes = 5;

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline void Xor16(uint8_t* p, uint32_t v) {
  uint16_t w = static_cast<uint16_t>(Load16(p) ^ v);
  std::memcpy(p, &w, 2);
}

uint32_t BlockLength(const DeltaHeader& h, uint32_t block) {
  const uint64_t off = uint64_t{block} * h.block_bytes;
  return static_cast<uint32_t>(std::min<uint64_t>(h.block_bytes, h.total_bytes - off));
}

uint32_t BlockCount(uint64_t total, uint32_t block_bytes) {
  return static_cast<uint32_t>(total / block_bytes + (total % block_bytes != 0 ? 1 : 0));
}

// Writes the changed words of one block as sparse entries; returns the bytes written, or
// `len` or more when raw XOR would be no larger (the caller then writes that instead).
class SparseWriter {
 public:
  SparseWriter(uint8_t* out, uint32_t len) : start_(out), o_(out), stop_(len > kMaxEntryBytes ? out + len - kMaxEntryBytes : out) {}

  // False once the entries would not be smaller than the raw block.
  bool Emit(uint64_t pos, uint32_t v) {
    if (o_ >= stop_) return false;
    const uint32_t kind = v == 1 ? kOne : v == 3 ? kThree : v < 256 ? kLowByte : kWord;
    uint64_t x = ((pos - last_) << 2) | kind;
    while (x >= 0x80) {
      *o_++ = static_cast<uint8_t>(x | 0x80);
      x >>= 7;
    }
    *o_++ = static_cast<uint8_t>(x);
    if (kind >= kLowByte) *o_++ = static_cast<uint8_t>(v);
    if (kind == kWord) *o_++ = static_cast<uint8_t>(v >> 8);
    last_ = pos + 1;
    ++entries_;
    return true;
  }
  uint64_t written() const { return static_cast<uint64_t>(o_ - start_); }
  uint64_t entries() const { return entries_; }

 private:
  uint8_t* start_;
  uint8_t* o_;
  uint8_t* stop_;
  uint64_t last_ = 0;
  uint64_t entries_ = 0;
};

// Emits every changed word of a 64-bit XOR lane (4 words from `pos`).
inline bool EmitLane(SparseWriter& w, uint64_t x, uint64_t pos) {
  while (x != 0) {
    const unsigned shift = static_cast<unsigned>(__builtin_ctzll(x)) & ~15u;
    if (!w.Emit(pos + shift / 16, static_cast<uint32_t>(x >> shift) & 0xFFFFu)) return false;
    x &= ~(uint64_t{0xFFFF} << shift);
  }
  return true;
}

// Sparse entries for a block; false when raw XOR is no larger.
bool EncodeSparse(const uint8_t* a, const uint8_t* b, uint32_t len, uint8_t* out, uint64_t* written,
                  uint64_t* changed) {
  SparseWriter w(out, len);
  const uint64_t words = len / 2;
  uint64_t i = 0;
  for (; i + 16 <= words; i += 16) {  // 32 bytes at a time: most of them are unchanged
    const uint8_t* pa = a + 2 * i;
    const uint8_t* pb = b + 2 * i;
    const uint64_t x0 = Load64(pa) ^ Load64(pb), x1 = Load64(pa + 8) ^ Load64(pb + 8);
    const uint64_t x2 = Load64(pa + 16) ^ Load64(pb + 16), x3 = Load64(pa + 24) ^ Load64(pb + 24);
    if ((x0 | x1 | x2 | x3) == 0) continue;
    if (!EmitLane(w, x0, i) || !EmitLane(w, x1, i + 4) || !EmitLane(w, x2, i + 8) || !EmitLane(w, x3, i + 12)) {
      return false;
    }
  }
  for (; i < words; ++i) {
    const uint32_t v = Load16(a + 2 * i) ^ Load16(b + 2 * i);
    if (v != 0 && !w.Emit(i, v)) return false;
  }
  if (len & 1) {  // an odd last byte is one more "word" whose high byte does not exist
    const uint32_t v = a[len - 1] ^ b[len - 1];
    if (v != 0 && !w.Emit(words, v)) return false;
  }
  *written = w.written();
  *changed = w.entries();
  return true;
}

void XorInto(const uint8_t* a, const uint8_t* b, uint8_t* out, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t x = Load64(a + i) ^ Load64(b + i);
    std::memcpy(out + i, &x, 8);
  }
  for (; i < n; ++i) out[i] = a[i] ^ b[i];
}

Status Malformed(uint32_t block, const char* what) {
  return Status(Code::kProtocol, "delta block " + std::to_string(block) + ": " + what);
}

// Applies one sparse block to dst (which already holds the base's bytes).
Status ApplySparse(const uint8_t* p, const uint8_t* end, uint8_t* dst, uint32_t len, uint32_t block) {
  const uint64_t words = len / 2, slots = words + (len & 1);
  uint64_t pos = 0;
  while (p < end) {
    uint64_t x = 0;
    unsigned shift = 0;
    for (uint32_t n = 0;; ++n) {
      if (p == end || n == kMaxVarintBytes) return Malformed(block, "truncated or overlong entry");
      const uint8_t byte = *p++;
      x |= uint64_t{byte & 0x7Fu} << shift;
      shift += 7;
      if ((byte & 0x80) == 0) break;
    }
    pos += x >> 2;
    if (pos >= slots) return Malformed(block, "entry past the end of its block");
    uint32_t v;
    switch (static_cast<uint32_t>(x & 3)) {
      case kOne: v = 1; break;
      case kThree: v = 3; break;
      case kLowByte:
        if (end - p < 1) return Malformed(block, "truncated value");
        v = *p++;
        break;
      default:
        if (end - p < 2) return Malformed(block, "truncated value");
        v = uint32_t{p[0]} | uint32_t{p[1]} << 8;
        p += 2;
        break;
    }
    if (pos < words) {
      Xor16(dst + 2 * pos, v);
    } else {
      if (v > 0xFF) return Malformed(block, "value wider than the block's last byte");
      dst[len - 1] ^= static_cast<uint8_t>(v);
    }
    ++pos;
  }
  return Status::Ok();
}

Status ApplyBlock(uint32_t mode, const uint8_t* body, uint32_t body_len, const uint8_t* base, uint8_t* dst,
                  uint32_t len, uint32_t block) {
  if (mode == kRaw) {
    XorInto(base, body, dst, len);
    return Status::Ok();
  }
  if (dst != base) std::memcpy(dst, base, len);
  return mode == kSparse ? ApplySparse(body, body + body_len, dst, len, block) : Status::Ok();
}

}  // namespace

EncodedDelta::~EncodedDelta() {
  for (Part& p : parts_) std::free(p.data);
}

uint64_t EncodedDelta::size() const {
  uint64_t n = kDeltaHeaderBytes + 4 * uint64_t{table_.size()};
  for (const Part& p : parts_) n += p.size;
  return n;
}

void EncodedDelta::WriteTo(uint8_t* out) const {
  std::string head;
  ByteWriter w(&head);
  w.U32(kDeltaMagic);
  w.U32(kDeltaFormat);
  w.I64(header_.base);
  w.I64(header_.target);
  w.U64(header_.total_bytes);
  w.U32(header_.block_bytes);
  w.U32(header_.num_blocks);
  std::memcpy(out, head.data(), head.size());
  out += head.size();
  if (!table_.empty()) std::memcpy(out, table_.data(), 4 * table_.size());
  out += 4 * table_.size();
  for (const Part& p : parts_) {
    if (p.size > 0) std::memcpy(out, p.data, p.size);
    out += p.size;
  }
}

std::string EncodedDelta::ToString() const {
  std::string s(size(), '\0');
  WriteTo(reinterpret_cast<uint8_t*>(&s[0]));
  return s;
}

Status EncodeDelta(const uint8_t* base, const uint8_t* target, const DeltaHeader& header, int threads,
                   EncodedDelta* out, uint64_t max_bytes, bool* too_large) {
  if (header.block_bytes < kMinDeltaBlockBytes || header.block_bytes > kMaxDeltaBlockBytes ||
      header.block_bytes % 2 != 0) {
    return Status(Code::kInvalidArgument, "block_bytes must be even and in [" + std::to_string(kMinDeltaBlockBytes) +
                                              ", " + std::to_string(kMaxDeltaBlockBytes) + "]");
  }
  if (header.total_bytes / header.block_bytes >= UINT32_MAX) {
    return Status(Code::kInvalidArgument, "payload needs too many delta blocks; raise block_bytes");
  }
  EncodedDelta d;
  d.header_ = header;
  d.header_.num_blocks = BlockCount(header.total_bytes, header.block_bytes);
  const uint32_t nb = d.header_.num_blocks;
  const uint32_t tasks = std::max<uint32_t>(1, std::min<uint32_t>(std::max(1, threads), nb));
  d.table_.assign(nb, 0);
  d.parts_.resize(nb == 0 ? 0 : tasks);
  std::vector<DeltaCounts> counts(d.parts_.size());
  std::atomic<bool> out_of_memory{false}, over{false};
  ParallelFor(d.parts_.size(), [&](size_t t) {
    EncodedDelta::Part& part = d.parts_[t];
    DeltaCounts& c = counts[t];
    const uint32_t first = static_cast<uint32_t>(uint64_t{nb} * t / tasks);
    const uint32_t last = static_cast<uint32_t>(uint64_t{nb} * (t + 1) / tasks);
    // This task's share of max_bytes: past it, the whole delta is likely past the limit.
    const double share = max_bytes * (double(last - first) / nb) + header.block_bytes;
    for (uint32_t blk = first; blk < last && !out_of_memory && !over; ++blk) {
      if (max_bytes > 0 && part.size > share) {
        over = true;
        return;
      }
      const uint32_t len = BlockLength(d.header_, blk);
      if (part.capacity - part.size < len) {  // room for the raw block, the worst case
        uint64_t cap = std::max<uint64_t>(part.capacity * 2, part.size + len);
        void* grown = std::realloc(part.data, cap);
        if (grown == nullptr) {
          out_of_memory = true;
          return;
        }
        part.data = static_cast<uint8_t*>(grown);
        part.capacity = cap;
      }
      const uint64_t off = uint64_t{blk} * d.header_.block_bytes;
      uint8_t* o = part.data + part.size;
      uint64_t written = 0, changed = 0;
      uint32_t mode;
      if (EncodeSparse(base + off, target + off, len, o, &written, &changed)) {
        mode = written == 0 ? kSame : kSparse;
        ++(written == 0 ? c.same_blocks : c.sparse_blocks);
        c.changed_words += changed;
      } else {
        XorInto(base + off, target + off, o, len);
        written = len;
        mode = kRaw;
        ++c.raw_blocks;
      }
      part.size += written;
      d.table_[blk] = static_cast<uint32_t>(written << 2) | mode;
    }
  });
  if (out_of_memory) return Status(Code::kInternal, "out of memory encoding a delta");
  if (too_large != nullptr) *too_large = over || (max_bytes > 0 && d.size() > max_bytes);
  if (too_large != nullptr && *too_large) return Status::Ok();
  for (const DeltaCounts& c : counts) {
    d.counts_.same_blocks += c.same_blocks;
    d.counts_.sparse_blocks += c.sparse_blocks;
    d.counts_.raw_blocks += c.raw_blocks;
    d.counts_.changed_words += c.changed_words;
  }
  *out = std::move(d);
  return Status::Ok();
}

Status ReadDeltaHeader(const uint8_t* delta, uint64_t len, DeltaHeader* out) {
  ByteReader r(delta, len);
  uint32_t magic = 0, format = 0;
  DeltaHeader h;
  if (len < kDeltaHeaderBytes) return Status(Code::kProtocol, "delta is shorter than its header");
  RLB_RETURN_IF_ERROR(r.U32(&magic));
  RLB_RETURN_IF_ERROR(r.U32(&format));
  if (magic != kDeltaMagic) return Status(Code::kProtocol, "not a delta (bad magic)");
  if (format != kDeltaFormat) {
    return Status(Code::kProtocol, "delta format " + std::to_string(format) + " is not " + std::to_string(kDeltaFormat));
  }
  RLB_RETURN_IF_ERROR(r.I64(&h.base));
  RLB_RETURN_IF_ERROR(r.I64(&h.target));
  RLB_RETURN_IF_ERROR(r.U64(&h.total_bytes));
  RLB_RETURN_IF_ERROR(r.U32(&h.block_bytes));
  RLB_RETURN_IF_ERROR(r.U32(&h.num_blocks));
  if (h.block_bytes < kMinDeltaBlockBytes || h.block_bytes > kMaxDeltaBlockBytes || h.block_bytes % 2 != 0) {
    return Status(Code::kProtocol, "delta block size is out of bounds");
  }
  if (h.total_bytes / h.block_bytes >= UINT32_MAX || h.num_blocks != BlockCount(h.total_bytes, h.block_bytes)) {
    return Status(Code::kProtocol, "delta block count does not match its size");
  }
  if (r.remaining() / 4 < h.num_blocks) return Status(Code::kProtocol, "delta block table is truncated");
  uint64_t body = 0;
  for (uint32_t i = 0; i < h.num_blocks; ++i) {
    uint32_t e;
    std::memcpy(&e, delta + kDeltaHeaderBytes + 4 * uint64_t{i}, 4);
    const uint32_t mode = e & 3, n = e >> 2, blen = BlockLength(h, i);
    if (mode > kRaw || (mode == kSame && n != 0) || (mode == kRaw && n != blen) || (mode == kSparse && n == 0)) {
      return Malformed(i, "table entry does not fit the block");
    }
    body += n;
  }
  if (body != r.remaining() - 4 * uint64_t{h.num_blocks}) {
    return Status(Code::kProtocol, "delta block lengths do not add up to its size");
  }
  *out = h;
  return Status::Ok();
}

Status ApplyDelta(const uint8_t* delta, uint64_t len, const uint8_t* base, uint8_t* dst, uint64_t total_bytes,
                  int threads, DeltaHeader* header) {
  DeltaHeader h;
  RLB_RETURN_IF_ERROR(ReadDeltaHeader(delta, len, &h));
  if (h.total_bytes != total_bytes) {
    return Status(Code::kInvalidArgument, "delta is for a payload of " + std::to_string(h.total_bytes) +
                                              " bytes, not " + std::to_string(total_bytes));
  }
  const uint32_t nb = h.num_blocks;
  std::vector<uint64_t> at(nb + 1, 0);  // body offset of each block
  const uint8_t* table = delta + kDeltaHeaderBytes;
  for (uint32_t i = 0; i < nb; ++i) {
    uint32_t e;
    std::memcpy(&e, table + 4 * uint64_t{i}, 4);
    at[i + 1] = at[i] + (e >> 2);
  }
  const uint8_t* bodies = table + 4 * uint64_t{nb};
  const uint32_t tasks = std::max<uint32_t>(1, std::min<uint32_t>(std::max(1, threads), nb));
  std::mutex mu;
  Status first;
  ParallelFor(nb == 0 ? 0 : tasks, [&](size_t t) {
    const uint32_t lo = static_cast<uint32_t>(uint64_t{nb} * t / tasks);
    const uint32_t hi = static_cast<uint32_t>(uint64_t{nb} * (t + 1) / tasks);
    for (uint32_t i = lo; i < hi; ++i) {
      uint32_t e;
      std::memcpy(&e, table + 4 * uint64_t{i}, 4);
      const uint64_t off = uint64_t{i} * h.block_bytes;
      Status st = ApplyBlock(e & 3, bodies + at[i], e >> 2, base + off, dst + off, BlockLength(h, i), i);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = st;
        return;
      }
    }
  });
  if (!first.ok()) return first;
  if (header != nullptr) *header = h;
  return Status::Ok();
}

}  // namespace rlboost
