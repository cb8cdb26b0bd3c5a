// Encoding a delta between two held versions and serving it (see delta_publish.h).
#include "weights/delta_publish.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/sha256.h"
#include "common/thread_pool.h"

namespace rlboost {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The tensor table pullers parse (rlboost/transfer/manifest.py): one uint8 tensor, the
// delta, and what it turns into what.
std::string DeltaMeta(uint64_t size, const PayloadLease& base, const PayloadLease& target, bool declined) {
  char head[512];
  snprintf(head, sizeof(head),
           "{\"format_version\":1,\"alignment\":4096,\"total_bytes\":%llu,"
           "\"tensors\":[[\"delta\",\"uint8\",[%llu],0,%llu]],"
           "\"delta\":{\"base\":%lld,\"target\":%lld,\"target_bytes\":%llu,",
           static_cast<unsigned long long>(size), static_cast<unsigned long long>(size),
           static_cast<unsigned long long>(size), static_cast<long long>(base.manifest.version),
           static_cast<long long>(target.manifest.version), static_cast<unsigned long long>(target.size));
  return std::string(head) + "\"base_tags\":\"" + TagsDigest(base.manifest) + "\",\"target_tags\":\"" +
         TagsDigest(target.manifest) + "\",\"declined\":" + (declined ? "true" : "false") + "}}";
}

}  // namespace

std::string TagsDigest(const Manifest& m) {
  Sha256 h;
  for (const ChunkTag& t : m.tags) h.Update(t.data(), t.size());
  Digest256 d = h.Finish();
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Status PublishDelta(VersionStore& store, int64_t base, int64_t target, const DeltaPublishOptions& opts,
                    DeltaPublished* out) {
  if (IsDeltaKey(base) || IsDeltaKey(target) || base < 0 || target <= base) {
    return Status(Code::kInvalidArgument, "a delta goes from a version to a newer one (got " +
                                              std::to_string(base) + " -> " + std::to_string(target) + ")");
  }
  const auto t0 = std::chrono::steady_clock::now();
  PayloadLease from, to;
  RLB_RETURN_IF_ERROR(store.ReadCommitted(base, &from));
  RLB_RETURN_IF_ERROR(store.ReadCommitted(target, &to));
  if (from.size != to.size) {
    return Status(Code::kInvalidArgument, "versions " + std::to_string(base) + " and " + std::to_string(target) +
                                              " differ in size: no delta between them");
  }
  DeltaHeader h;
  h.base = base;
  h.target = target;
  h.total_bytes = to.size;
  h.block_bytes = opts.block_bytes;
  EncodedDelta delta;
  const uint64_t limit = static_cast<uint64_t>(std::max(0.0, opts.max_fraction) * to.size);
  RLB_RETURN_IF_ERROR(EncodeDelta(from.data, to.data, h, opts.threads, &delta, std::max<uint64_t>(limit, 1),
                                  &out->declined));
  out->encode_s = Since(t0);
  out->counts = delta.counts();
  out->target_bytes = to.size;
  const int64_t key = DeltaKey(target);
  const uint64_t size = out->declined ? 1 : delta.size();
  std::shared_ptr<Region> region;
  RLB_RETURN_IF_ERROR(store.Stage(key, size, &region));
  if (!out->declined) delta.WriteTo(region->data());
  Status st = store.Commit(key, opts.chunk_bytes, DeltaMeta(size, from, to, out->declined), opts.threads,
                           &out->manifest);
  if (!st.ok()) store.DiscardStaged(key);
  out->total_s = Since(t0);
  return st;
}

std::vector<uint32_t> MismatchedChunks(const Manifest& m, const uint8_t* data, const std::string& secret,
                                       int threads) {
  const ChunkKeys keys(secret, m.version);
  const uint32_t n = m.num_chunks();
  const uint32_t tasks = static_cast<uint32_t>(std::max(1, std::min<int>(threads, static_cast<int>(n))));
  std::vector<uint8_t> bad(n, 0);
  ParallelFor(n == 0 ? 0 : tasks, [&](size_t t) {
    for (uint32_t i = static_cast<uint32_t>(t); i < n; i += tasks) {
      const uint32_t len = m.ChunkLength(i);
      bad[i] = TagMatches(m.tags[i], keys.Tag(i, len, PolyvalOf(keys.hash_key(), data + m.ChunkOffset(i), len))) ? 0 : 1;
    }
  });
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    if (bad[i]) out.push_back(i);
  }
  return out;
}

}  // namespace rlboost
