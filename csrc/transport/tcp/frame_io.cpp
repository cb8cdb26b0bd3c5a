// Frame send/receive helpers shared by the server, the control session and TCP streams.
#include "transport/tcp/frame_io.h"

namespace rlboost {

Status SendFrame(Socket& s, FrameType type, uint32_t status, uint64_t request_id,
                 const void* body, size_t n, Deadline d) {
  FrameHeader h;
  h.type = type;
  h.status = status;
  h.length = static_cast<uint32_t>(n);
  h.request_id = request_id;
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  struct iovec iov[2] = {{head, kFrameHeaderBytes}, {const_cast<void*>(body), n}};
  return s.SendV(iov, n > 0 ? 2 : 1, d);
}

Status SendError(Socket& s, const Status& err, uint64_t request_id, Deadline d) {
  return SendFrame(s, FrameType::kError, 0, request_id, EncodeErrorBody(err), d);
}

Status RecvHeader(Socket& s, FrameHeader* h, Deadline d) {
  uint8_t head[kFrameHeaderBytes];
  RLB_RETURN_IF_ERROR(s.RecvAll(head, kFrameHeaderBytes, d));
  return DecodeFrameHeader(head, h);
}

Status RecvBody(Socket& s, const FrameHeader& h, std::string* body, Deadline d) {
  body->resize(h.length);  // bounded by DecodeFrameHeader
  if (h.length == 0) return Status::Ok();
  return s.RecvAll(&(*body)[0], h.length, d);
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
