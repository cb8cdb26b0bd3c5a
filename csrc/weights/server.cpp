// WeightServer: accept loop, per-connection frame loop and request dispatch.
#include "weights/server.h"

#include <unistd.h>

#include <algorithm>

#include "common/bytes.h"
#include "common/random.h"
#include "transport/tcp/frame_io.h"
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
  s->accept_thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  *out = std::move(s);
  return Status::Ok();
}

WeightServer::~WeightServer() { Close(); }

void WeightServer::Close() {
  if (closing_.exchange(true)) return;  // the first caller does (or did) the work
  listener_.Shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  if (limiter_) limiter_->Close();
  store_->WakeAll();
  std::list<std::unique_ptr<Conn>> conns;
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

ServerStats WeightServer::stats() const {
  ServerStats s;
  s.bytes_sent = bytes_sent_;
  s.chunks_sent = chunks_sent_;
  s.not_held_replies = not_held_;
  s.connections_accepted = accepted_;
  s.connections_refused = refused_;
  s.connections_evicted = evicted_;
  s.auth_failures = auth_failures_;
  s.protocol_errors = protocol_errors_;
  std::lock_guard<std::mutex> lock(mu_);
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
  while (!closing_) {
    Socket s;
    Status st = AcceptTcp(listener_, &s);
    if (closing_ || st.code() == Code::kClosed) return;
    if (!st.ok()) {
      // Out of descriptors or a transient error: back off briefly instead of spinning.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ReapLocked();
    auto open = std::count_if(conns_.begin(), conns_.end(), [](const auto& c) { return !c->evicted; });
    if (open >= opts_.max_connections && !EvictIdleLocked()) {
      ++refused_;
      continue;  // s closes here
    }
    ++accepted_;
    auto conn = std::make_unique<Conn>();
    conn->socket = std::move(s);
    Conn* raw = conn.get();
    conns_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

bool WeightServer::EvictIdleLocked() {
  Conn* oldest = nullptr;
  for (auto& c : conns_) {
    if (c->idle && !c->evicted && !c->done && (oldest == nullptr || c->idle_since < oldest->idle_since)) {
      oldest = c.get();
    }
  }
  if (oldest == nullptr) return false;
  oldest->evicted = true;
  oldest->socket.Shutdown();  // its thread sees the end of stream and exits
  ++evicted_;
  return true;
}

void WeightServer::Serve(Conn* conn) {
  // Everything a client can cause ends here: its connection closes, nothing else.
  try {
    Socket& s = conn->socket;
    Status st = ServerHandshake(s, opts_.secret, self_, Deadline::After(opts_.handshake_timeout_s),
                                &conn->session_key);
    if (st.ok()) st = ServeFrames(conn);
    if (st.code() == Code::kAuth) ++auth_failures_;
    if (st.code() == Code::kProtocol) ++protocol_errors_;
    if ((st.code() == Code::kAuth || st.code() == Code::kProtocol) && !closing_) {
      SendError(s, st, 0, Deadline::After(1.0));
    }
  } catch (...) {
    ++protocol_errors_;
  }
  conn->socket.Shutdown();
  conn->done = true;
}

Status WeightServer::ServeFrames(Conn* c) {
  Socket& s = c->socket;
  ServiceConnection conn;
  conn.socket = &s;
  conn.session_key = c->session_key;
  while (!closing_ && !c->evicted) {
    c->idle_since = Deadline::Clock::now().time_since_epoch().count();
    c->idle = true;
    s.WaitReadable(Deadline::Never());  // idle connections may wait indefinitely
    c->idle = false;
    if (closing_ || c->evicted) break;
    FrameHeader h;
    Deadline frame_deadline = Deadline::After(opts_.frame_timeout_s);
    Status st = RecvHeader(s, &h, frame_deadline);
    if (st.code() == Code::kPeerLost) return Status::Ok();  // orderly close between frames
    RLB_RETURN_IF_ERROR(st);
    if (!IsClientFrame(h.type)) {
      return Status(Code::kProtocol, std::string("unexpected ") + FrameTypeName(h.type) + " frame from a client");
    }
    std::string body;
    RLB_RETURN_IF_ERROR(RecvBody(s, h, &body, frame_deadline));
    RLB_RETURN_IF_ERROR(Dispatch(h, body, conn));
  }
  return Status::Ok();
}

Status WeightServer::Dispatch(const FrameHeader& h, const std::string& body, ServiceConnection& conn) {
  Socket& s = *conn.socket;
  Deadline d = Deadline::After(opts_.send_timeout_s);
  switch (h.type) {
    case FrameType::kChunkRequest:
      return ServeChunk(h, body, s);
    case FrameType::kHaveRequest:
      return ServeHave(h, body, s);
    case FrameType::kManifestRequest: {
      int64_t version;
      RLB_RETURN_IF_ERROR(DecodeVersionBody(body, &version));
      std::string encoded;
      Status st = store_->EncodedManifest(version, &encoded);
      if (!st.ok()) return SendError(s, st, h.request_id, d);
      return SendFrame(s, FrameType::kManifest, 0, h.request_id,
                       SealManifest(conn.session_key, h.request_id, std::move(encoded)), d);
    }
    default:
      break;
  }
  // One-sided transports bypass the pacer, so a server with an egress cap serves over
  // TCP only (an "auto" puller then falls back to TCP).
  bool paced_away = limiter_ != nullptr &&
                    (h.type == FrameType::kShmOpenRequest || h.type == FrameType::kUcxOpenRequest);
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
  int64_t version;
  uint32_t index;
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

Status WeightServer::ServeHave(const FrameHeader& h, const std::string& body, Socket& s) {
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  int64_t version;
  uint64_t known;
  uint32_t wait_ms;
  RLB_RETURN_IF_ERROR(r.I64(&version));
  RLB_RETURN_IF_ERROR(r.U64(&known));
  RLB_RETURN_IF_ERROR(r.U32(&wait_ms));
  RLB_RETURN_IF_ERROR(r.ExpectEnd());
  HeldState held;
  Deadline d = Deadline::After(opts_.send_timeout_s);
  Status st = store_->Have(version, known, wait_ms, [this] { return closing_.load(); }, &held);
  if (!st.ok()) return SendError(s, st, h.request_id, d);
  std::string reply;
  ByteWriter w(&reply);
  w.I64(version);
  w.U32(held.num_chunks);
  w.U32(held.held_count);
  w.U64(held.generation);
  w.Raw(held.bitmap.data(), held.bitmap.size());
  w.Raw(held.pending.data(), held.pending.size());
  return SendFrame(s, FrameType::kHave, 0, h.request_id, reply, d);
}

}  // namespace rlboost
