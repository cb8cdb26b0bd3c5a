// Frame I/O over a Socket: headers are validated (magic, format, type, bound) before the
// body is allocated, and an error frame from the peer becomes the Status it carries.
#pragma once

#include <string>

#include "common/deadline.h"
#include "common/frame.h"
#include "channel/socket.h"

namespace rlboost {

Status SendFrame(Socket& s, FrameType type, uint32_t status, uint64_t request_id,
                 const void* body, size_t n, Deadline d);
inline Status SendFrame(Socket& s, FrameType type, uint32_t status, uint64_t request_id,
                        const std::string& body, Deadline d) {
  return SendFrame(s, type, status, request_id, body.data(), body.size(), d);
}
Status SendError(Socket& s, const Status& err, uint64_t request_id, Deadline d);

Status RecvHeader(Socket& s, FrameHeader* h, Deadline d);
// After a frame's body has been received (and given to the seal's receiving side): reads
// and checks its tag. OK at once on a connection not sealed yet (during the login).
Status RecvTag(Socket& s, const FrameHeader& h, Deadline d);
Status RecvBody(Socket& s, const FrameHeader& h, std::string* body, Deadline d);

// Receives one frame that must be `expected`; an error frame becomes its Status, any
// other type is a protocol error.
Status RecvExpected(Socket& s, FrameType expected, FrameHeader* h, std::string* body, Deadline d);

}  // namespace rlboost
