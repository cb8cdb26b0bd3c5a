// Connection states and the choice of whom to close for a newcomer.
#include "weights/server_conn.h"

#include <functional>

namespace rlboost {
namespace {

int64_t NowNs() { return Deadline::Clock::now().time_since_epoch().count(); }

bool Open(const ServerConn& c) { return !c.done && !c.evicted && c.current() != ConnState::kClosing; }

// Lower is closed first; -1: not to be closed. A busy connection that has not stalled
// long goes only when nothing else can (the one stalled longest): peers that keep
// reconnecting to hold every slot with fresh stalls cannot keep a newcomer out, and an
// honest connection, whose frames take milliseconds, is the youngest there. The same holds
// for one that has just gone idle: an honest puller is idle for a moment between its
// requests (after its login, between chunk batches), and ranking it below a stall only
// half a second old let a swarm of such stalls close it mid-pull on a loaded host.
int Rank(const ServerConn& c, double min_stall_s) {
  const bool settled = c.InStateFor() >= min_stall_s;
  switch (c.current()) {
    case ConnState::kBusy: return settled ? 0 : 3;
    case ConnState::kIdle: return settled ? 1 : 3;
    case ConnState::kWaiting: return 2;
    default: return -1;
  }
}

ServerConn* PickVictimLocked(ConnList& conns, const std::function<bool(const ServerConn&)>& in_group,
                             double min_stall_s) {
  ServerConn* best = nullptr;
  int best_rank = 0;
  for (auto& c : conns) {
    if (!c->authenticated || !Open(*c) || !in_group(*c)) continue;
    int r = Rank(*c, min_stall_s);
    if (r < 0) continue;
    // Same rank: the one in its state longest (since_ns smallest).
    if (best == nullptr || r < best_rank || (r == best_rank && c->since_ns < best->since_ns)) {
      best = c.get();
      best_rank = r;
    }
  }
  return best;
}

// Closes one connection of the group; false when none may go.
bool EvictOneLocked(ConnList& conns, const std::function<bool(const ServerConn&)>& in_group,
                    double min_stall_s, AdmissionCounts* counts) {
  for (;;) {
    ServerConn* v = PickVictimLocked(conns, in_group, min_stall_s);
    if (v == nullptr) return false;
    ConnState was = v->current();
    // An idle one may have just woken for a request: then it is busy and keeps serving.
    if (was == ConnState::kIdle && !v->LeaveIdle(ConnState::kClosing)) continue;
    v->Evict();
    ++(was == ConnState::kBusy ? counts->evicted_stalled : counts->evicted_idle);  // busy: stalled longest
    return true;
  }
}

}  // namespace

double ServerConn::InStateFor() const { return (NowNs() - since_ns.load()) / 1e9; }

void ServerConn::Enter(ConnState s) {
  since_ns = NowNs();
  state = static_cast<int>(s);
}

bool ServerConn::LeaveIdle(ConnState to) {
  int expected = static_cast<int>(ConnState::kIdle);
  if (!state.compare_exchange_strong(expected, static_cast<int>(to))) return false;
  since_ns = NowNs();
  return true;
}

void ServerConn::Evict() {
  evicted = true;
  state = static_cast<int>(ConnState::kClosing);
  socket.Shutdown();
}

bool AdmitLocked(ConnList& conns, ServerConn* c, uint64_t peer_id, const AdmissionLimits& lim,
                 AdmissionCounts* counts) {
  if (!Open(*c)) return false;
  const std::function<bool(const ServerConn&)> groups[] = {
      [&](const ServerConn& o) { return o.peer_id == peer_id; },
      [&](const ServerConn& o) { return o.peer_host == c->peer_host; },
      [](const ServerConn&) { return true; },
  };
  const int caps[] = {lim.max_connections_per_peer, lim.max_connections_per_host, lim.max_connections};
  for (int g = 0; g < 3; ++g) {
    int open = 0;
    for (auto& o : conns) open += o.get() != c && o->authenticated && Open(*o) && groups[g](*o) ? 1 : 0;
    if (open >= caps[g] && !EvictOneLocked(conns, groups[g], lim.min_stall_s, counts)) {
      ++counts->refused;
      return false;
    }
  }
  c->peer_id = peer_id;
  c->authenticated = true;
  c->Enter(ConnState::kIdle);
  return true;
}

}  // namespace rlboost
