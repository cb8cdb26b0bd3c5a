// PullJob: one version pulled into one destination. Each source gets `streams` lanes
// (threads; no more than there are chunks); a lane keeps up to `max_in_flight` chunk reads
// outstanding on its stream, verifies each chunk against its tag in the manifest
// (weights/chunk_tag.h: a source that alters bytes is caught), and reports held chunks to the
// relay store so this process can re-serve them while it is still pulling. A lane that
// loses its source reconnects a bounded number of times; chunks it had in flight go
// back to the map and are fetched from any source that holds them. A lane opens no
// stream while its source is known to hold nothing, and when the pull finishes every
// connect, handshake, control call and long poll its threads still block on is ended.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.h"
#include "weights/chunk_map.h"
#include "weights/chunk_tag.h"
#include "weights/manifest.h"
#include "weights/session.h"
#include "weights/version_store.h"

namespace rlboost {

struct PullOptions {
  std::string secret;
  EncryptPolicy encrypt = EncryptPolicy::kAuto;
  uint64_t max_version_bytes = kDefaultMaxVersionBytes;
  std::string transport = "auto";  // auto | tcp | shm | ucx
  int streams = 4;
  int max_in_flight = 2;
  double request_timeout_s = 60.0;
  double connect_timeout_s = 10.0;
  int reconnect_attempts = 2;
  uint32_t have_wait_ms = 500;  // long poll of a relay's held chunks (kMaxHaveWaitMs at most)
  // Connections kept between pulls (null: every pull connects anew).
  std::shared_ptr<ConnectionPool> pool;

  SessionOptions session() const { return SessionOptions{secret, encrypt, max_version_bytes}; }
};

// One source, resolved for the version being pulled. A source still pulling the version
// itself (a relay) gets a watcher thread that long-polls its held chunks on a connection
// of its own, so lanes of every source claim with fresh knowledge of what the peers hold
// and never queue behind a poll.
struct PullSource {
  std::unique_ptr<SourceSession> session;
  HeldState held;
  bool pending = false;  // reachable, but did not hold the version when resolved
};

struct SourceStats {
  std::string address;
  std::string transport;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  uint64_t not_held = 0;
  uint64_t integrity_failures = 0;  // chunks whose bytes did not match their tag
  uint64_t reconnects = 0;
  std::string error;
};

// Where a pull reports the chunks it holds, so its process can re-serve them.
struct RelayTarget {
  std::shared_ptr<VersionStore> store;  // null: no relay
  uint64_t registration = 0;            // from VersionStore::AddPartial
};

// The order in which a puller claims chunks (see ChunkMap).
struct ClaimOrder {
  uint32_t rank = 0;
  uint32_t pullers = 1;
  uint32_t seed = 0;
};

struct PullStats {
  uint64_t chunk_requests = 0;
  uint64_t chunks_fetched = 0;
  uint64_t refetched = 0;  // chunks received again although already held
  std::vector<SourceStats> sources;
};

// Lock order: a lane's mutex, a source's mutex, the job's mutex and the chunk map's lock
// are never held together, so none can wait on another. The map reports a finish
// (OnFinished) with its lock released, and OnFinished takes each lane's mutex in turn.
class PullJob {
 public:
  PullJob(const PullOptions& opts, Manifest manifest, std::vector<PullSource> sources, uint8_t* dst,
          RelayTarget relay, const std::vector<uint8_t>& held_seed, ClaimOrder order);
  ~PullJob();

  Status Start();
  // True once every lane has exited (then result() is final).
  bool Wait(double timeout_s);
  Status result() const;
  void Cancel();

  uint64_t bytes_done() const { return bytes_done_; }
  const Manifest& manifest() const { return manifest_; }
  PullStats stats() const;
  std::vector<uint8_t> HeldBitmap() const { return map_.HeldBitmap(); }

 private:
  struct Source;
  struct Lane;
  void RunLane(Lane* lane);
  Status OpenStream(Lane* lane);
  static std::shared_ptr<Transport> CurrentTransport(Source& src);
  void RunWatcher(size_t s);
  Status CheckPeerLayout(SourceSession& session);
  void IdleWait(uint64_t* epoch);
  void OnFinished(bool complete);
  void DropStream(Lane* lane);
  void FailLane(Lane* lane, const Status& st);
  void OnReadDone(Lane* lane, ChunkRead& read);
  void ReleaseInFlight(Lane* lane, const Status& cause);
  void AnnouncePending(uint32_t chunk, bool pending);

  PullOptions opts_;
  Manifest manifest_;
  const ChunkKeys keys_;
  uint8_t* dst_;
  RelayTarget relay_;
  // Fired when the pull fails or is cancelled (or a grace after it completed): ends
  // whatever its threads still block on. polls_stop_ ends the watchers' long polls as
  // soon as the pull finishes in any way.
  Interrupt stop_;
  Interrupt polls_stop_;
  std::atomic<int64_t> completed_at_ns_{0};  // steady clock; 0 while not complete
  ChunkMap map_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<std::thread> watchers_;
  std::atomic<uint64_t> bytes_done_{0}, requests_{0}, fetched_{0}, refetched_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
  bool started_ = false;
};

}  // namespace rlboost
