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

}  // namespace

ChunkKeys::ChunkKeys(const std::string& secret, int64_t version)
    : version_(version), hash_(HashKeyFrom(MasterKey(secret, version))) {
  Digest256 master = MasterKey(secret, version);
  Digest256 tag_key = HmacSha256(AsKey(master), kTagLabel, sizeof(kTagLabel) - 1);
  uint8_t ipad[64], opad[64];
  for (size_t i = 0; i < 64; ++i) {
    uint8_t k = i < tag_key.size() ? tag_key[i] : 0;
    ipad[i] = k ^ 0x36;
    opad[i] = k ^ 0x5c;
  }
  inner_.Update(ipad, 64);
  outer_.Update(opad, 64);
}

ChunkTag ChunkKeys::Tag(uint32_t index, uint32_t length, const Block128& digest) const {
  std::string msg;
  ByteWriter w(&msg);
  w.I64(version_);
  w.U32(index);
  w.U32(length);
  w.Raw(digest.data(), digest.size());
  Sha256 inner = inner_;
  inner.Update(msg.data(), msg.size());
  Digest256 ih = inner.Finish();
  Sha256 outer = outer_;
  outer.Update(ih.data(), ih.size());
  Digest256 full = outer.Finish();
  ChunkTag tag;
  std::memcpy(tag.data(), full.data(), tag.size());
  return tag;
}

bool TagMatches(const ChunkTag& want, const ChunkTag& got) {
  return ConstantTimeEqual(want.data(), got.data(), want.size());
}

}  // namespace rlboost
