// Control-connection requests: manifest, held bitmap, and transport control calls.
#include "weights/session.h"

#include "common/bytes.h"
#include "transport/tcp/frame_io.h"
#include "transport/tcp/handshake.h"

namespace rlboost {

Status SourceSession::Open(const std::string& host, int port, const std::string& secret,
                           Deadline d, std::unique_ptr<SourceSession>* out) {
  std::unique_ptr<SourceSession> s(new SourceSession(host, port, secret));
  RLB_RETURN_IF_ERROR(ConnectTcp(host, port, d, &s->socket_));
  RLB_RETURN_IF_ERROR(ClientHandshake(s->socket_, secret, d, &s->peer_));
  *out = std::move(s);
  return Status::Ok();
}

Status SourceSession::Call(FrameType request, const std::string& body, FrameType response,
                           FrameHeader* reply_header, std::string* reply, Deadline d) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = ++next_id_;
  RLB_RETURN_IF_ERROR(SendFrame(socket_, request, 0, id, body, d));
  RLB_RETURN_IF_ERROR(RecvExpected(socket_, response, reply_header, reply, d));
  if (reply_header->request_id != id) return Status(Code::kProtocol, "response to another request");
  return Status::Ok();
}

Status SourceSession::Notify(FrameType request, const std::string& body, Deadline d) {
  std::lock_guard<std::mutex> lock(mu_);
  return SendFrame(socket_, request, 0, ++next_id_, body, d);
}

Status SourceSession::FetchManifest(int64_t version, Manifest* out, Deadline d) {
  std::string body, reply;
  ByteWriter w(&body);
  w.I64(version);
  FrameHeader h;
  RLB_RETURN_IF_ERROR(Call(FrameType::kManifestRequest, body, FrameType::kManifest, &h, &reply, d));
  RLB_RETURN_IF_ERROR(DecodeManifest(reinterpret_cast<const uint8_t*>(reply.data()), reply.size(), out));
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
  int64_t got_version;
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
  RLB_RETURN_IF_ERROR(r.Raw(out->bitmap.data(), bytes));
  return r.Raw(out->pending.data(), bytes);
}

}  // namespace rlboost
