// PullJob lanes: claim, submit, complete, verify; reconnect or retire a failing source.
#include "weights/pull_job.h"

#include <algorithm>
#include <chrono>
#include <deque>


namespace rlboost {

struct PullJob::Source {
  std::unique_ptr<SourceSession> session;  // declared first: outlives the transport
  std::mutex mu;  // guards transport (not its use: a connect may take seconds) and error
  std::shared_ptr<Transport> transport;
  bool auto_choice = false;
  std::atomic<uint64_t> generation{0};  // of the relay's held state last seen
  bool pending = false;
  std::atomic<uint64_t> bytes{0}, chunks{0}, not_held{0}, bad{0}, reconnects{0};
  std::string error;
};

struct PullJob::Lane {
  size_t source = 0;
  std::thread thread;
  std::mutex mu;  // guards `stream` against Cancel()
  std::unique_ptr<ChunkStream> stream;
  std::deque<std::pair<ChunkRead, Deadline>> in_flight;
  int failures = 0;
};

namespace {

// Errors that say the source itself is unusable for this version; retrying won't help.
bool Permanent(Code c) {
  return c == Code::kUnknownVersion || c == Code::kProtocol || c == Code::kAuth || c == Code::kIntegrity ||
         c == Code::kInvalidArgument || c == Code::kInternal;
}

constexpr int kMaxBadChunksPerSource = 3;
// How long a complete pull lets its streams finish a connect already begun.
constexpr std::chrono::milliseconds kConnectGrace{500};

}  // namespace

PullJob::PullJob(const PullOptions& opts, Manifest manifest, std::vector<PullSource> sources,
                 uint8_t* dst, RelayTarget relay, const std::vector<uint8_t>& held_seed,
                 ClaimOrder order)
    : opts_(opts),
      manifest_(std::move(manifest)),
      keys_(opts_.secret, manifest_.version),
      dst_(dst),
      relay_(std::move(relay)),
      map_(manifest_.num_chunks(), sources.size(), order.rank, order.pullers, order.seed) {
  map_.OnFinish([this](bool complete) { OnFinished(complete); });
  map_.SeedHeld(held_seed);
  if (relay_.store) {
    for (uint32_t c = 0; c < manifest_.num_chunks() && c / 8 < held_seed.size(); ++c) {
      if ((held_seed[c / 8] >> (c % 8)) & 1u) relay_.store->MarkHeld(manifest_.version, relay_.registration, c);
    }
  }
  for (size_t s = 0; s < sources.size(); ++s) {
    auto src = std::make_unique<Source>();
    src->session = std::move(sources[s].session);
    src->session->set_interrupt(&stop_);
    src->generation = sources[s].held.generation;
    src->pending = sources[s].pending;
    map_.UpdateSource(s, sources[s].held, true);
    sources_.push_back(std::move(src));
  }
}

PullJob::~PullJob() {
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = running_ > 0;
  }
  // A finished job leaves its control connections healthy, to be kept for later pulls.
  if (running) Cancel();
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
  for (auto& w : watchers_) w.join();
  lanes_.clear();
  for (auto& src : sources_) {
    if (src->transport && src->transport->caps().leases_until_disconnect) src->session->Discard();
  }
}

Status PullJob::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return Status(Code::kInvalidArgument, "pull already started");
  for (auto& src : sources_) {
    std::unique_ptr<Transport> transport;
    if (opts_.transport == "auto") {
      src->auto_choice = true;
      transport = ChooseTransport(src->session->peer());
    } else {
      RLB_RETURN_IF_ERROR(MakeTransport(opts_.transport, &transport));
    }
    const std::string name = transport->name();
    src->transport = std::move(transport);
    if (!src->transport->Reaches(src->session->peer())) {
      return Status(Code::kInvalidArgument, "transport '" + name + "' cannot reach source " +
                                                src->session->host() + ":" +
                                                std::to_string(src->session->port()));
    }
  }
  started_ = true;
  // A lane per chunk at most: a small payload needs no idle connections and threads.
  const int lanes = static_cast<int>(std::min<uint32_t>(opts_.streams, std::max(1u, manifest_.num_chunks())));
  for (size_t s = 0; s < sources_.size(); ++s) {
    for (int k = 0; k < lanes; ++k) {
      auto lane = std::make_unique<Lane>();
      lane->source = s;
      lanes_.push_back(std::move(lane));
    }
  }
  running_ = static_cast<int>(lanes_.size());
  for (size_t s = 0; s < sources_.size(); ++s) {
    if (map_.source_may_grow(s)) watchers_.emplace_back([this, s] { RunWatcher(s); });
  }
  for (auto& lane : lanes_) lane->thread = std::thread([this, l = lane.get()] { RunLane(l); });
  return Status::Ok();
}

bool PullJob::Wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) return false;
  auto until = Deadline::After(timeout_s).Min(Deadline::After(1e8)).at();
  for (;;) {
    if (running_ == 0) return true;
    auto wake = until;
    int64_t done_ns = completed_at_ns_.load();
    if (done_ns != 0) {
      auto grace_end = Deadline::Clock::time_point(Deadline::Clock::duration(done_ns)) + kConnectGrace;
      if (Deadline::Clock::now() >= grace_end) stop_.Fire();  // a source that never answers
      wake = std::min(wake, grace_end);
    }
    if (Deadline::Clock::now() >= until) return false;
    cv_.wait_until(lock, std::min(wake, Deadline::Clock::now() + kConnectGrace));
  }
}

Status PullJob::result() const { return map_.result(); }

void PullJob::Cancel() { map_.Cancel(Status(Code::kClosed, "pull cancelled")); }

void PullJob::OnFinished(bool complete) {
  // Nothing a thread of this job still waits for can matter now: end long polls at once,
  // and connects, handshakes and control calls instead of at their deadlines. After a
  // complete pull, streams still connecting get a short grace (see Wait) to finish, so
  // their connections are kept for the next pull.
  polls_stop_.Fire();
  if (complete) {
    completed_at_ns_ = Deadline::Clock::now().time_since_epoch().count();
    return;  // no read is in flight, and idle streams are kept for later pulls
  }
  stop_.Fire();
  // Reads in flight would otherwise wait out their request deadlines.
  for (auto& lane : lanes_) {
    std::lock_guard<std::mutex> lock(lane->mu);
    if (lane->stream) lane->stream->Abort();
  }
}

std::shared_ptr<Transport> PullJob::CurrentTransport(Source& src) {
  std::lock_guard<std::mutex> lock(src.mu);
  return src.transport;
}

Status PullJob::OpenStream(Lane* lane) {
  Source& src = *sources_[lane->source];
  StreamOptions so;
  so.connect_timeout_s = opts_.connect_timeout_s;
  so.region_bytes = manifest_.total_bytes;
  so.pool = opts_.pool.get();
  so.interrupt = &stop_;
  std::unique_ptr<ChunkStream> stream;
  std::shared_ptr<Transport> transport = CurrentTransport(src);
  Status st = transport->OpenStream(*src.session, manifest_.version, so, &stream);
  if (!st.ok() && src.auto_choice && transport->caps().same_host_only && st.code() != Code::kUnknownVersion) {
    // The source cannot share this region (borrowed memory, /proc not reachable, a cap).
    {
      std::lock_guard<std::mutex> lock(src.mu);
      if (src.transport == transport) src.transport = FallbackTransport(*transport);
      transport = src.transport;
    }
    st = transport->OpenStream(*src.session, manifest_.version, so, &stream);
  }
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lane_lock(lane->mu);
  lane->stream = std::move(stream);
  return Status::Ok();
}

void PullJob::ReleaseInFlight(Lane* lane, const Status& cause) {
  for (auto& r : lane->in_flight) {
    AnnouncePending(r.first.index, false);
    map_.Release(r.first.index, cause);
  }
  lane->in_flight.clear();
}

void PullJob::AnnouncePending(uint32_t chunk, bool pending) {
  if (relay_.store) relay_.store->MarkPending(manifest_.version, relay_.registration, chunk, pending);
}

void PullJob::DropStream(Lane* lane) {
  std::unique_ptr<ChunkStream> old;  // closed outside the lock: a transport may linger there
  std::lock_guard<std::mutex> lock(lane->mu);
  old = std::move(lane->stream);
}

void PullJob::FailLane(Lane* lane, const Status& st) {
  Source& src = *sources_[lane->source];
  bool stale = false;
  {
    std::lock_guard<std::mutex> lock(lane->mu);
    stale = lane->stream && lane->stream->stale();
  }
  DropStream(lane);
  // A kept connection the source had closed while idle is not a failure of the source,
  // and nothing that fails once the pull has finished (interrupted) is one either.
  if ((!stale || Permanent(st.code())) && !map_.finished()) {
    bool retire = Permanent(st.code()) || ++lane->failures > opts_.reconnect_attempts;
    if (!retire) ++src.reconnects;
    {
      std::lock_guard<std::mutex> lock(src.mu);
      src.error = st.message();
    }
    if (retire) map_.RetireSource(lane->source, st);
  }
  ReleaseInFlight(lane, st);
}

void PullJob::OnReadDone(Lane* lane, ChunkRead& r) {
  Source& src = *sources_[lane->source];
  const bool intact = r.reply == ReplyStatus::kOk &&
                      TagMatches(manifest_.tags[r.index], keys_.Tag(r.index, r.length, r.digest));
  if (!intact) AnnouncePending(r.index, false);
  if (r.reply == ReplyStatus::kNotHeld) {
    ++src.not_held;
    map_.NotHeld(lane->source, r.index);
    return;
  }
  if (r.reply != ReplyStatus::kOk) {
    Status st = r.reply == ReplyStatus::kUnknownVersion
                    ? Status(Code::kUnknownVersion, "source no longer holds version " +
                                                        std::to_string(manifest_.version))
                : r.reply == ReplyStatus::kBusy
                    ? Status(Code::kTimeout, "source " + src.session->host() + ":" +
                                                 std::to_string(src.session->port()) +
                                                 ": its egress cap cannot send chunk " +
                                                 std::to_string(r.index) + " before the deadline")
                    : Status(Code::kProtocol, "unexpected chunk reply status");
    map_.Release(r.index, st);
    FailLane(lane, st);
    return;
  }
  if (!intact) {
    Status st(Code::kIntegrity, "chunk " + std::to_string(r.index) + " of version " +
                                    std::to_string(manifest_.version) + " from " +
                                    src.session->host() + ":" + std::to_string(src.session->port()) +
                                    " does not match its tag in the manifest (altered on the way or "
                                    "by the source, or the secret differs)");
    map_.Bad(lane->source, r.index, st);
    if (++src.bad >= kMaxBadChunksPerSource) map_.RetireSource(lane->source, st);
    return;
  }
  if (relay_.store) relay_.store->MarkHeld(manifest_.version, relay_.registration, r.index);
  if (map_.Held(r.index)) {
    bytes_done_ += r.length;
    ++fetched_;
    src.bytes += r.length;
    ++src.chunks;
  } else {
    ++refetched_;
  }
}

Status PullJob::CheckPeerLayout(SourceSession& session) {
  Manifest theirs;
  RLB_RETURN_IF_ERROR(session.FetchManifest(manifest_.version, &theirs, Deadline::After(opts_.request_timeout_s)));
  if (!theirs.SameLayout(manifest_)) return Status(Code::kProtocol, "peer's manifest differs from the agreed one");
  return Status::Ok();
}

void PullJob::RunWatcher(size_t s) {
  Source& src = *sources_[s];
  // Long polls get a connection of their own: on the control connection each would hold
  // up the lanes' requests there (a transport's region lease) for up to a poll period.
  std::unique_ptr<SourceSession> poll;
  Status st = SourceSession::Open(src.session->host(), src.session->port(), opts_.session(), opts_.pool,
                                  src.session->peer().server_id, &polls_stop_,
                                  Deadline::After(opts_.connect_timeout_s), &poll);
  const double poll_s = opts_.have_wait_ms / 1000.0;
  bool seen = !src.pending;
  while (st.ok() && !map_.finished() && map_.source_may_grow(s)) {
    HeldState held;
    st = poll->FetchHave(manifest_.version, src.generation, opts_.have_wait_ms, &held,
                         Deadline::After(opts_.request_timeout_s + poll_s));
    if (!seen && st.code() == Code::kUnknownVersion) {  // not started there yet (the source waited)
      st = Status::Ok();
      continue;
    }
    if (st.ok() && !seen) {
      st = CheckPeerLayout(*poll);
      seen = true;
    }
    if (st.ok()) {
      src.generation = held.generation;
      map_.UpdateSource(s, held, true);
    }
  }
  if (st.ok() || map_.finished()) return;  // an interrupted poll closes its connection
  {
    std::lock_guard<std::mutex> lock(src.mu);
    src.error = st.message();
  }
  map_.RetireSource(s, st);
}

void PullJob::IdleWait(uint64_t* epoch) {
  map_.WaitForChange(epoch, Deadline::After(0.25));
  map_.FailIfStalled(opts_.request_timeout_s);
}

void PullJob::RunLane(Lane* lane) {
  uint64_t epoch = 0;
  const size_t s = lane->source;
  while (!map_.finished() && map_.source_alive(s)) {
    if (!lane->stream) {
      // Nothing to ask of a source known to hold nothing (a relay that has not started
      // this version): its watcher's news wakes us, and the pull's end does too.
      if (map_.source_known(s) == 0) {
        IdleWait(&epoch);
        continue;
      }
      Status st = OpenStream(lane);
      if (!st.ok()) {
        FailLane(lane, st);
        continue;
      }
    }
    uint32_t c;
    while (lane->stream && lane->in_flight.size() < static_cast<size_t>(opts_.max_in_flight) &&
           map_.TryClaim(s, &c) == ChunkMap::Claim::kClaimed) {
      ChunkRead r;
      r.version = manifest_.version;
      r.index = c;
      r.offset = manifest_.ChunkOffset(c);
      r.length = manifest_.ChunkLength(c);
      r.dst = dst_ + r.offset;
      r.hash_key = &keys_.hash_key();
      Deadline d = Deadline::After(opts_.request_timeout_s);
      lane->in_flight.emplace_back(r, d);
      AnnouncePending(c, true);
      ++requests_;
      Status st = lane->stream->Submit(r, d);
      if (!st.ok()) FailLane(lane, st);
    }
    if (!lane->stream) continue;
    if (lane->in_flight.empty()) {
      IdleWait(&epoch);
      continue;
    }
    ChunkRead r = lane->in_flight.front().first;
    Status st = lane->stream->Complete(&r, lane->in_flight.front().second);
    if (!st.ok()) {
      FailLane(lane, st);
      continue;
    }
    lane->in_flight.pop_front();
    // A busy reply is a failure of the source, so it must not count as the stream's recovery.
    if (r.reply != ReplyStatus::kBusy) lane->failures = 0;
    OnReadDone(lane, r);
  }
  Status cause = map_.source_cause(s);
  ReleaseInFlight(lane, cause.ok() ? Status(Code::kClosed, "pull stopped") : cause);
  DropStream(lane);
  std::lock_guard<std::mutex> lock(mu_);
  if (--running_ == 0) {
    stop_.Fire();  // watchers too end now, whatever ended the lanes
    polls_stop_.Fire();
    cv_.notify_all();
  }
}

PullStats PullJob::stats() const {
  PullStats out;
  out.chunk_requests = requests_;
  out.chunks_fetched = fetched_;
  out.refetched = refetched_;
  for (auto& src : sources_) {
    SourceStats s;
    s.address = src->session->host() + ":" + std::to_string(src->session->port());
    std::lock_guard<std::mutex> lock(src->mu);
    s.transport = src->transport ? src->transport->name() : "";
    s.bytes = src->bytes;
    s.chunks = src->chunks;
    s.not_held = src->not_held;
    s.integrity_failures = src->bad;
    s.reconnects = src->reconnects;
    s.error = src->error;
    out.sources.push_back(s);
  }
  return out;
}

}  // namespace rlboost
