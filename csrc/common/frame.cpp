// Frame header encoding and validation, and error-frame bodies.
#include "common/frame.h"

#include <cstring>

#include "common/bytes.h"

namespace rlboost {
namespace {

// Wire error codes are fixed numbers, independent of the in-process Code enum order.
uint32_t WireCodeOf(Code c) {
  switch (c) {
    case Code::kProtocol: return 1;
    case Code::kAuth: return 2;
    case Code::kUnknownVersion: return 3;
    case Code::kTimeout: return 4;
    case Code::kInvalidArgument: return 5;
    case Code::kClosed: return 6;
    default: return 7;
  }
}

Code CodeOfWire(uint32_t w) {
  switch (w) {
    case 1: return Code::kProtocol;
    case 2: return Code::kAuth;
    case 3: return Code::kUnknownVersion;
    case 4: return Code::kTimeout;
    case 5: return Code::kInvalidArgument;
    case 6: return Code::kClosed;
    default: return Code::kIo;
  }
}

}  // namespace

bool IsClientFrame(FrameType type) {
  switch (type) {
    case FrameType::kHello:
    case FrameType::kAuth:
    case FrameType::kManifestRequest:
    case FrameType::kChunkRequest:
    case FrameType::kHaveRequest:
    case FrameType::kShmOpenRequest:
    case FrameType::kShmClose:
    case FrameType::kUcxOpenRequest:
      return true;
    default:
      return false;
  }
}

uint64_t MaxFrameBody(FrameType type) {
  switch (type) {
    case FrameType::kHello: return kNonceBytes + 8 + 4;  // nonce, client id, flags
    case FrameType::kChallenge: return 2 * kNonceBytes;
    case FrameType::kAuth: return kNonceBytes;
    case FrameType::kWelcome: return 256;
    case FrameType::kManifestRequest: return 8;
    case FrameType::kManifest: return 128 + 16ull * kMaxChunks + kMaxManifestMeta;
    case FrameType::kChunkRequest: return 12;
    case FrameType::kChunk: return kChunkPrefixBytes + uint64_t{kMaxChunkBytes};
    case FrameType::kHaveRequest: return 20;
    case FrameType::kHave: return 24 + 2 * (kMaxChunks / 8);
    case FrameType::kShmOpenRequest: return 8;
    case FrameType::kShmOpen: return 64;
    case FrameType::kShmClose: return 8;
    case FrameType::kError: return 4 + kMaxErrorMessage;
    case FrameType::kUcxOpenRequest: return 8;
    case FrameType::kUcxOpen: return 64 * 1024;
  }
  return 0;
}

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello: return "hello";
    case FrameType::kChallenge: return "challenge";
    case FrameType::kAuth: return "auth";
    case FrameType::kWelcome: return "welcome";
    case FrameType::kManifestRequest: return "manifest-request";
    case FrameType::kManifest: return "manifest";
    case FrameType::kChunkRequest: return "chunk-request";
    case FrameType::kChunk: return "chunk";
    case FrameType::kHaveRequest: return "have-request";
    case FrameType::kHave: return "have";
    case FrameType::kShmOpenRequest: return "shm-open-request";
    case FrameType::kShmOpen: return "shm-open";
    case FrameType::kShmClose: return "shm-close";
    case FrameType::kError: return "error";
    case FrameType::kUcxOpenRequest: return "ucx-open-request";
    case FrameType::kUcxOpen: return "ucx-open";
  }
  return "unknown";
}

void EncodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]) {
  uint16_t type = static_cast<uint16_t>(h.type);
  std::memcpy(out, &kWireMagic, 4);
  std::memcpy(out + 4, &kWireFormatVersion, 2);
  std::memcpy(out + 6, &type, 2);
  std::memcpy(out + 8, &h.status, 4);
  std::memcpy(out + 12, &h.length, 4);
  std::memcpy(out + 16, &h.request_id, 8);
}

Status DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes], FrameHeader* out) {
  ByteReader r(in, kFrameHeaderBytes);
  uint32_t magic = 0;
  uint16_t format = 0, type = 0;
  RLB_RETURN_IF_ERROR(r.U32(&magic));
  RLB_RETURN_IF_ERROR(r.U16(&format));
  RLB_RETURN_IF_ERROR(r.U16(&type));
  RLB_RETURN_IF_ERROR(r.U32(&out->status));
  RLB_RETURN_IF_ERROR(r.U32(&out->length));
  RLB_RETURN_IF_ERROR(r.U64(&out->request_id));
  if (magic != kWireMagic) return Status(Code::kProtocol, "bad frame magic (not an rlboost peer?)");
  if (format != kWireFormatVersion) {
    return Status(Code::kProtocol, "unsupported wire format version " + std::to_string(format) +
                                       " (this build speaks " +
                                       std::to_string(kWireFormatVersion) + ")");
  }
  out->type = static_cast<FrameType>(type);
  uint64_t bound = MaxFrameBody(out->type);
  if (bound == 0) return Status(Code::kProtocol, "unknown frame type " + std::to_string(type));
  if (out->length > bound) {
    return Status(Code::kProtocol, std::string("frame body of ") + std::to_string(out->length) +
                                       " bytes exceeds the bound for " +
                                       FrameTypeName(out->type) + " (" + std::to_string(bound) +
                                       ")");
  }
  return Status::Ok();
}

std::string EncodeVersionBody(int64_t version) {
  std::string body;
  ByteWriter(&body).I64(version);
  return body;
}

Status DecodeVersionBody(const std::string& body, int64_t* version) {
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  RLB_RETURN_IF_ERROR(r.I64(version));
  return r.ExpectEnd();
}

std::string EncodeErrorBody(const Status& s) {
  std::string body;
  ByteWriter w(&body);
  w.U32(WireCodeOf(s.code()));
  std::string msg = s.message().substr(0, kMaxErrorMessage);
  w.Raw(msg.data(), msg.size());
  return body;
}

std::string PrintableText(const uint8_t* p, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7F) {
      out.push_back(static_cast<char>(p[i]));
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[p[i] >> 4]);
      out.push_back(kHex[p[i] & 15]);
    }
  }
  return out;
}

Status DecodeErrorBody(const uint8_t* body, size_t n) {
  ByteReader r(body, n);
  uint32_t wire = 0;
  RLB_RETURN_IF_ERROR(r.U32(&wire));
  // A peer's words are untrusted bytes: escaped, so they are always valid text (no
  // decoding error, no terminal control sequence) wherever the message ends up.
  return Status(CodeOfWire(wire), "peer reported: " + PrintableText(body + 4, n - 4));
}

}  // namespace rlboost
