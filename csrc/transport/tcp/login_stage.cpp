// The login stage: nonblocking accepts and logins over epoll, budgeted per address, with
// slots reserved for addresses that logged in successfully not long ago.
#include "transport/tcp/login_stage.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>

#include "common/frame.h"

namespace rlboost {
namespace {

constexpr int kAcceptsPerRound = 64;  // then pending logins get their turn
constexpr int kTickMs = 20;
constexpr size_t kMaxGoodHosts = 4096;

std::string PeerHostOf(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  char host[NI_MAXHOST] = "";
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0 ||
      getnameinfo(reinterpret_cast<struct sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

// Sends a whole small frame on a nonblocking socket, or fails: a peer whose receive
// window cannot take a hundred bytes is not worth waiting for.
bool SendNow(int fd, FrameType type, const std::string& body) {
  FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(body.size());
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  std::string out(reinterpret_cast<const char*>(head), kFrameHeaderBytes);
  out += body;
  ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(out.size());
}

}  // namespace

struct LoginStage::Pending {
  uint64_t id = 0;
  Socket sock;
  std::string host;
  bool reserved = false;
  Deadline::Clock::time_point accepted;
  std::unique_ptr<ServerLogin> login;
  bool got_hello = false;
  FrameHeader header;
  std::string buf;
  std::list<std::unique_ptr<Pending>>::iterator self;
};

LoginStage::LoginStage(Socket& listener, std::string secret, PeerIdentity self, EncryptPolicy policy,
                       LoginLimits limits, LoginCounts* counts, OnLogin on_login)
    : listener_(listener), secret_(std::move(secret)), self_(self), policy_(policy), limits_(limits),
      on_login_(std::move(on_login)), counts_(counts) {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  int flags = fcntl(listener_.fd(), F_GETFL, 0);
  fcntl(listener_.fd(), F_SETFL, flags | O_NONBLOCK);
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, listener_.fd(), &ev);
}

LoginStage::~LoginStage() {
  by_id_.clear();
  pending_.clear();
  if (epoll_ >= 0) close(epoll_);
}

void LoginStage::Run(const std::atomic<bool>& closing) {
  struct epoll_event events[256];
  while (!closing) {
    int n = epoll_wait(epoll_, events, 256, kTickMs);
    if (closing) return;
    // Logins under way before newcomers: a burst of accepts must not delay the logins
    // that are one frame from done (an honest puller's among them).
    bool listener_ready = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        listener_ready = true;
        continue;
      }
      auto it = by_id_.find(events[i].data.u64);
      if (it != by_id_.end()) Step(it->second);  // gone already: dropped for a newcomer
    }
    if (listener_ready) AcceptAll();
    Expire();
  }
}

void LoginStage::AcceptAll() {
  for (int i = 0; i < kAcceptsPerRound; ++i) {
    int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN: drained; anything else: the next round tries again
    ++counts_->accepted;
    auto p = std::make_unique<Pending>();
    p->id = next_id_++;
    p->sock = Socket(fd);
    p->host = PeerHostOf(fd);
    p->reserved = RecentlyGood(p->host);
    p->accepted = Deadline::Clock::now();
    p->login = std::make_unique<ServerLogin>(secret_, self_, policy_, PeerIsLoopback(fd));
    MakeRoom(p->host, p->reserved);
    struct epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = p->id;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
    Pending* raw = p.get();
    pending_.push_back(std::move(p));
    raw->self = std::prev(pending_.end());
    by_id_[raw->id] = raw;
  }
}

bool LoginStage::RecentlyGood(const std::string& host) {
  auto it = good_.find(host);
  if (it == good_.end()) return false;
  if (std::chrono::duration<double>(Deadline::Clock::now() - it->second).count() <= limits_.good_login_s) return true;
  good_.erase(it);
  return false;
}

void LoginStage::MakeRoom(const std::string& host, bool reserved) {
  // The address's own oldest goes first, so one address cannot fill a pool; then the
  // pool's oldest. Reserved logins never make room in the other pool, nor it in theirs.
  auto oldest = [&](const std::function<bool(const Pending&)>& in, int* n) {
    Pending* first = nullptr;
    *n = 0;
    for (auto& p : pending_) {
      if (!in(*p)) continue;
      ++*n;
      if (first == nullptr) first = p.get();
    }
    return first;
  };
  int n = 0;
  Pending* p = oldest([&](const Pending& q) { return q.host == host; }, &n);
  if (n >= limits_.per_host) {
    Drop(p);
    ++counts_->dropped;
  }
  p = oldest([&](const Pending& q) { return q.reserved == reserved; }, &n);
  if (n >= limits_.slots) {
    Drop(p);
    ++counts_->dropped;
  }
}

void LoginStage::Drop(Pending* p) {
  epoll_ctl(epoll_, EPOLL_CTL_DEL, p->sock.fd(), nullptr);
  by_id_.erase(p->id);
  pending_.erase(p->self);  // closes the socket
}

void LoginStage::Fail(Pending* p, const Status& st) {
  if (st.code() == Code::kAuth) ++counts_->auth_failures;
  if (st.code() == Code::kProtocol) ++counts_->protocol_errors;
  if (st.code() == Code::kAuth || st.code() == Code::kProtocol) {
    SendNow(p->sock.fd(), FrameType::kError, EncodeErrorBody(st));
  }
  Drop(p);
}

void LoginStage::Step(Pending* p) {
  char tmp[128];
  for (;;) {
    const size_t want = p->buf.size() < kFrameHeaderBytes ? kFrameHeaderBytes : kFrameHeaderBytes + p->header.length;
    if (p->buf.size() == want) {
      if (!Advance(p)) return;
      continue;
    }
    ssize_t n = ::recv(p->sock.fd(), tmp, std::min(sizeof(tmp), want - p->buf.size()), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return Drop(p);
    if (n < 0) return;  // all there is for now
    p->buf.append(tmp, static_cast<size_t>(n));
    if (p->buf.size() != kFrameHeaderBytes) continue;
    Status st = DecodeFrameHeader(reinterpret_cast<const uint8_t*>(p->buf.data()), &p->header);
    const FrameType expected = p->got_hello ? FrameType::kAuth : FrameType::kHello;
    if (st.ok() && p->header.type != expected) {
      st = Status(Code::kProtocol, std::string("expected a ") + FrameTypeName(expected) + " frame, got " +
                                       FrameTypeName(p->header.type));
    }
    if (!st.ok()) return Fail(p, st);
  }
}

// A whole login frame has arrived: answers it. False when the login ended (either way).
bool LoginStage::Advance(Pending* p) {
  std::string body = p->buf.substr(kFrameHeaderBytes);
  p->buf.clear();
  if (!p->got_hello) {
    std::string challenge;
    Status st = p->login->OnHello(body, &challenge);
    if (!st.ok()) return Fail(p, st), false;
    if (!SendNow(p->sock.fd(), FrameType::kChallenge, challenge)) return Drop(p), false;
    p->got_hello = true;
    return true;
  }
  Status st = p->login->OnAuth(body);
  if (!st.ok()) return Fail(p, st), false;
  if (good_.size() >= kMaxGoodHosts) good_.clear();  // a bound, should many hosts log in
  good_[p->host] = Deadline::Clock::now();
  std::string welcome = p->login->Welcome();
  std::shared_ptr<FrameSeal> seal = p->login->Seal();
  const uint64_t client_id = p->login->client_id();
  std::string host = p->host;
  Socket s = std::move(p->sock);
  epoll_ctl(epoll_, EPOLL_CTL_DEL, s.fd(), nullptr);
  by_id_.erase(p->id);
  pending_.erase(p->self);
  int flags = fcntl(s.fd(), F_GETFL, 0);
  fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
  on_login_(std::move(s), client_id, host, welcome, std::move(seal));
  return false;
}

void LoginStage::Expire() {
  const auto now = Deadline::Clock::now();
  const auto limit = std::chrono::duration_cast<Deadline::Clock::duration>(std::chrono::duration<double>(limits_.timeout_s));
  // Oldest first: the first one still within its deadline ends the sweep.
  while (!pending_.empty() && now - pending_.front()->accepted > limit) {
    ++counts_->timed_out;
    Drop(pending_.front().get());
  }
}

}  // namespace rlboost
