// Chunk claiming, source knowledge and the "can anyone still serve this?" check.
#include "weights/chunk_map.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

namespace rlboost {

ChunkMap::ChunkMap(uint32_t num_chunks, size_t num_sources, uint32_t rank, uint32_t pullers,
                   uint32_t seed)
    : n_(num_chunks),
      state_(num_chunks, kMissing),
      rarity_(num_chunks, 0),
      soon_(num_chunks, 0),
      claimed_by_(num_chunks, 0),
      inflight_(num_sources, 0),
      known_(num_sources, std::vector<uint8_t>(num_chunks, kUnknown)),
      known_count_(num_sources, 0),
      alive_(num_sources, true),
      may_grow_(num_sources, false),
      cause_(num_sources) {
  if (pullers <= 1) {
    order_.resize(num_chunks);
    std::iota(order_.begin(), order_.end(), 0u);
    std::shuffle(order_.begin(), order_.end(), std::mt19937(seed));
    return;
  }
  for (uint32_t k = 0; k < pullers; ++k) {
    for (uint32_t c = (rank + k) % pullers; c < num_chunks; c += pullers) order_.push_back(c);
  }
}

class ChunkMap::Change {
 public:
  explicit Change(ChunkMap* map) : map_(map), lock_(map->mu_) {}
  ~Change() {
    std::function<void(bool)> report;
    bool complete = false;
    if (map_->finish_due_) {
      map_->finish_due_ = false;
      report = map_->on_finish_;
      complete = map_->held_ == map_->n_;
    }
    lock_.unlock();
    if (report) report(complete);
  }

 private:
  ChunkMap* map_;
  std::unique_lock<std::mutex> lock_;
};

void ChunkMap::BumpLocked() {
  ++epoch_;
  cv_.notify_all();
  if (FinishedLocked() && !finish_reported_ && on_finish_) {
    finish_reported_ = true;
    finish_due_ = true;
  }
}

void ChunkMap::OnFinish(std::function<void(bool)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_finish_ = std::move(fn);
}

void ChunkMap::SeedHeld(const std::vector<uint8_t>& bitmap) {
  Change change(this);
  for (uint32_t c = 0; c < n_ && c / 8 < bitmap.size(); ++c) {
    if (((bitmap[c / 8] >> (c % 8)) & 1u) && state_[c] != kHeldChunk) {
      state_[c] = kHeldChunk;
      ++held_;
    }
  }
  BumpLocked();
}

void ChunkMap::UpdateSource(size_t s, const HeldState& held, bool may_grow) {
  Change change(this);
  if (!alive_[s]) return;
  auto& known = known_[s];
  for (uint32_t c = 0; c < n_ && c < held.num_chunks; ++c) {
    bool has = (held.bitmap[c / 8] >> (c % 8)) & 1u;
    bool soon = !has && c / 8 < held.pending.size() && ((held.pending[c / 8] >> (c % 8)) & 1u);
    if (has && (known[c] == kUnknown || known[c] == kSoon)) {
      if (known[c] == kSoon) --soon_[c];
      known[c] = kHas;
      ++known_count_[s];
      ++rarity_[c];
    } else if (soon && known[c] == kUnknown) {
      known[c] = kSoon;
      ++soon_[c];
    } else if (!soon && known[c] == kSoon) {
      known[c] = kUnknown;
      --soon_[c];
    }
  }
  may_grow_[s] = may_grow && held.held_count < held.num_chunks;
  BumpLocked();
}

ChunkMap::Claim ChunkMap::TryClaim(size_t s, uint32_t* chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FinishedLocked() || !alive_[s]) return Claim::kFinished;
  // TODO(perf): a linear scan per claim; an index of missing chunks per rarity would
  // make this O(1) for pulls of many thousands of chunks.
  const auto& known = known_[s];
  uint32_t best = n_;
  int best_rarity = std::numeric_limits<int>::max();
  for (uint32_t i = 0; i < n_; ++i) {
    uint32_t c = order_[i];
    if (state_[c] != kMissing || known[c] != kHas) continue;
    int rarity = rarity_[c] + soon_[c];
    if (rarity >= best_rarity || (rarity > 1 && BetterElsewhereLocked(s, c))) continue;
    best = c;
    best_rarity = rarity;
    if (best_rarity <= 1) break;
  }
  if (best == n_) return Claim::kNone;
  state_[best] = kInFlight;
  claimed_by_[best] = static_cast<uint32_t>(s);
  ++inflight_[s];
  *chunk = best;
  return Claim::kClaimed;
}

bool ChunkMap::BetterElsewhereLocked(size_t s, uint32_t c) const {
  for (size_t t = 0; t < known_.size(); ++t) {
    if (t == s || !alive_[t] || inflight_[t] >= inflight_[s]) continue;
    if (known_[t][c] == kHas || known_[t][c] == kSoon) return true;
  }
  return false;
}

void ChunkMap::LandLocked(uint32_t c, uint8_t to) {
  if (state_[c] == kInFlight) --inflight_[claimed_by_[c]];
  if (state_[c] != kHeldChunk) state_[c] = to;
}

bool ChunkMap::Held(uint32_t chunk) {
  Change change(this);
  bool fresh = state_[chunk] != kHeldChunk;
  LandLocked(chunk, kHeldChunk);
  if (fresh) {
    ++held_;
    last_progress_ = Deadline::Clock::now();
  }
  BumpLocked();
  return fresh;
}

void ChunkMap::Release(uint32_t chunk, const Status& cause) {
  Change change(this);
  LandLocked(chunk, kMissing);
  CheckServableLocked(cause);
  BumpLocked();
}

void ChunkMap::ForgetLocked(size_t s, uint32_t c, uint8_t to) {
  if (known_[s][c] == kHas) {
    --known_count_[s];
    if (alive_[s]) --rarity_[c];
  }
  if (known_[s][c] == kSoon && alive_[s]) --soon_[c];
  known_[s][c] = to;
}

void ChunkMap::NotHeld(size_t s, uint32_t chunk) {
  Change change(this);
  LandLocked(chunk, kMissing);
  ForgetLocked(s, chunk, kUnknown);
  CheckServableLocked(Status(Code::kUnknownVersion, "no source holds chunk " + std::to_string(chunk)));
  BumpLocked();
}

void ChunkMap::Bad(size_t s, uint32_t chunk, const Status& cause) {
  Change change(this);
  LandLocked(chunk, kMissing);
  ForgetLocked(s, chunk, kExcluded);
  CheckServableLocked(cause);
  BumpLocked();
}

void ChunkMap::RetireSource(size_t s, const Status& cause) {
  Change change(this);
  if (!alive_[s]) return;
  alive_[s] = false;
  cause_[s] = cause;
  last_cause_ = cause;
  for (uint32_t c = 0; c < n_; ++c) {
    if (known_[s][c] == kHas) --rarity_[c];
    if (known_[s][c] == kSoon) --soon_[c];
  }
  CheckServableLocked(cause);
  BumpLocked();
}

void ChunkMap::Cancel(const Status& why) {
  Change change(this);
  if (held_ != n_ && failure_.ok()) failure_ = why;
  BumpLocked();
}

void ChunkMap::CheckServableLocked(const Status& cause) {
  if (FinishedLocked()) return;
  for (uint32_t c = 0; c < n_; ++c) {
    if (state_[c] != kMissing) continue;
    bool servable = false;
    for (size_t s = 0; s < known_.size() && !servable; ++s) {
      uint8_t k = known_[s][c];
      servable = alive_[s] && (k == kHas || (may_grow_[s] && (k == kUnknown || k == kSoon)));
    }
    if (!servable) {
      failure_ = cause;
      return;
    }
  }
}

void ChunkMap::FailIfStalled(double stall_s) {
  Change change(this);
  if (FinishedLocked()) return;
  double idle = std::chrono::duration<double>(Deadline::Clock::now() - last_progress_).count();
  if (idle < stall_s) return;
  std::string why = "no chunk arrived for " + std::to_string(static_cast<int>(idle)) + " s";
  if (!last_cause_.ok()) why += "; last source failure: " + last_cause_.message();
  failure_ = Status(Code::kTimeout, why);
  BumpLocked();
}

void ChunkMap::WaitForChange(uint64_t* epoch, Deadline d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, d.never() ? Deadline::After(1e8).at() : d.at(),
                 [&] { return epoch_ != *epoch || FinishedLocked(); });
  *epoch = epoch_;
}

bool ChunkMap::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return FinishedLocked();
}

Status ChunkMap::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_ == n_) return Status::Ok();
  if (!failure_.ok()) return failure_;
  return Status(Code::kInternal, "pull not finished");
}

bool ChunkMap::source_alive(size_t s) const {
  std::lock_guard<std::mutex> lock(mu_);
  return alive_[s];
}

bool ChunkMap::source_may_grow(size_t s) const {
  std::lock_guard<std::mutex> lock(mu_);
  return alive_[s] && may_grow_[s];
}

uint32_t ChunkMap::source_known(size_t s) const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_count_[s];
}

Status ChunkMap::source_cause(size_t s) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cause_[s];
}

uint32_t ChunkMap::held_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

std::vector<uint8_t> ChunkMap::HeldBitmap() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t> bits((n_ + 7) / 8, 0);
  for (uint32_t c = 0; c < n_; ++c) {
    if (state_[c] == kHeldChunk) bits[c / 8] |= static_cast<uint8_t>(1u << (c % 8));
  }
  return bits;
}

}  // namespace rlboost
