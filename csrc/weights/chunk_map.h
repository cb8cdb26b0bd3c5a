// ChunkMap: which chunks of one pull are missing, in flight or held, and what each source
// is known to hold or to be fetching. A lane claims, from the chunks its source holds:
//  - none that a less busy source (fewer of our requests outstanding) holds or is about
//    to hold: that source has spare bandwidth, so it serves them;
//  - of the rest, the rarest (holders + fetchers), so the trainer spends its egress on
//    chunks no peer has or will soon have;
//  - ties in a claim order in which pullers that know each other start on disjoint
//    chunks (puller r of P first takes the chunks c with c % P == r).
// A held chunk is never requested again; a failed one goes back to missing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "weights/version_store.h"

namespace rlboost {

class ChunkMap {
 public:
  enum class Claim { kClaimed, kNone, kFinished };

  // rank/pullers: this puller's place among the pullers it shares relays with (rank 0 of
  // 1 when alone: then the order is a random permutation from seed).
  ChunkMap(uint32_t num_chunks, size_t num_sources, uint32_t rank, uint32_t pullers, uint32_t seed);

  // Called once, when the pull first finishes (complete: every chunk held; else failed or
  // cancelled), by the thread whose change finished it, after the map's lock is released:
  // it may read the map and take its own locks (no lock of the map is held around it).
  void OnFinish(std::function<void(bool complete)> fn);
  // Marks chunks held before the pull started (resuming an earlier attempt).
  void SeedHeld(const std::vector<uint8_t>& bitmap);
  // What source s holds now; may_grow: it is still pulling and may hold more later.
  void UpdateSource(size_t s, const HeldState& held, bool may_grow);
  Claim TryClaim(size_t s, uint32_t* chunk);
  // A verified chunk; false when it was already held (a wasted re-fetch).
  bool Held(uint32_t chunk);
  // An in-flight chunk whose source failed goes back to missing.
  void Release(uint32_t chunk, const Status& cause);
  void NotHeld(size_t s, uint32_t chunk);
  // A chunk that failed its checksum: never asked of that source again.
  void Bad(size_t s, uint32_t chunk, const Status& cause);
  void RetireSource(size_t s, const Status& cause);
  void Cancel(const Status& why);

  // Fails the pull when no chunk arrived for stall_s seconds although chunks are missing
  // (e.g. only peers are left and they wait on each other).
  void FailIfStalled(double stall_s);
  // Blocks until anything changes after *epoch (or the deadline); updates *epoch.
  void WaitForChange(uint64_t* epoch, Deadline d);
  bool finished() const;
  Status result() const;  // OK once every chunk is held
  bool source_alive(size_t s) const;
  bool source_may_grow(size_t s) const;
  uint32_t source_known(size_t s) const;
  Status source_cause(size_t s) const;  // why a retired source was retired
  uint32_t held_count() const;
  std::vector<uint8_t> HeldBitmap() const;

 private:
  enum : uint8_t { kMissing = 0, kInFlight = 1, kHeldChunk = 2 };
  enum : uint8_t { kUnknown = 0, kHas = 1, kExcluded = 2, kSoon = 3 };
  bool FinishedLocked() const { return held_ == n_ || !failure_.ok(); }
  void CheckServableLocked(const Status& cause);
  void ForgetLocked(size_t s, uint32_t c, uint8_t to);
  bool BetterElsewhereLocked(size_t s, uint32_t c) const;
  void LandLocked(uint32_t c, uint8_t to);  // an in-flight chunk leaves flight
  void BumpLocked();
  // Holds the map's lock for one change; on leaving, unlocks and then reports a finish
  // that change caused.
  class Change;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint32_t n_;
  std::vector<uint32_t> order_;  // claim order: a random permutation
  std::vector<uint8_t> state_;
  std::vector<uint16_t> rarity_;  // alive sources known to hold each chunk
  std::vector<uint16_t> soon_;    // alive sources known to be fetching it
  std::vector<uint32_t> claimed_by_;  // source of each in-flight chunk
  std::vector<uint32_t> inflight_;    // our outstanding requests per source
  std::vector<std::vector<uint8_t>> known_;
  std::vector<uint32_t> known_count_;
  std::vector<bool> alive_, may_grow_;
  std::vector<Status> cause_;
  uint32_t held_ = 0;
  uint64_t epoch_ = 0;
  std::function<void(bool)> on_finish_;
  bool finish_reported_ = false;
  bool finish_due_ = false;  // reached under the lock, reported once it is released
  Status failure_;
  Status last_cause_;
  Deadline::Clock::time_point last_progress_ = Deadline::Clock::now();
};

}  // namespace rlboost
