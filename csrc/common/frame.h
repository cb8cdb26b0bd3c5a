// The weight-transfer wire format: every message is a 24-byte little-endian header
// (magic, format version, type, status, body length, request id) and a body whose
// length is checked against a per-type bound before anything is allocated or read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace rlboost {

constexpr uint32_t kWireMagic = 0x57424C52u;  // bytes "RLBW"
// 2: client proves first, MACed manifests. 3: chunks checked by keyed tags (no longer
// crc32c), the client names itself in the hello. 4: every frame after the login MACed or
// sealed under keys bound to that login (channel/frame_seal.h).
constexpr uint16_t kWireFormatVersion = 4;
constexpr size_t kFrameHeaderBytes = 24;

constexpr uint32_t kMinChunkBytes = 4096;
constexpr uint32_t kMaxChunkBytes = 256u << 20;
constexpr uint32_t kMaxChunks = 1u << 22;  // 16-byte tags: a manifest stays under 64 MiB + meta
constexpr uint32_t kMaxManifestMeta = 64u << 20;
constexpr uint32_t kMaxErrorMessage = 1024;
constexpr uint32_t kChunkPrefixBytes = 16;  // version i64, index u32, reserved u32
constexpr size_t kNonceBytes = 32;

enum class FrameType : uint16_t {
  kHello = 1,            // client: nonce
  kChallenge = 2,        // server: nonce
  kAuth = 3,             // client: proof that it knows the secret
  kWelcome = 4,          // server: identity (host, process, server id), proof that it knows the secret
  kManifestRequest = 5,  // client: version (-1 = latest)
  kManifest = 6,         // server: encoded manifest
  kChunkRequest = 7,     // client: version, chunk index
  kChunk = 8,            // server: prefix + chunk bytes (or a not-held status)
  kHaveRequest = 9,      // client: version, generation already known, wait ms
  kHave = 10,            // server: generation, held and pending chunk bitmaps
  kShmOpenRequest = 11,  // client: version
  kShmOpen = 12,         // server: where the shared region lives
  kShmClose = 13,        // client: version (releases the lease)
  kError = 14,           // either side: wire error code + message
  kUcxOpenRequest = 15,  // client: version
  kUcxOpen = 16,         // server: UCX worker address + rkey for the region
};

// The status field of responses.
enum class ReplyStatus : uint32_t {
  kOk = 0,
  kNotHeld = 1,         // a relay does not hold that chunk (yet): ask another source
  kUnknownVersion = 2,  // never published here, or already retired
  kUnavailable = 3,     // the transport cannot serve this version (e.g. not in shared memory)
  kBusy = 4,            // the egress cap cannot start this chunk before its deadline
};

struct FrameHeader {
  FrameType type = FrameType::kError;
  uint32_t status = 0;
  uint32_t length = 0;
  uint64_t request_id = 0;
};

void EncodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]);
// Checks magic, format version, type and the body bound for that type.
Status DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes], FrameHeader* out);
// Whether a client may send this type to a server (servers read nothing else).
bool IsClientFrame(FrameType type);
// The largest body a frame of this type may carry.
uint64_t MaxFrameBody(FrameType type);
const char* FrameTypeName(FrameType type);

// Bodies that carry only a version (manifest, shm-open, shm-close, ucx-open requests).
std::string EncodeVersionBody(int64_t version);
Status DecodeVersionBody(const std::string& body, int64_t* version);

// Untrusted bytes as printable ASCII: anything else becomes a \xNN escape.
std::string PrintableText(const uint8_t* p, size_t n);

// Error frames carry a Code so the receiving side raises the same typed error. The
// decoded message is PrintableText, whatever the peer sent.
std::string EncodeErrorBody(const Status& s);
Status DecodeErrorBody(const uint8_t* body, size_t n);

}  // namespace rlboost
