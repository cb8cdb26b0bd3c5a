// Version-store pins and leases: a read pins its version through retirement, a region
// lease is revoked when its version retires, and a long poll wakes on a change and is
// woken by WakeAll.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "weights/version_store.h"

namespace rlboost {
namespace {

const std::string kSecret = "store-secret";
constexpr uint32_t kChunk = 4096;

void Publish(VersionStore& store, int64_t version, uint64_t nbytes) {
  std::shared_ptr<Region> region;
  ASSERT_TRUE(store.Stage(version, nbytes, &region).ok());
  std::memset(region->data(), static_cast<int>(version), nbytes);
  Manifest m;
  ASSERT_TRUE(store.Commit(version, kChunk, "", 1, &m).ok());
}

TEST(VersionStore, AChunkLeasePinsItsVersionUntilReleased) {
  VersionStore store(1, kSecret);
  Publish(store, 1, 4 * kChunk);
  ChunkLease lease;
  ASSERT_EQ(store.LeaseChunk(1, 2, &lease), ReplyStatus::kOk);
  EXPECT_EQ(lease.length, kChunk);
  EXPECT_EQ(store.Pins().at(1), 1);
  EXPECT_FALSE(store.RetireIfIdle(1));
  EXPECT_EQ(store.Retire(1, Deadline::After(0.05)).code(), Code::kTimeout);
  EXPECT_EQ(lease.data[0], 1);  // still readable: never freed under a pin
  lease.pin.reset();
  EXPECT_TRUE(store.Retire(1, Deadline::After(5)).ok());
  EXPECT_TRUE(store.Pins().empty());
}

TEST(VersionStore, UnknownAndUnheldChunksAreSaidSo) {
  VersionStore store(1, kSecret);
  Publish(store, 1, kChunk);
  ChunkLease lease;
  EXPECT_EQ(store.LeaseChunk(2, 0, &lease), ReplyStatus::kUnknownVersion);
  EXPECT_EQ(store.LeaseChunk(1, 5, &lease), ReplyStatus::kNotHeld);
  EXPECT_EQ(store.LeaseChunk(-1, 0, &lease), ReplyStatus::kUnknownVersion);
}

TEST(VersionStore, RetiringAVersionRevokesItsRegionLeases) {
  VersionStore store(2, kSecret);
  Publish(store, 1, kChunk);
  std::atomic<int> revoked{0};
  RegionLease lease;
  ASSERT_EQ(store.LeaseRegion(1, [&] { ++revoked; }, &lease), ReplyStatus::kOk);
  std::thread releaser([&] {
    while (revoked == 0) std::this_thread::yield();
    lease.pin.reset();  // what the revoked connection's end does
  });
  EXPECT_TRUE(store.Retire(1, Deadline::After(10)).ok());
  releaser.join();
  EXPECT_EQ(revoked.load(), 1);
}

TEST(VersionStore, ALongPollWakesWhenARelayMarksAChunk) {
  VersionStore store(1, kSecret);
  Manifest m;
  m.version = 3;
  m.total_bytes = 2 * kChunk;
  m.chunk_bytes = kChunk;
  m.tags.resize(2);
  std::shared_ptr<Region> region;
  ASSERT_TRUE(Region::CreateShared(m.total_bytes, &region).ok());
  uint64_t registration = 0;
  ASSERT_TRUE(store.AddPartial(m, region, &registration).ok());
  HeldState first;
  ASSERT_TRUE(store.Have(3, 0, 0, [] { return false; }, &first).ok());
  std::thread marker([&] { store.MarkHeld(3, registration, 1); });
  HeldState after;
  ASSERT_TRUE(store.Have(3, first.generation, 30000, [] { return false; }, &after).ok());
  marker.join();
  EXPECT_GT(after.generation, first.generation);
  EXPECT_EQ(after.held_count, 1u);
}

TEST(VersionStore, ALongPollEndsWhenItsStopSaysSo) {
  VersionStore store(1, kSecret);
  std::atomic<bool> stop{false};
  std::thread stopper([&] { stop = true; store.WakeAll(); });
  HeldState out;
  Status st = store.Have(9, 0, 60000, [&] { return stop.load(); }, &out);
  stopper.join();
  EXPECT_EQ(st.code(), Code::kUnknownVersion);
}

}  // namespace
}  // namespace rlboost
