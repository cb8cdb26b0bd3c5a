// Control-connection requests: manifest, held bitmap, and transport control calls.
#include "weights/session.h"

#include <algorithm>

#include "common/bytes.h"
#include "channel/frame_io.h"
#include "channel/handshake.h"

namespace rlboost {

uint64_t MaxManifestBody(uint64_t max_version_bytes) {
  const uint64_t chunks = max_version_bytes / kMinChunkBytes + 1;
  const uint64_t meta = std::min<uint64_t>(kMaxManifestMeta, (uint64_t{1} << 20) + max_version_bytes / 1024);
  return std::min<uint64_t>(MaxFrameBody(FrameType::kManifest), 128 + kChunkTagBytes * chunks + meta);
}

Status SourceSession::Open(const std::string& host, int port, const SessionOptions& opts,
                           std::shared_ptr<ConnectionPool> pool, uint64_t server_id,
                           Interrupt* interrupt, Deadline d, std::unique_ptr<SourceSession>* out) {
  std::unique_ptr<SourceSession> s(new SourceSession(host, port, opts, std::move(pool)));
  s->interrupt_ = interrupt;
  Connection c;
  RLB_RETURN_IF_ERROR(ConnectAuthenticated(s->pool_.get(), host, port, opts.secret, opts.encrypt, server_id, d,
                                           &c, interrupt));
  s->socket_ = std::move(c.socket);
  s->peer_ = c.peer;
  s->reused_ = c.reused;
  *out = std::move(s);
  return Status::Ok();
}

SourceSession::~SourceSession() {
  if (pool_ != nullptr && !broken_) pool_->Give(host_, port_, std::move(socket_), peer_);
}

Status SourceSession::Call(FrameType request, const std::string& body, FrameType response,
                           FrameHeader* reply_header, std::string* reply, Deadline d) {
  std::lock_guard<std::mutex> lock(mu_);
  Status st = CallOnce(request, body, response, reply_header, reply, d);
  bool connection_lost = st.code() == Code::kPeerLost || st.code() == Code::kIo;
  if (!connection_lost || !reused_ || proven_ || (interrupt_ != nullptr && interrupt_->fired())) return st;
  // A kept connection the source closed while it was idle: connect afresh and ask again
  // (every control request is a read, or a lease the closed connection already ended).
  Connection c;
  RLB_RETURN_IF_ERROR(ConnectAuthenticated(nullptr, host_, port_, opts_.secret, opts_.encrypt, 0, d, &c, interrupt_));
  socket_ = std::move(c.socket);
  peer_ = c.peer;
  reused_ = false;
  broken_ = false;
  return CallOnce(request, body, response, reply_header, reply, d);
}

Status SourceSession::CallOnce(FrameType request, const std::string& body, FrameType response,
                               FrameHeader* reply_header, std::string* reply, Deadline d) {
  InterruptScope scope(interrupt_, socket_);
  uint64_t id = ++next_id_;
  FrameHeader h;
  Status st = SendFrame(socket_, request, 0, id, body, d);
  if (st.ok()) st = RecvHeader(socket_, &h, d);
  if (st.ok() && h.type != response && h.type != FrameType::kError) {
    st = Status(Code::kProtocol, std::string("expected a ") + FrameTypeName(response) + " frame, got " +
                                     FrameTypeName(h.type));
  }
  if (st.ok() && h.type == FrameType::kManifest && h.length > MaxManifestBody(opts_.max_version_bytes)) {
    // Refused before the body is allocated: no honest version within the bound needs it.
    st = Status(Code::kProtocol, "manifest of " + std::to_string(h.length) + " bytes is larger than any version " +
                                     "within transfer.max_version_bytes (" + std::to_string(opts_.max_version_bytes) +
                                     ") needs");
  }
  if (st.ok()) st = RecvBody(socket_, h, reply, d);
  if (st.ok() && h.type != FrameType::kError && h.request_id != id) {
    st = Status(Code::kProtocol, "response to another request");
  }
  if (!st.ok()) {
    broken_ = true;  // the byte stream is out of step (or gone)
    return st;
  }
  *reply_header = h;
  if (h.type == FrameType::kError) {
    st = DecodeErrorBody(reinterpret_cast<const uint8_t*>(reply->data()), reply->size());
    // A source closes the connection after it reports an auth or protocol error.
    if (st.code() == Code::kAuth || st.code() == Code::kProtocol) {
      broken_ = true;
      return st;
    }
  }
  proven_ = true;
  return st;
}

Status SourceSession::Notify(FrameType request, const std::string& body, Deadline d) {
  std::lock_guard<std::mutex> lock(mu_);
  Status st = SendFrame(socket_, request, 0, ++next_id_, body, d);
  if (!st.ok()) broken_ = true;
  return st;
}

Status SourceSession::FetchManifest(int64_t version, Manifest* out, Deadline d) {
  std::string reply;
  FrameHeader h;
  RLB_RETURN_IF_ERROR(Call(FrameType::kManifestRequest, EncodeVersionBody(version), FrameType::kManifest,
                           &h, &reply, d));
  RLB_RETURN_IF_ERROR(DecodeManifest(reinterpret_cast<const uint8_t*>(reply.data()), reply.size(), out));
  if (out->total_bytes > opts_.max_version_bytes) {
    return Status(Code::kProtocol, "source announced version " + std::to_string(out->version) + " of " +
                                       std::to_string(out->total_bytes) + " bytes, more than transfer.max_version_bytes (" +
                                       std::to_string(opts_.max_version_bytes) + ")");
  }
  if (version >= 0 && out->version != version) {
    return Status(Code::kProtocol, "source answered with another version's manifest");
  }
  return Status::Ok();
}

Status SourceSession::FetchHave(int64_t version, uint64_t known, uint32_t wait_ms, HeldState* out,
                                Deadline d) {
  std::string body, reply;
  ByteWriter w(&body);
  w.I64(version);
  w.U64(known);
  w.U32(wait_ms);
  FrameHeader h;
  RLB_RETURN_IF_ERROR(Call(FrameType::kHaveRequest, body, FrameType::kHave, &h, &reply, d));
  ByteReader r(reinterpret_cast<const uint8_t*>(reply.data()), reply.size());
  int64_t got_version = 0;
  RLB_RETURN_IF_ERROR(r.I64(&got_version));
  RLB_RETURN_IF_ERROR(r.U32(&out->num_chunks));
  RLB_RETURN_IF_ERROR(r.U32(&out->held_count));
  RLB_RETURN_IF_ERROR(r.U64(&out->generation));
  uint64_t bytes = (uint64_t{out->num_chunks} + 7) / 8;
  if (got_version != version || out->held_count > out->num_chunks || r.remaining() != 2 * bytes) {
    return Status(Code::kProtocol, "malformed held-chunk bitmap");
  }
  out->bitmap.resize(bytes);
  out->pending.resize(bytes);
  if (bytes == 0) return Status::Ok();  // a version with no chunks: empty vectors have no data()
  RLB_RETURN_IF_ERROR(r.Raw(out->bitmap.data(), bytes));
  return r.Raw(out->pending.data(), bytes);
}

}  // namespace rlboost
