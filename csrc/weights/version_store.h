// VersionStore: the versions a weight server holds. Published versions are complete;
// versions being pulled by a relay are partial, with a held-chunk bitmap that grows as
// chunks arrive. Every read pins its version, and a version's region is never reused or
// released to its owner while a pin is alive, so a slow reader is never torn. Region
// leases (a same-host puller mapping the region) are revocable: of the retired versions,
// only the newest may stay leased (a pull of it may still be running), and retiring a
// version explicitly revokes its leases at once, so no peer can pin old versions.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "transport/transport.h"
#include "weights/manifest.h"
#include "weights/region.h"

namespace rlboost {

// The longest a Have() waits, whatever a client asks: a long poll holds a server thread.
constexpr uint32_t kMaxHaveWaitMs = 60000;

// A delta payload (weights/delta_publish.h) is held and served beside the full versions,
// under a key of its own: its target version with bit 62 set (full versions stay below).
constexpr int64_t kDeltaKeyBit = int64_t{1} << 62;
inline bool IsDeltaKey(int64_t key) { return key >= 0 && (key & kDeltaKeyBit) != 0; }
inline int64_t DeltaKey(int64_t target) { return target | kDeltaKeyBit; }
inline int64_t DeltaTarget(int64_t key) { return key & ~kDeltaKeyBit; }

// The bytes of one complete version, pinned (never reused or released) while `pin` lives.
struct PayloadLease {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  Manifest manifest;
  std::shared_ptr<void> pin;
};

struct HeldState {
  uint32_t num_chunks = 0;
  uint32_t held_count = 0;
  uint64_t generation = 0;       // bumped by every change of either bitmap
  std::vector<uint8_t> bitmap;   // bit i of byte i/8: chunk i is held
  std::vector<uint8_t> pending;  // chunks the relay's own pull is fetching right now
};

class VersionStore : public ServingBackend {
 public:
  // Committed versions beyond `versions_kept` retire automatically (oldest first), and
  // with each its delta (the delta whose target it is).
  // secret: keys the chunk tags of what this store commits (weights/chunk_tag.h).
  VersionStore(int versions_kept, std::string secret);
  ~VersionStore() override;

  // --- publisher side -----------------------------------------------------------
  // A writable shared region for `version`, reusing an idle retired region of the same
  // size when there is one.
  Status Stage(int64_t version, uint64_t nbytes, std::shared_ptr<Region>* out);
  // Tags the staged bytes' chunks and serves them.
  Status Commit(int64_t version, uint32_t chunk_bytes, std::string meta, int threads, Manifest* out);
  void DiscardStaged(int64_t version);

  // --- relay side -----------------------------------------------------------------
  // Serves chunks of a version as MarkHeld reports them; retired only explicitly.
  // `registration` names this entry, so a pull that outlives it (the version was
  // retired and registered again over other memory) cannot mark the new one.
  // complete: every chunk is held already (a version a relay built itself, from a delta).
  Status AddPartial(const Manifest& m, std::shared_ptr<Region> region, uint64_t* registration,
                    bool complete = false);
  void MarkHeld(int64_t version, uint64_t registration, uint32_t index);
  // Announces (or withdraws) a chunk the relay's pull is fetching, so peers deciding
  // what to ask the trainer for can leave it to this relay.
  void MarkPending(int64_t version, uint64_t registration, uint32_t index, bool pending);

  // Stops serving `version`, revokes its region leases and waits until no chunk read is
  // in flight (kTimeout otherwise).
  Status Retire(int64_t version, Deadline d);
  // Retires `version` only when no read holds it; false (and still served) otherwise.
  // True as well when it is not served at all.
  bool RetireIfIdle(int64_t version);
  // Reads holding each version now, served or retired (only versions with any).
  std::map<int64_t, int> Pins() const;
  // Bytes of every region held: served, retired but still read, staged, and the spare.
  uint64_t HeldBytes() const;
  // Pins a complete version this store committed (served, or retired but not yet reused),
  // for reading its bytes; kUnknownVersion when there is none.
  Status ReadCommitted(int64_t version, PayloadLease* out);
  // Newest full version with every chunk held, or -1.
  int64_t Latest() const;
  std::vector<int64_t> Versions() const;
  Status EncodedManifest(int64_t version, std::string* out) const;  // -1 = latest
  // Held chunks of a version; waits up to wait_ms for a generation newer than `known`
  // (or for the version to appear) before answering, or until stop() says so: it is
  // asked every kStopPollMs and after WakeAll, always outside the store's lock, so it may
  // make a system call (has the client hung up?) without holding up chunk leases. Each
  // change of a version wakes the waiters once; chunk news wakes nobody when nobody waits.
  Status Have(int64_t version, uint64_t known, uint32_t wait_ms, const std::function<bool()>& stop,
              HeldState* out);
  // Wakes Have() waiters so a closing server's threads return promptly.
  void WakeAll();

  ReplyStatus LeaseChunk(int64_t version, uint32_t index, ChunkLease* out) override;
  ReplyStatus LeaseRegion(int64_t version, const std::function<void()>& revoke, RegionLease* out) override;

  // Flips one byte of a served version in place (tests of checksum handling only).
  Status CorruptByteForTests(int64_t version, uint64_t offset);

 private:
  struct Entry;
  struct Sync;
  std::shared_ptr<void> Pin(const std::shared_ptr<Entry>& e, std::function<void()> revoke = nullptr);
  void RevokeLocked(Entry& e);
  void RevokeExcessLocked();
  void RetireLocked(std::map<int64_t, std::shared_ptr<Entry>>::iterator it);
  std::shared_ptr<Region> TakeIdleRegionLocked(uint64_t nbytes);
  void PruneLocked();
  void RetireExcessLocked();
  std::shared_ptr<Entry> FindLocked(int64_t version) const;

  int versions_kept_;
  std::string secret_;
  uint64_t next_registration_ = 0;
  std::shared_ptr<Sync> sync_;
  std::map<int64_t, std::shared_ptr<Entry>> live_;
  std::map<int64_t, std::shared_ptr<Region>> staged_;
  std::vector<std::shared_ptr<Entry>> draining_;
};

}  // namespace rlboost
