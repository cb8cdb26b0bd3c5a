// Idle connection bookkeeping, and the connect-or-reuse entry point.
#include "channel/connection_pool.h"

#include "channel/frame_seal.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>

namespace rlboost {
namespace {

// An idle connection has nothing to read: data or an end of stream means the server
// closed it (or broke the protocol), so it cannot carry a request.
bool StillIdle(const Socket& s) {
  struct pollfd pfd = {s.fd(), POLLIN | POLLRDHUP, 0};
  return ::poll(&pfd, 1, 0) == 0;
}

}  // namespace

ConnectionPool::ConnectionPool(size_t max_idle_per_source, double max_idle_s)
    : max_idle_per_source_(max_idle_per_source), max_idle_s_(max_idle_s), owner_(getpid()) {}

void ConnectionPool::ForgetInheritedLocked() {
  if (getpid() == owner_) return;
  idle_.clear();  // close() of the child's copies: the parent's connections stay up
  owner_ = getpid();
}

void ConnectionPool::DropExpiredLocked() {
  ForgetInheritedLocked();
  auto now = Deadline::Clock::now();
  while (!idle_.empty() &&
         std::chrono::duration<double>(now - idle_.front().since).count() > max_idle_s_) {
    idle_.pop_front();
  }
}

bool ConnectionPool::Take(const std::string& host, int port, uint64_t server_id, Socket* out,
                          PeerIdentity* peer) {
  std::deque<Idle> stale;  // closed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  DropExpiredLocked();
  // Newest first: the most recently used connection is the least likely to be closed.
  for (auto it = idle_.end(); it != idle_.begin();) {
    --it;
    if (it->host != host || it->port != port) continue;
    if (server_id != 0 && it->peer.server_id != server_id) continue;
    if (!StillIdle(it->socket)) {
      stale.push_back(std::move(*it));
      it = idle_.erase(it);
      continue;
    }
    *out = std::move(it->socket);
    *peer = it->peer;
    idle_.erase(it);
    return true;
  }
  return false;
}

void ConnectionPool::Give(const std::string& host, int port, Socket s, const PeerIdentity& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !s.valid()) return;  // s closes here
  DropExpiredLocked();
  if (s.seal() != nullptr && !s.seal()->CheckOwner().ok()) return;  // the parent's, handed back in a child
  size_t same = std::count_if(idle_.begin(), idle_.end(),
                              [&](const Idle& e) { return e.host == host && e.port == port; });
  if (same >= max_idle_per_source_) return;
  idle_.push_back(Idle{host, port, std::move(s), peer, Deadline::Clock::now()});
}

void ConnectionPool::Close() {
  std::deque<Idle> drop;
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  drop.swap(idle_);
}

size_t ConnectionPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return getpid() == owner_ ? idle_.size() : 0;
}

Status ConnectAuthenticated(ConnectionPool* pool, const std::string& host, int port,
                            const std::string& secret, EncryptPolicy encrypt, uint64_t server_id,
                            Deadline d, Connection* out, Interrupt* interrupt) {
  if (pool != nullptr && pool->Take(host, port, server_id, &out->socket, &out->peer)) {
    out->reused = true;
    return Status::Ok();
  }
  out->reused = false;
  Status st;
  // A login closed by the server (kPeerLost) is tried once more while the deadline allows:
  // a server whose login slots are full of stalled peers closes the oldest login for a
  // newcomer, which may have been ours.
  // So is one that found a relay on this host in front of the source ("auto" then logs in
  // again, sealed).
  LoginMode mode;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const bool resealing = mode.seal_loopback;
    st = ConnectTcp(host, port, d, &out->socket, interrupt);
    if (st.ok()) {
      // A source that accepts but never answers would hold us here until the deadline.
      InterruptScope scope(interrupt, out->socket);
      st = ClientHandshake(out->socket, secret, encrypt, d, &out->peer, &mode);
    }
    if (st.code() != Code::kPeerLost || d.Expired() || (interrupt != nullptr && interrupt->fired())) break;
    if (attempt == 1 && mode.seal_loopback == resealing) break;  // a second lost login is the source's doing
  }
  RLB_RETURN_IF_ERROR(st);
  if (server_id != 0 && out->peer.server_id != server_id) {
    return Status(Code::kPeerLost, "the source at " + host + ":" + std::to_string(port) + " restarted");
  }
  return Status::Ok();
}

}  // namespace rlboost
