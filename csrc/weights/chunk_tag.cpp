// Key derivation and tags of chunks (see chunk_tag.h).
#include "weights/chunk_tag.h"

#include <cstring>

#include "common/bytes.h"

namespace rlboost {
namespace {

constexpr char kKeysLabel[] = "rlboost-chunk-keys-v3";
constexpr char kHashLabel[] = "polyval-key";
constexpr char kTagLabel[] = "tag-key";

std::string AsKey(const Digest256& d) { return std::string(reinterpret_cast<const char*>(d.data()), d.size()); }

Block128 HashKeyFrom(const Digest256& master) {
  Digest256 d = HmacSha256(AsKey(master), kHashLabel, sizeof(kHashLabel) - 1);
  Block128 h;
  std::memcpy(h.data(), d.data(), h.size());
  return h;
}

Digest256 MasterKey(const std::string& secret, int64_t version) {
  std::string msg(kKeysLabel);
  ByteWriter(&msg).I64(version);
  return HmacSha256(secret, msg.data(), msg.size());
}

Digest256 TagKeyFrom(const Digest256& master) {
  return HmacSha256(AsKey(master), kTagLabel, sizeof(kTagLabel) - 1);
}

}  // namespace

ChunkKeys::ChunkKeys(const std::string& secret, int64_t version)
    : version_(version),
      hash_(HashKeyFrom(MasterKey(secret, version))),
      tag_key_(AsKey(TagKeyFrom(MasterKey(secret, version)))) {}

ChunkTag ChunkKeys::Tag(uint32_t index, uint32_t length, const Block128& digest) const {
  std::string msg;
  ByteWriter w(&msg);
  w.I64(version_);
  w.U32(index);
  w.U32(length);
  w.Raw(digest.data(), digest.size());
  Digest256 full = tag_key_.Mac(msg.data(), msg.size());
  ChunkTag tag;
  std::memcpy(tag.data(), full.data(), tag.size());
  return tag;
}

bool TagMatches(const ChunkTag& want, const ChunkTag& got) {
  return ConstantTimeEqual(want.data(), got.data(), want.size());
}

}  // namespace rlboost
