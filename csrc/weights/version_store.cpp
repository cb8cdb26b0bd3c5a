// Version bookkeeping, pins and region reuse.
#include "weights/version_store.h"

#include <algorithm>

namespace rlboost {

struct VersionStore::Sync {
  mutable std::mutex mu;
  std::condition_variable cv;
  // Called under mu when the last pin of a retired version goes, so its memory is freed
  // then rather than at the next publish; cleared when the store goes.
  std::function<void()> on_unpinned;
  int have_waiters = 0;       // Have() calls waiting on cv: chunk news wakes nobody without them
  uint64_t wake_all = 0;      // bumped by WakeAll: waiters then ask their stop() at once
};

struct VersionStore::Entry {
  Manifest manifest;
  std::string encoded;
  std::shared_ptr<Region> region;
  HeldState held;
  bool partial = false;  // registered by a relay: retired only explicitly
  uint64_t registration = 0;
  int pins = 0;
  bool retired = false;
  uint64_t next_lease = 0;
  std::map<uint64_t, std::function<void()>> revokers;  // live region leases
  bool complete() const { return held.held_count == held.num_chunks; }
};

namespace {

constexpr int kStopPollMs = 250;

HeldState AllHeld(uint32_t n) {
  HeldState h;
  h.num_chunks = n;
  h.held_count = n;
  h.bitmap.assign((n + 7) / 8, 0xFF);
  h.pending.assign((n + 7) / 8, 0);
  return h;
}

bool IsHeld(const HeldState& h, uint32_t i) { return (h.bitmap[i / 8] >> (i % 8)) & 1u; }

}  // namespace

VersionStore::VersionStore(int versions_kept, std::string secret)
    : versions_kept_(std::max(1, versions_kept)), secret_(std::move(secret)), sync_(std::make_shared<Sync>()) {
  sync_->on_unpinned = [this] { PruneLocked(); };
}

VersionStore::~VersionStore() {
  std::lock_guard<std::mutex> lock(sync_->mu);
  sync_->on_unpinned = nullptr;
  sync_->cv.notify_all();
}

std::shared_ptr<void> VersionStore::Pin(const std::shared_ptr<Entry>& e, std::function<void()> revoke) {
  ++e->pins;
  uint64_t lease = 0;
  if (revoke) {
    lease = ++e->next_lease;
    e->revokers.emplace(lease, std::move(revoke));
  }
  std::shared_ptr<Sync> sync = sync_;
  return std::shared_ptr<void>(e.get(), [sync, e, lease](void*) {
    std::lock_guard<std::mutex> lock(sync->mu);
    --e->pins;
    if (lease != 0) e->revokers.erase(lease);
    if (e->pins == 0 && e->retired) {
      if (sync->on_unpinned) sync->on_unpinned();
      // Only Retire() waits on a pin count (for a retired version's to reach 0): a chunk's
      // lease ending wakes no one else (every long-poll waiter would wake for nothing).
      sync->cv.notify_all();
    }
  });
}

void VersionStore::RevokeLocked(Entry& e) {
  // The callbacks end connections (a shutdown, which does not block); each releases its
  // lease, and erases its revoker, from its own thread.
  for (auto& kv : e.revokers) kv.second();
}

void VersionStore::RevokeExcessLocked() {
  // draining_ is in retirement order: only the newest leased one keeps its leases.
  bool kept = false;
  for (auto it = draining_.rbegin(); it != draining_.rend(); ++it) {
    if ((*it)->revokers.empty()) continue;
    if (kept) RevokeLocked(**it);
    kept = true;
  }
}

std::shared_ptr<VersionStore::Entry> VersionStore::FindLocked(int64_t version) const {
  if (version < 0) {
    for (auto it = live_.rbegin(); it != live_.rend(); ++it) {
      if (it->second->complete() && !IsDeltaKey(it->first)) return it->second;
    }
    return nullptr;
  }
  auto it = live_.find(version);
  return it == live_.end() ? nullptr : it->second;
}

std::shared_ptr<Region> VersionStore::TakeIdleRegionLocked(uint64_t nbytes) {
  for (auto it = draining_.begin(); it != draining_.end(); ++it) {
    auto& e = *it;
    if (e->pins == 0 && e->region->owned() && e->region->size() == nbytes) {
      std::shared_ptr<Region> found = e->region;
      draining_.erase(it);
      return found;
    }
  }
  return nullptr;
}

void VersionStore::PruneLocked() {
  // Idle retired regions are released, except the newest owned published one, kept as a
  // spare for the next Stage() (fresh memory costs a page fault per 4 KiB on first write).
  // A relay's regions belong to its pulls, which never stage: nothing is kept for them.
  // A region still read counts as the spare: at most versions_kept + 1 stay held.
  // Deltas (small, of every size) are never the spare.
  std::vector<std::shared_ptr<Entry>> kept;
  auto full = [](const std::shared_ptr<Entry>& e) { return !IsDeltaKey(e->manifest.version); };
  bool spare_kept = std::any_of(draining_.begin(), draining_.end(),
                                [&](const auto& e) { return e->pins > 0 && full(e); });
  for (auto it = draining_.rbegin(); it != draining_.rend(); ++it) {
    const auto& e = *it;
    if (e->pins > 0) {
      kept.push_back(e);
    } else if (e->region->owned() && !e->partial && full(e) && !spare_kept) {
      kept.push_back(e);
      spare_kept = true;
    }
  }
  std::reverse(kept.begin(), kept.end());
  draining_.swap(kept);
}

Status VersionStore::Stage(int64_t version, uint64_t nbytes, std::shared_ptr<Region>* out) {
  if (version < 0) return Status(Code::kInvalidArgument, "version must be >= 0");
  std::shared_ptr<Region> region;
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    if (live_.count(version) || staged_.count(version)) {
      return Status(Code::kInvalidArgument, "version " + std::to_string(version) + " already exists");
    }
    region = TakeIdleRegionLocked(nbytes);
  }
  if (region == nullptr) RLB_RETURN_IF_ERROR(Region::CreateShared(nbytes, &region));
  std::lock_guard<std::mutex> lock(sync_->mu);
  staged_[version] = region;
  *out = region;
  return Status::Ok();
}

Status VersionStore::Commit(int64_t version, uint32_t chunk_bytes, std::string meta, int threads,
                            Manifest* out) {
  std::shared_ptr<Region> region;
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    auto it = staged_.find(version);
    if (it == staged_.end()) {
      return Status(Code::kInvalidArgument, "version " + std::to_string(version) + " was not staged");
    }
    region = it->second;
  }
  auto e = std::make_shared<Entry>();
  e->manifest.version = version;
  e->manifest.total_bytes = region->size();
  e->manifest.chunk_bytes = chunk_bytes;
  e->manifest.meta = std::move(meta);
  uint32_t n;
  RLB_RETURN_IF_ERROR(ChunkCount(region->size(), chunk_bytes, &n));
  e->manifest.tags.resize(n);
  ComputeChunkTags(region->data(), secret_, threads, &e->manifest);
  e->encoded = EncodeManifest(e->manifest);
  e->region = region;
  e->held = AllHeld(n);
  std::lock_guard<std::mutex> lock(sync_->mu);
  staged_.erase(version);
  live_[version] = e;
  sync_->cv.notify_all();
  RetireExcessLocked();
  *out = e->manifest;
  return Status::Ok();
}

void VersionStore::RetireExcessLocked() {
  std::vector<int64_t> committed;
  for (auto& kv : live_) {
    if (!kv.second->partial && !IsDeltaKey(kv.first)) committed.push_back(kv.first);
  }
  for (size_t i = 0; i + versions_kept_ < committed.size(); ++i) RetireLocked(live_.find(committed[i]));
  // A delta goes with its target: nobody pulls a delta into a version no longer served.
  std::vector<int64_t> orphans;
  for (auto& kv : live_) {
    if (!kv.second->partial && IsDeltaKey(kv.first) && live_.count(DeltaTarget(kv.first)) == 0) {
      orphans.push_back(kv.first);
    }
  }
  for (int64_t key : orphans) RetireLocked(live_.find(key));
}

Status VersionStore::ReadCommitted(int64_t version, PayloadLease* out) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  std::shared_ptr<Entry> e;
  auto it = live_.find(version);
  if (it != live_.end()) e = it->second;
  for (auto& d : draining_) {
    // Retired entries keep their bytes until their region is taken for a new version.
    if (e == nullptr && d->manifest.version == version) e = d;
  }
  if (e == nullptr || e->partial || !e->complete()) {
    return Status(Code::kUnknownVersion, "version " + std::to_string(version) + " is not held here");
  }
  out->data = e->region->data();
  out->size = e->manifest.total_bytes;
  out->manifest = e->manifest;
  out->pin = Pin(e);
  return Status::Ok();
}

void VersionStore::DiscardStaged(int64_t version) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  staged_.erase(version);
}

Status VersionStore::AddPartial(const Manifest& m, std::shared_ptr<Region> region,
                                uint64_t* registration, bool complete) {
  if (region->size() < m.total_bytes) return Status(Code::kInvalidArgument, "region smaller than the manifest");
  auto e = std::make_shared<Entry>();
  e->manifest = m;
  e->encoded = EncodeManifest(m);
  e->region = std::move(region);
  e->partial = true;
  if (complete) {
    e->held = AllHeld(m.num_chunks());
  } else {
    e->held.num_chunks = m.num_chunks();
    e->held.bitmap.assign((m.num_chunks() + 7) / 8, 0);
    e->held.pending.assign((m.num_chunks() + 7) / 8, 0);
  }
  std::lock_guard<std::mutex> lock(sync_->mu);
  if (live_.count(m.version)) {
    return Status(Code::kInvalidArgument, "version " + std::to_string(m.version) + " is already served");
  }
  e->registration = ++next_registration_;
  *registration = e->registration;
  live_[m.version] = e;
  sync_->cv.notify_all();
  return Status::Ok();
}

void VersionStore::MarkHeld(int64_t version, uint64_t registration, uint32_t index) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(version);
  if (e == nullptr || e->registration != registration || index >= e->held.num_chunks ||
      IsHeld(e->held, index)) {
    return;
  }
  e->held.bitmap[index / 8] |= static_cast<uint8_t>(1u << (index % 8));
  e->held.pending[index / 8] &= static_cast<uint8_t>(~(1u << (index % 8)));
  ++e->held.held_count;
  ++e->held.generation;
  if (sync_->have_waiters > 0) sync_->cv.notify_all();
}

void VersionStore::MarkPending(int64_t version, uint64_t registration, uint32_t index, bool pending) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(version);
  if (e == nullptr || e->registration != registration || index >= e->held.num_chunks ||
      IsHeld(e->held, index)) {
    return;
  }
  uint8_t bit = static_cast<uint8_t>(1u << (index % 8));
  uint8_t& byte = e->held.pending[index / 8];
  if (((byte & bit) != 0) == pending) return;
  byte = pending ? (byte | bit) : (byte & ~bit);
  ++e->held.generation;
  if (sync_->have_waiters > 0) sync_->cv.notify_all();
}

void VersionStore::RetireLocked(std::map<int64_t, std::shared_ptr<Entry>>::iterator it) {
  it->second->retired = true;
  draining_.push_back(it->second);
  live_.erase(it);
  RevokeExcessLocked();
  PruneLocked();
  sync_->cv.notify_all();
}

Status VersionStore::Retire(int64_t version, Deadline d) {
  std::unique_lock<std::mutex> lock(sync_->mu);
  std::shared_ptr<Entry> e;
  auto it = live_.find(version);
  if (it != live_.end()) {
    e = it->second;
    RetireLocked(it);
  } else {
    for (auto& x : draining_) {
      if (x->manifest.version == version) e = x;
    }
    if (e == nullptr) return Status::Ok();
  }
  RevokeLocked(*e);  // a lease may last as long as its connection: never wait for one
  bool idle = sync_->cv.wait_until(lock, d.never() ? Deadline::After(1e8).at() : d.at(),
                                   [&] { return e->pins == 0; });
  if (!idle) return Status(Code::kTimeout, "reads of version " + std::to_string(version) + " still in flight");
  PruneLocked();
  return Status::Ok();
}

bool VersionStore::RetireIfIdle(int64_t version) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto it = live_.find(version);
  if (it == live_.end()) return true;
  if (it->second->pins > 0) return false;
  RetireLocked(it);
  return true;
}

std::map<int64_t, int> VersionStore::Pins() const {
  std::lock_guard<std::mutex> lock(sync_->mu);
  std::map<int64_t, int> out;
  for (auto& kv : live_) {
    if (kv.second->pins > 0) out[kv.first] += kv.second->pins;
  }
  for (auto& e : draining_) {
    if (e->pins > 0) out[e->manifest.version] += e->pins;
  }
  return out;
}

uint64_t VersionStore::HeldBytes() const {
  std::lock_guard<std::mutex> lock(sync_->mu);
  std::vector<const Region*> seen;
  uint64_t total = 0;
  auto add = [&](const std::shared_ptr<Region>& r) {
    if (r == nullptr || std::find(seen.begin(), seen.end(), r.get()) != seen.end()) return;
    seen.push_back(r.get());
    total += r->size();
  };
  for (auto& kv : live_) add(kv.second->region);
  for (auto& e : draining_) add(e->region);
  for (auto& kv : staged_) add(kv.second);
  return total;
}

int64_t VersionStore::Latest() const {
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(-1);
  return e == nullptr ? -1 : e->manifest.version;
}

std::vector<int64_t> VersionStore::Versions() const {
  std::lock_guard<std::mutex> lock(sync_->mu);
  std::vector<int64_t> out;
  for (auto& kv : live_) out.push_back(kv.first);
  return out;
}

Status VersionStore::EncodedManifest(int64_t version, std::string* out) const {
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(version);
  if (e == nullptr) {
    return Status(Code::kUnknownVersion, version < 0 ? std::string("no version published yet")
                                                     : "version " + std::to_string(version) + " is not held here");
  }
  *out = e->encoded;
  return Status::Ok();
}

Status VersionStore::Have(int64_t version, uint64_t known, uint32_t wait_ms,
                          const std::function<bool()>& stop, HeldState* out) {
  std::unique_lock<std::mutex> lock(sync_->mu);
  const auto until = Deadline::After(std::min(wait_ms, kMaxHaveWaitMs) / 1000.0).at();
  std::shared_ptr<Entry> e;
  auto ready = [&] {
    e = FindLocked(version);
    // A version not (yet) held is waited for too: a peer may register it any moment.
    return e != nullptr && (e->held.generation > known || e->complete());
  };
  ++sync_->have_waiters;
  uint64_t wake_all = sync_->wake_all;
  while (!ready()) {
    const auto slice = std::min(until, Deadline::After(kStopPollMs / 1000.0).at());
    const bool timed_out = sync_->cv.wait_until(lock, slice) == std::cv_status::timeout;
    if (ready() || Deadline::Clock::now() >= until) break;
    if (!timed_out && wake_all == sync_->wake_all) continue;  // another version's news
    wake_all = sync_->wake_all;
    // stop() may make a system call (has the client hung up?): never under the store's
    // lock, which every chunk lease takes.
    lock.unlock();
    const bool stopped = stop();
    lock.lock();
    if (stopped) break;
  }
  --sync_->have_waiters;
  ready();
  if (e == nullptr) return Status(Code::kUnknownVersion, "version " + std::to_string(version) + " is not held here");
  *out = e->held;
  return Status::Ok();
}

void VersionStore::WakeAll() {
  std::lock_guard<std::mutex> lock(sync_->mu);
  ++sync_->wake_all;
  sync_->cv.notify_all();
}

ReplyStatus VersionStore::LeaseChunk(int64_t version, uint32_t index, ChunkLease* out) {
  out->pin.reset();  // an old pin's release takes the lock below
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(version);
  if (e == nullptr || version < 0) return ReplyStatus::kUnknownVersion;
  if (index >= e->held.num_chunks || !IsHeld(e->held, index)) return ReplyStatus::kNotHeld;
  out->data = e->region->data() + e->manifest.ChunkOffset(index);
  out->length = e->manifest.ChunkLength(index);
  out->pin = Pin(e);
  return ReplyStatus::kOk;
}

ReplyStatus VersionStore::LeaseRegion(int64_t version, const std::function<void()>& revoke, RegionLease* out) {
  out->pin.reset();
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(version);
  if (e == nullptr || version < 0) return ReplyStatus::kUnknownVersion;
  out->data = e->region->data();
  out->size = e->manifest.total_bytes;
  out->fd = e->region->fd();
  out->pin = Pin(e, revoke);
  return ReplyStatus::kOk;
}

Status VersionStore::CorruptByteForTests(int64_t version, uint64_t offset) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  auto e = FindLocked(version);
  if (e == nullptr) return Status(Code::kUnknownVersion, "no such version");
  if (offset >= e->manifest.total_bytes) return Status(Code::kInvalidArgument, "offset out of range");
  e->region->data()[offset] ^= 0xFF;
  return Status::Ok();
}

}  // namespace rlboost
