// The chunk map: claims only what a source holds, never a held chunk twice, gives failed
// chunks back, fails a pull nobody can serve, and reports the finish once, outside its
// lock (the callback may read the map).
#include <gtest/gtest.h>

#include "weights/chunk_map.h"

namespace rlboost {
namespace {

HeldState Holding(uint32_t n, std::initializer_list<uint32_t> chunks) {
  HeldState h;
  h.num_chunks = n;
  h.bitmap.assign((n + 7) / 8, 0);
  h.pending.assign((n + 7) / 8, 0);
  for (uint32_t c : chunks) {
    h.bitmap[c / 8] |= static_cast<uint8_t>(1u << (c % 8));
    ++h.held_count;
  }
  return h;
}

TEST(ChunkMap, ClaimsOnlyWhatTheSourceHoldsAndEachChunkOnce) {
  ChunkMap map(4, 1, 0, 1, 1);
  map.UpdateSource(0, Holding(4, {1, 3}), false);
  uint32_t a = 9, b = 9, c = 9;
  ASSERT_EQ(map.TryClaim(0, &a), ChunkMap::Claim::kClaimed);
  ASSERT_EQ(map.TryClaim(0, &b), ChunkMap::Claim::kClaimed);
  EXPECT_EQ(map.TryClaim(0, &c), ChunkMap::Claim::kNone);
  EXPECT_EQ(std::min(a, b), 1u);
  EXPECT_EQ(std::max(a, b), 3u);
}

TEST(ChunkMap, AReleasedChunkIsClaimedAgainAndAHeldOneNever) {
  ChunkMap map(2, 1, 0, 1, 1);
  map.UpdateSource(0, Holding(2, {0, 1}), false);
  uint32_t c;
  ASSERT_EQ(map.TryClaim(0, &c), ChunkMap::Claim::kClaimed);
  map.Release(c, Status(Code::kPeerLost, "lost"));
  uint32_t again;
  ASSERT_EQ(map.TryClaim(0, &again), ChunkMap::Claim::kClaimed);
  EXPECT_TRUE(map.Held(again));
  EXPECT_FALSE(map.Held(again));  // a second arrival is a wasted re-fetch
  EXPECT_EQ(map.held_count(), 1u);
}

TEST(ChunkMap, FinishesOnceOutsideItsLock) {
  ChunkMap map(2, 1, 0, 1, 1);
  int calls = 0;
  bool finished_seen = false;
  map.OnFinish([&](bool complete) {
    ++calls;
    EXPECT_TRUE(complete);
    finished_seen = map.finished();  // would deadlock if called under the map's lock
  });
  map.UpdateSource(0, Holding(2, {0, 1}), false);
  uint32_t c;
  while (map.TryClaim(0, &c) == ChunkMap::Claim::kClaimed) map.Held(c);
  map.Cancel(Status(Code::kClosed, "late"));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(finished_seen);
  EXPECT_TRUE(map.result().ok());
}

TEST(ChunkMap, APullNoSourceCanServeFailsWithTheCause) {
  ChunkMap map(3, 2, 0, 1, 1);
  map.UpdateSource(0, Holding(3, {0, 1}), false);
  map.UpdateSource(1, Holding(3, {2}), false);
  bool failed = false;
  map.OnFinish([&](bool complete) { failed = !complete; });
  map.RetireSource(1, Status(Code::kAuth, "wrong secret"));
  EXPECT_TRUE(failed);
  EXPECT_EQ(map.result().code(), Code::kAuth);
}

TEST(ChunkMap, ABadChunkIsNeverAskedOfThatSourceAgain) {
  ChunkMap map(1, 2, 0, 1, 1);
  map.UpdateSource(0, Holding(1, {0}), false);
  map.UpdateSource(1, Holding(1, {0}), false);
  uint32_t c;
  ASSERT_EQ(map.TryClaim(0, &c), ChunkMap::Claim::kClaimed);
  map.Bad(0, c, Status(Code::kIntegrity, "altered"));
  EXPECT_EQ(map.TryClaim(0, &c), ChunkMap::Claim::kNone);
  EXPECT_EQ(map.TryClaim(1, &c), ChunkMap::Claim::kClaimed);
}

}  // namespace
}  // namespace rlboost
