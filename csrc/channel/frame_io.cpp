// Frame send/receive helpers shared by the server, the control session and TCP streams.
// After the login every frame carries the tag of its connection's seal (frame_seal.h).
#include "channel/frame_io.h"

#include <algorithm>
#include <cstring>

#include "channel/frame_seal.h"

namespace rlboost {
namespace {

constexpr size_t kBodyPieceBytes = 1u << 20;

}  // namespace

Status SendFrame(Socket& s, FrameType type, uint32_t status, uint64_t request_id,
                 const void* body, size_t n, Deadline d) {
  FrameHeader h;
  h.type = type;
  h.status = status;
  h.length = static_cast<uint32_t>(n);
  h.request_id = request_id;
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  FrameSeal* seal = s.seal();
  if (seal == nullptr) {
    struct iovec iov[2] = {{head, kFrameHeaderBytes}, {const_cast<void*>(body), n}};
    return s.SendV(iov, n > 0 ? 2 : 1, d);
  }
  RLB_RETURN_IF_ERROR(seal->CheckOwner());
  FrameCipher& c = seal->send();
  RLB_RETURN_IF_ERROR(c.Begin(head));
  std::string sealed;
  const void* out = body;
  if (c.encrypts() && n > 0) {
    sealed.resize(n);
    RLB_RETURN_IF_ERROR(c.Cover(static_cast<const uint8_t*>(body), reinterpret_cast<uint8_t*>(&sealed[0]), n));
    out = sealed.data();
  } else {
    RLB_RETURN_IF_ERROR(c.Cover(static_cast<const uint8_t*>(body), nullptr, n));
  }
  uint8_t tag[kFrameTagBytes];
  RLB_RETURN_IF_ERROR(c.Tag(tag));
  struct iovec iov[3] = {{head, kFrameHeaderBytes}, {const_cast<void*>(out), n}, {tag, kFrameTagBytes}};
  return s.SendV(iov, 3, d);
}

Status SendError(Socket& s, const Status& err, uint64_t request_id, Deadline d) {
  return SendFrame(s, FrameType::kError, 0, request_id, EncodeErrorBody(err), d);
}

Status RecvHeader(Socket& s, FrameHeader* h, Deadline d) {
  FrameSeal* seal = s.seal();
  if (seal != nullptr) RLB_RETURN_IF_ERROR(seal->CheckOwner());
  uint8_t head[kFrameHeaderBytes];
  RLB_RETURN_IF_ERROR(s.RecvAll(head, kFrameHeaderBytes, d));
  RLB_RETURN_IF_ERROR(DecodeFrameHeader(head, h));
  // The frame's tag covers its header: the receiving side begins here.
  return seal != nullptr ? seal->recv().Begin(head) : Status::Ok();
}

namespace {

Status FrameNotAuthentic(const FrameHeader& h, const FrameSeal& seal) {
  const std::string mode = SealModeName(seal.mode());
  if (seal.server_side()) {
    return Status(Code::kAuth, std::string("a ") + FrameTypeName(h.type) + " frame does not carry the " + mode +
                                   " of the client that logged in (relayed, replayed or injected)");
  }
  return Status(Code::kIntegrity, std::string("a ") + FrameTypeName(h.type) +
                                      " frame does not verify under this connection's key (" + mode +
                                      "): altered, replayed or injected on the way");
}

}  // namespace

Status RecvTag(Socket& s, const FrameHeader& h, Deadline d) {
  FrameSeal* seal = s.seal();
  if (seal == nullptr) return Status::Ok();
  uint8_t tag[kFrameTagBytes];
  RLB_RETURN_IF_ERROR(s.RecvAll(tag, kFrameTagBytes, d));
  return seal->recv().Check(tag) ? Status::Ok() : FrameNotAuthentic(h, *seal);
}

Status RecvBody(Socket& s, const FrameHeader& h, std::string* body, Deadline d) {
  // Memory follows the bytes that arrive, a piece at a time, not the length a header
  // claims: a body that is announced large but never sent (or whose tag will not verify)
  // costs at most a piece more than what was actually received.
  body->clear();
  for (size_t done = 0; done < h.length;) {
    const size_t piece = std::min<size_t>(h.length - done, kBodyPieceBytes);
    body->resize(done + piece);
    RLB_RETURN_IF_ERROR(s.RecvAll(&(*body)[done], piece, d));
    done += piece;
  }
  FrameSeal* seal = s.seal();
  if (seal == nullptr) return Status::Ok();
  auto* p = reinterpret_cast<uint8_t*>(&(*body)[0]);
  RLB_RETURN_IF_ERROR(seal->recv().Cover(p, p, h.length));
  return RecvTag(s, h, d);
}

Status RecvExpected(Socket& s, FrameType expected, FrameHeader* h, std::string* body, Deadline d) {
  RLB_RETURN_IF_ERROR(RecvHeader(s, h, d));
  // The type is checked before the body is read, so a frame of another type cannot make
  // us allocate that type's (larger) bound.
  if (h->type != expected && h->type != FrameType::kError) {
    return Status(Code::kProtocol, std::string("expected a ") + FrameTypeName(expected) +
                                       " frame, got " + FrameTypeName(h->type));
  }
  RLB_RETURN_IF_ERROR(RecvBody(s, *h, body, d));
  if (h->type == FrameType::kError) {
    return DecodeErrorBody(reinterpret_cast<const uint8_t*>(body->data()), body->size());
  }
  return Status::Ok();
}

}  // namespace rlboost
