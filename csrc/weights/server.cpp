// WeightServer: accept loop, per-connection frame loop and request dispatch.
#include "weights/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "common/bytes.h"
#include "common/random.h"
#include "channel/frame_io.h"
#include "transport/tcp/tcp_transport.h"

namespace rlboost {
WeightServer::WeightServer(const ServerOptions& opts, std::shared_ptr<VersionStore> store)
    : opts_(opts), store_(std::move(store)), services_(MakeTransportServices(ServiceOptions{opts.host, opts.ucx_port})) {
  if (opts_.egress_bytes_per_s > 0) limiter_ = std::make_unique<RateLimiter>(opts_.egress_bytes_per_s);
}

Status WeightServer::Start(const ServerOptions& opts, std::shared_ptr<VersionStore> store,
                           std::unique_ptr<WeightServer>* out) {
  std::unique_ptr<WeightServer> s(new WeightServer(opts, std::move(store)));
  RLB_RETURN_IF_ERROR(SecureRandom(&s->self_.server_id, sizeof(s->self_.server_id)));
  s->self_.host_key = LocalHostKey();
  s->self_.pid = static_cast<uint32_t>(getpid());
  RLB_RETURN_IF_ERROR(ListenTcp(opts.host, opts.port, &s->listener_, &s->port_));
  LoginLimits limits;
  limits.slots = opts.limits.max_handshakes;
  limits.per_host = opts.limits.max_handshakes_per_host;
  limits.timeout_s = opts.handshake_timeout_s;
  WeightServer* raw = s.get();
  RLB_RETURN_IF_ERROR(LoginStage::Create(
      s->listener_, opts.secret, s->self_, opts.encrypt, limits, &s->logins_,
      [raw](Socket sock, uint64_t id, const std::string& host, const std::string& welcome,
            std::shared_ptr<FrameSeal> seal) { raw->OnLogin(std::move(sock), id, host, welcome, std::move(seal)); },
      &s->stage_));
  s->accept_thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  *out = std::move(s);
  return Status::Ok();
}

WeightServer::~WeightServer() { Close(); }

void WeightServer::Close() {
  if (closing_.exchange(true)) return;  // the first caller does (or did) the work
  if (getpid() != owner_pid_) return AbandonInForkedChild();
  listener_.Shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  if (limiter_) limiter_->Close();
  store_->WakeAll();
  ConnList conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) c->socket.Shutdown();
    conns.swap(conns_);
  }
  for (auto& c : conns) {
    if (c->thread.joinable()) c->thread.join();
  }
  listener_.Close();
}

void WeightServer::AbandonInForkedChild() {
  // shutdown() would end the parent's connections too (the sockets are shared): close
  // only this process's descriptors. Joining or destroying std::thread objects of threads
  // this process does not have is undefined, and services and the pacer may own such
  // threads or locked mutexes: they are deliberately leaked.
  listener_.Close();
  for (auto& c : conns_) c->socket.Close();
  new ConnList(std::move(conns_));
  new std::thread(std::move(accept_thread_));
  for (auto& svc : services_) static_cast<void>(svc.release());
  static_cast<void>(limiter_.release());
  static_cast<void>(stage_.release());
}

ServerStats WeightServer::stats() const {
  ServerStats s;
  s.bytes_sent = bytes_sent_;
  s.chunks_sent = chunks_sent_;
  s.not_held_replies = not_held_;
  s.connections_accepted = logins_.accepted;
  s.deadlines_missed = deadlines_missed_ + logins_.timed_out;
  s.auth_failures = auth_failures_ + logins_.auth_failures;
  s.protocol_errors = protocol_errors_ + logins_.protocol_errors;
  s.leases_expired = leases_expired_;
  s.leases_revoked = leases_revoked_;
  s.encrypted_connections = encrypted_;
  s.accept_queue_peak = logins_.accept_queue_peak;
  s.accept_errors = logins_.accept_errors;
  s.resource_errors = resource_errors_;
  std::lock_guard<std::mutex> lock(mu_);
  s.connections_refused = admission_.refused;
  s.connections_evicted = admission_.evicted_idle;
  s.stalled_evicted = admission_.evicted_stalled;
  s.handshakes_dropped = logins_.dropped;
  for (auto& c : conns_) s.active_connections += c->done || c->evicted ? 0 : 1;
  return s;
}

void WeightServer::ReapLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void WeightServer::AcceptLoop() {
  // Run fails only when epoll itself does; the listener then accepts nothing more, and
  // the failure is counted where a user looks (stats: accept_errors).
  if (!stage_->Run(closing_).ok()) ++logins_.accept_errors;
}

void WeightServer::OnLogin(Socket s, uint64_t client_id, const std::string& host, const std::string& welcome,
                           std::shared_ptr<FrameSeal> seal) {
  // A proven client: it takes an authenticated slot (closing an idle or stalled connection
  // if a cap is reached) and gets a thread of its own, which sends the welcome. A socket the
  // kernel will not tune is broken: it is closed here, as a connection that went away.
  if (!TuneForBulk(s.fd()).ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  ReapLocked();
  auto conn = std::make_shared<ServerConn>();
  conn->peer_host = host;
  conn->accepted_at = Deadline::Clock::now();
  conn->socket = std::move(s);
  if (!AdmitLocked(conns_, conn.get(), client_id, opts_.limits, &admission_)) return;  // closed, unwelcomed
  if (seal->encrypts()) ++encrypted_;
  ServerConn* raw = conn.get();
  conns_.push_back(std::move(conn));
  std::shared_ptr<ServerConn> shared = conns_.back();
  raw->thread = std::thread([this, shared, welcome, seal] { Serve(shared, welcome, seal); });
}

void WeightServer::Serve(const std::shared_ptr<ServerConn>& conn, const std::string& welcome,
                         std::shared_ptr<FrameSeal> seal) {
  // Everything a client can cause ends here: its connection closes, nothing else. Nothing
  // below throws on a client's bytes; running out of memory is the one exception, and it
  // is counted as what it is.
  try {
    ServeGuarded(conn, welcome, std::move(seal));
  } catch (const std::bad_alloc&) {
    ++resource_errors_;
  }
  conn->state = static_cast<int>(ConnState::kClosing);
  conn->socket.Shutdown();
  conn->done = true;
}

void WeightServer::ServeGuarded(const std::shared_ptr<ServerConn>& conn, const std::string& welcome,
                                std::shared_ptr<FrameSeal> seal) {
  Socket& s = conn->socket;
  Status st = SendFrame(s, FrameType::kWelcome, 0, 0, welcome, Deadline::After(opts_.handshake_timeout_s));
  s.set_seal(std::move(seal));
  if (st.ok()) st = ServeFrames(conn);
  if (st.code() == Code::kAuth) ++auth_failures_;
  if (st.code() == Code::kProtocol) ++protocol_errors_;
  if (st.code() == Code::kTimeout) ++deadlines_missed_;
  if ((st.code() == Code::kAuth || st.code() == Code::kProtocol) && !closing_ && !conn->evicted) {
    SendError(s, st, 0, Deadline::After(1.0));
  }
}

Status WeightServer::ServeFrames(const std::shared_ptr<ServerConn>& owner) {
  ServerConn* c = owner.get();
  Socket& s = c->socket;
  ServiceConnection conn;
  conn.socket = &s;
  // Called by the version store under its lock: it only shuts the socket down, and a
  // connection already reaped is out of its reach.
  std::weak_ptr<ServerConn> weak = owner;
  conn.revoke = [this, weak] {
    std::shared_ptr<ServerConn> target = weak.lock();
    if (target == nullptr) return;
    if (!target->evicted.exchange(true)) ++leases_revoked_;
    target->Evict();
  };
  bool proven = false;  // a request verified under this login's keys
  // A region lease pins its version; it lasts lease_timeout_s from when it was granted,
  // however busy the connection keeps itself (closing the connection ends its leases).
  Deadline lease_expiry = Deadline::Never();
  while (!closing_ && !c->evicted) {
    c->Enter(ConnState::kIdle);
    bool readable = s.WaitReadable(lease_expiry);
    if (!c->LeaveIdle(ConnState::kBusy)) break;  // evicted meanwhile
    if (closing_ || c->evicted) break;
    if (!readable) {
      ++leases_expired_;
      break;
    }
    FrameHeader h;
    Deadline frame_deadline = Deadline::After(opts_.frame_timeout_s);  // from its first byte
    Status st = RecvHeader(s, &h, frame_deadline);
    if (st.code() == Code::kPeerLost) return Status::Ok();  // orderly close between frames
    RLB_RETURN_IF_ERROR(st);
    if (!IsClientFrame(h.type)) {
      return Status(Code::kProtocol, std::string("unexpected ") + FrameTypeName(h.type) + " frame from a client");
    }
    std::string body;
    RLB_RETURN_IF_ERROR(RecvBody(s, h, &body, frame_deadline));
    if (!proven) {
      // Only now, with a request that carries this login's MAC (or AES-GCM tag), has the
      // address shown it holds the keys: a relayed login never gets this far.
      proven = true;
      stage_->MarkGood(c->peer_host);
    }
    const size_t leases_before = conn.leases();
    RLB_RETURN_IF_ERROR(Dispatch(h, body, c, conn));
    if (conn.leases() == 0) {
      lease_expiry = Deadline::Never();
    } else if (conn.leases() > leases_before) {
      lease_expiry = lease_expiry.Min(Deadline::After(opts_.lease_timeout_s));
    }
    if (lease_expiry.Expired()) {
      ++leases_expired_;
      break;
    }
  }
  return Status::Ok();
}

Status WeightServer::Dispatch(const FrameHeader& h, const std::string& body, ServerConn* c,
                              ServiceConnection& conn) {
  Socket& s = *conn.socket;
  Deadline d = Deadline::After(opts_.send_timeout_s);
  switch (h.type) {
    case FrameType::kChunkRequest:
      return ServeChunk(h, body, s);
    case FrameType::kHaveRequest:
      return ServeHave(h, body, c);
    case FrameType::kManifestRequest: {
      int64_t version;
      RLB_RETURN_IF_ERROR(DecodeVersionBody(body, &version));
      std::string encoded;
      Status st = store_->EncodedManifest(version, &encoded);
      if (!st.ok()) return SendError(s, st, h.request_id, d);
      return SendFrame(s, FrameType::kManifest, 0, h.request_id, encoded, d);  // MACed or sealed like every frame
    }
    default:
      break;
  }
  // One-sided transports bypass the pacer, so a server with an egress cap serves over
  // TCP only (an "auto" puller then falls back to TCP).
  bool paced_away = limiter_ != nullptr &&
                    (h.type == FrameType::kShmOpenRequest || h.type == FrameType::kUcxOpenRequest);
  // UCX moves bytes outside this connection, unencrypted: not for a sealed one.
  paced_away = paced_away || (h.type == FrameType::kUcxOpenRequest && s.seal() != nullptr && s.seal()->encrypts());
  for (auto& svc : services_) {
    if (!paced_away && svc->Handles(h.type)) {
      conn.request_id = h.request_id;
      return svc->Handle(h, body, conn, *store_, d);
    }
  }
  // A transport this build lacks: say so, so the client can choose another.
  if (h.type == FrameType::kShmOpenRequest) return SendFrame(s, FrameType::kShmOpen, static_cast<uint32_t>(ReplyStatus::kUnavailable), h.request_id, "", d);
  if (h.type == FrameType::kUcxOpenRequest) return SendFrame(s, FrameType::kUcxOpen, static_cast<uint32_t>(ReplyStatus::kUnavailable), h.request_id, "", d);
  return Status(Code::kProtocol, std::string("unexpected ") + FrameTypeName(h.type) +
                                     " frame from a client");
}

Status WeightServer::ServeChunk(const FrameHeader& h, const std::string& body, Socket& s) {
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  int64_t version = 0;
  uint32_t index = 0;
  RLB_RETURN_IF_ERROR(r.I64(&version));
  RLB_RETURN_IF_ERROR(r.U32(&index));
  RLB_RETURN_IF_ERROR(r.ExpectEnd());
  ChunkLease lease;
  ReplyStatus reply = store_->LeaseChunk(version, index, &lease);
  if (reply == ReplyStatus::kNotHeld) ++not_held_;
  RLB_RETURN_IF_ERROR(SendChunkOverTcp(s, h.request_id, version, index, reply, lease,
                                       limiter_.get(), Deadline::After(opts_.send_timeout_s)));
  if (reply == ReplyStatus::kOk) {
    ++chunks_sent_;
    bytes_sent_ += lease.length;
  }
  return Status::Ok();
}

Status WeightServer::ServeHave(const FrameHeader& h, const std::string& body, ServerConn* c) {
  Socket& s = c->socket;
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  int64_t version = 0;
  uint64_t known = 0;
  uint32_t wait_ms = 0;
  RLB_RETURN_IF_ERROR(r.I64(&version));
  RLB_RETURN_IF_ERROR(r.U64(&known));
  RLB_RETURN_IF_ERROR(r.U32(&wait_ms));
  RLB_RETURN_IF_ERROR(r.ExpectEnd());
  HeldState held;
  Deadline d = Deadline::After(opts_.send_timeout_s);
  // A client that hangs up mid-poll (its pull ended) frees this thread within a poll slice.
  // The wait is the server's, not the peer's: it does not count as a stall.
  c->Enter(ConnState::kWaiting);
  Status st = store_->Have(version, known, wait_ms, [&] { return closing_.load() || s.HungUp(); }, &held);
  c->Enter(ConnState::kBusy);
  if (!st.ok()) return SendError(s, st, h.request_id, d);
  std::string reply;
  ByteWriter w(&reply);
  w.I64(version);
  w.U32(held.num_chunks);
  w.U32(held.held_count);
  w.U64(held.generation);
  if (held.num_chunks > 0) {  // a version with no chunks: empty vectors have no data()
    w.Raw(held.bitmap.data(), held.bitmap.size());
    w.Raw(held.pending.data(), held.pending.size());
  }
  return SendFrame(s, FrameType::kHave, 0, h.request_id, reply, d);
}

}  // namespace rlboost
