// Manifest encoding, validation and checksum computation.
#include "weights/manifest.h"

#include <algorithm>
#include <cstring>

#include "common/bytes.h"
#include "common/crc32c.h"
#include "common/frame.h"
#include "common/thread_pool.h"

namespace rlboost {

uint32_t Manifest::ChunkLength(uint32_t i) const {
  const uint64_t off = ChunkOffset(i);
  if (off >= total_bytes) return 0;  // past the last chunk: no bytes, never a wrapped length
  return static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes, total_bytes - off));
}

bool Manifest::SameLayout(const Manifest& o) const {
  return version == o.version && total_bytes == o.total_bytes && chunk_bytes == o.chunk_bytes &&
         tags == o.tags && meta == o.meta;
}

Status ChunkCount(uint64_t total_bytes, uint32_t chunk_bytes, uint32_t* out) {
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes) {
    return Status(Code::kInvalidArgument, "chunk_bytes must be in [" + std::to_string(kMinChunkBytes) +
                                              ", " + std::to_string(kMaxChunkBytes) + "], got " +
                                              std::to_string(chunk_bytes));
  }
  // Not (total + chunk - 1) / chunk: that wraps for totals near 2^64 and would let a
  // huge payload claim zero chunks.
  const uint64_t n = total_bytes / chunk_bytes + (total_bytes % chunk_bytes != 0 ? 1 : 0);
  if (n > kMaxChunks) {
    return Status(Code::kInvalidArgument, "payload of " + std::to_string(total_bytes) +
                                              " bytes needs more than " + std::to_string(kMaxChunks) +
                                              " chunks; raise chunk_bytes");
  }
  *out = static_cast<uint32_t>(n);
  return Status::Ok();
}

void ComputeChunkTags(const uint8_t* data, const std::string& secret, int threads, Manifest* m) {
  const ChunkKeys keys(secret, m->version);
  const uint32_t n = m->num_chunks();
  const uint32_t tasks = static_cast<uint32_t>(std::max(1, std::min<int>(threads, static_cast<int>(n))));
  ParallelFor(tasks, [&](size_t t) {
    for (uint32_t i = static_cast<uint32_t>(t); i < n; i += tasks) {
      const uint32_t len = m->ChunkLength(i);
      m->tags[i] = keys.Tag(i, len, PolyvalOf(keys.hash_key(), data + m->ChunkOffset(i), len));
    }
  });
}

std::string EncodeManifest(const Manifest& m) {
  std::string out;
  ByteWriter w(&out);
  w.I64(m.version);
  w.U64(m.total_bytes);
  w.U32(m.chunk_bytes);
  w.U32(m.num_chunks());
  for (const ChunkTag& t : m.tags) w.Raw(t.data(), t.size());
  w.U32(static_cast<uint32_t>(m.meta.size()));
  w.Raw(m.meta.data(), m.meta.size());
  w.U32(Crc32c(out.data(), out.size()));
  return out;
}

Status DecodeManifest(const uint8_t* p, size_t n, Manifest* out) {
  if (n < 4) return Status(Code::kProtocol, "manifest is truncated");
  uint32_t stored;
  std::memcpy(&stored, p + n - 4, 4);
  if (Crc32c(p, n - 4) != stored) return Status(Code::kProtocol, "manifest fails its checksum");
  ByteReader r(p, n - 4);
  Manifest m;
  uint32_t count = 0, meta_len = 0;
  RLB_RETURN_IF_ERROR(r.I64(&m.version));
  RLB_RETURN_IF_ERROR(r.U64(&m.total_bytes));
  RLB_RETURN_IF_ERROR(r.U32(&m.chunk_bytes));
  RLB_RETURN_IF_ERROR(r.U32(&count));
  uint32_t want;
  Status layout = ChunkCount(m.total_bytes, m.chunk_bytes, &want);
  if (!layout.ok()) return Status(Code::kProtocol, "manifest layout: " + layout.message());
  if (count != want) return Status(Code::kProtocol, "manifest chunk count does not match its size");
  if (m.version < 0) return Status(Code::kProtocol, "manifest has a negative version");
  if (r.remaining() < uint64_t{count} * kChunkTagBytes) return Status(Code::kProtocol, "manifest is truncated");
  m.tags.resize(count);
  for (ChunkTag& t : m.tags) RLB_RETURN_IF_ERROR(r.Raw(t.data(), t.size()));
  RLB_RETURN_IF_ERROR(r.U32(&meta_len));
  if (meta_len > kMaxManifestMeta || meta_len != r.remaining()) {
    return Status(Code::kProtocol, "manifest metadata length is out of bounds");
  }
  m.meta.resize(meta_len);
  RLB_RETURN_IF_ERROR(r.Raw(&m.meta[0], meta_len));
  *out = std::move(m);
  return Status::Ok();
}

}  // namespace rlboost
