// Manifest (native view): one published version's payload size, chunking and per-chunk
// tag (weights/chunk_tag.h), plus an opaque metadata blob (the Python tensor
// table) carried as-is. Encoded little-endian with a trailing crc32c (against accidents;
// the reply that carries it is MACed), and validated field by field on decode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "weights/chunk_tag.h"

namespace rlboost {

struct Manifest {
  int64_t version = 0;
  uint64_t total_bytes = 0;
  uint32_t chunk_bytes = 0;
  std::vector<ChunkTag> tags;  // one per chunk
  std::string meta;

  uint32_t num_chunks() const { return static_cast<uint32_t>(tags.size()); }
  uint64_t ChunkOffset(uint32_t i) const { return uint64_t{i} * chunk_bytes; }
  uint32_t ChunkLength(uint32_t i) const;
  bool SameLayout(const Manifest& o) const;
};

// Number of chunks for a payload; checks the chunk size and count bounds.
Status ChunkCount(uint64_t total_bytes, uint32_t chunk_bytes, uint32_t* out);
// Fills m->tags from the payload (keys from `secret`), in up to `threads` tasks on the
// shared thread pool.
void ComputeChunkTags(const uint8_t* data, const std::string& secret, int threads, Manifest* m);

std::string EncodeManifest(const Manifest& m);
Status DecodeManifest(const uint8_t* p, size_t n, Manifest* out);

}  // namespace rlboost
