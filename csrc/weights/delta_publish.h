// PublishDelta: the publisher's side of delta updates. Given two complete versions k and
// k+1 of a VersionStore (both pinned while read), it encodes delta(k -> k+1) once
// (weights/delta_codec.h) and commits it to the same store under DeltaKey(k+1), chunked
// and tagged like any version, so every transport, relay and integrity check serves it
// unchanged. Its metadata (a tensor table of one uint8 tensor, plus a "delta" section)
// names base and target and binds both by the SHA-256 of their chunk tags, so a puller
// applies it only to the very bytes it was computed from, and checks the result against
// the target's own tags. A delta that would save little is declined (a marker is served).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "weights/delta_codec.h"
#include "weights/manifest.h"
#include "weights/version_store.h"

namespace rlboost {

struct DeltaPublishOptions {
  uint32_t chunk_bytes = 1 << 20;
  uint32_t block_bytes = kDefaultDeltaBlockBytes;
  int threads = 2;
  // A delta larger than this fraction of its target is declined: a one-byte payload whose
  // metadata says so is served instead, so pullers waiting for it take the full version
  // at once, and no memory holds a delta that saves little.
  double max_fraction = 0.5;
};

struct DeltaPublished {
  Manifest manifest;  // of the delta payload (its version is DeltaKey(target))
  bool declined = false;
  uint64_t target_bytes = 0;
  double encode_s = 0;  // encoding alone
  double total_s = 0;   // with staging, copying and tagging
  DeltaCounts counts;
};

Status PublishDelta(VersionStore& store, int64_t base, int64_t target, const DeltaPublishOptions& opts,
                    DeltaPublished* out);

// Hex SHA-256 of a manifest's chunk tags, in chunk order: what a delta names its base and
// target by.
std::string TagsDigest(const Manifest& m);

// Indices of the chunks of `data` (laid out by `m`) that do not match m's tags under
// `secret`, computed in up to `threads` tasks; empty when the bytes are exactly m's.
std::vector<uint32_t> MismatchedChunks(const Manifest& m, const uint8_t* data, const std::string& secret,
                                       int threads);

}  // namespace rlboost
