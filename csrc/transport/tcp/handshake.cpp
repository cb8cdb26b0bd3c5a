// HMAC challenge-response, client first: client nonce -> server nonce -> client proof ->
// welcome + server proof; then a session key from both nonces MACs manifest replies.
#include "transport/tcp/handshake.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/bytes.h"
#include "common/frame.h"
#include "common/random.h"
#include "common/sha256.h"
#include "transport/tcp/frame_io.h"

namespace rlboost {
namespace {

constexpr char kServerLabel[] = "rlboost-server-proof-v3";
constexpr char kClientLabel[] = "rlboost-client-proof-v3";
constexpr char kSessionLabel[] = "rlboost-session-key-v3";
constexpr char kManifestLabel[] = "rlboost-manifest-mac-v3";

// What both proofs and the session key bind: the client's hello and the server's nonce.
struct Exchange {
  uint8_t client_nonce[kNonceBytes];
  uint8_t server_nonce[kNonceBytes];
  uint64_t client_id = 0;
};

Digest256 Proof(const std::string& secret, const char* label, const Exchange& x) {
  std::string msg(label);
  msg.append(reinterpret_cast<const char*>(x.client_nonce), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(x.server_nonce), kNonceBytes);
  ByteWriter(&msg).U64(x.client_id);
  return HmacSha256(secret, msg.data(), msg.size());
}

std::string Hello(const Exchange& x) {
  std::string body(reinterpret_cast<const char*>(x.client_nonce), kNonceBytes);
  ByteWriter(&body).U64(x.client_id);
  return body;
}

std::string ReadLink(const char* path) {
  char buf[256];
  ssize_t n = readlink(path, buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::array<uint8_t, 16> ComputeHostKey() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string material = ss.str() + "|" + ReadLink("/proc/self/ns/pid");
  Digest256 d = Sha256Of(material.data(), material.size());
  std::array<uint8_t, 16> key;
  std::copy(d.begin(), d.begin() + 16, key.begin());
  return key;
}

}  // namespace

const std::array<uint8_t, 16>& LocalHostKey() {
  static const std::array<uint8_t, 16> key = ComputeHostKey();
  return key;
}

uint64_t LocalClientId() {
  static std::atomic<uint64_t> id{0};
  static std::atomic<pid_t> owner{0};
  if (owner.load() != getpid()) {
    uint64_t fresh = 0;
    while (fresh == 0 && SecureRandom(&fresh, sizeof(fresh)).ok()) {
    }
    id = fresh;
    owner = getpid();
  }
  return id;
}

Status ClientHandshake(Socket& s, const std::string& secret, Deadline d, PeerIdentity* server) {
  Exchange x;
  x.client_id = LocalClientId();
  RLB_RETURN_IF_ERROR(SecureRandom(x.client_nonce, kNonceBytes));
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kHello, 0, 0, Hello(x), d));
  FrameHeader h;
  std::string body;
  RLB_RETURN_IF_ERROR(RecvExpected(s, FrameType::kChallenge, &h, &body, d));
  if (body.size() != kNonceBytes) return Status(Code::kProtocol, "challenge has the wrong size");
  std::memcpy(x.server_nonce, body.data(), kNonceBytes);
  Digest256 proof = Proof(secret, kClientLabel, x);
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kAuth, 0, 0, proof.data(), proof.size(), d));
  RLB_RETURN_IF_ERROR(RecvExpected(s, FrameType::kWelcome, &h, &body, d));
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  uint8_t server_proof[kMacBytes];
  RLB_RETURN_IF_ERROR(r.U64(&server->server_id));
  RLB_RETURN_IF_ERROR(r.Raw(server->host_key.data(), server->host_key.size()));
  RLB_RETURN_IF_ERROR(r.U32(&server->pid));
  RLB_RETURN_IF_ERROR(r.Raw(server_proof, kMacBytes));
  RLB_RETURN_IF_ERROR(r.ExpectEnd());
  Digest256 want = Proof(secret, kServerLabel, x);
  if (!ConstantTimeEqual(want.data(), server_proof, kMacBytes)) {
    return Status(Code::kAuth, "the server does not know the shared secret (check RLBOOST_SECRET)");
  }
  server->session_key = Proof(secret, kSessionLabel, x);
  return Status::Ok();
}

Status ServerHandshake(Socket& s, const std::string& secret, const PeerIdentity& self, Deadline d,
                       const std::function<bool(uint64_t)>& admit, SessionKey* session_key) {
  FrameHeader h;
  std::string body;
  Exchange x;
  RLB_RETURN_IF_ERROR(RecvExpected(s, FrameType::kHello, &h, &body, d));
  if (body.size() != kNonceBytes + 8) return Status(Code::kProtocol, "hello has the wrong size");
  std::memcpy(x.client_nonce, body.data(), kNonceBytes);
  std::memcpy(&x.client_id, body.data() + kNonceBytes, 8);
  RLB_RETURN_IF_ERROR(SecureRandom(x.server_nonce, kNonceBytes));
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kChallenge, 0, 0, x.server_nonce, kNonceBytes, d));
  RLB_RETURN_IF_ERROR(RecvExpected(s, FrameType::kAuth, &h, &body, d));
  if (body.size() != kMacBytes) return Status(Code::kProtocol, "auth has the wrong size");
  Digest256 want = Proof(secret, kClientLabel, x);
  if (!ConstantTimeEqual(want.data(), reinterpret_cast<const uint8_t*>(body.data()), kMacBytes)) {
    return Status(Code::kAuth, "wrong shared secret");
  }
  if (admit && !admit(x.client_id)) return Status(Code::kPeerLost, "no connection slot for this peer");
  // Only now, to a client that proved it holds the secret, does the server prove itself.
  Digest256 proof = Proof(secret, kServerLabel, x);
  std::string welcome;
  ByteWriter w(&welcome);
  w.U64(self.server_id);
  w.Raw(self.host_key.data(), self.host_key.size());
  w.U32(self.pid);
  w.Raw(proof.data(), proof.size());
  *session_key = Proof(secret, kSessionLabel, x);
  return SendFrame(s, FrameType::kWelcome, 0, 0, welcome, d);
}

namespace {

Digest256 ManifestMac(const SessionKey& key, uint64_t request_id, const char* data, size_t n) {
  std::string msg(kManifestLabel);
  ByteWriter(&msg).U64(request_id);
  msg.append(data, n);
  return HmacSha256(std::string(reinterpret_cast<const char*>(key.data()), key.size()), msg.data(), msg.size());
}

}  // namespace

std::string SealManifest(const SessionKey& key, uint64_t request_id, std::string encoded) {
  Digest256 mac = ManifestMac(key, request_id, encoded.data(), encoded.size());
  encoded.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return encoded;
}

Status OpenManifest(const SessionKey& key, uint64_t request_id, std::string* reply) {
  if (reply->size() < kMacBytes) return Status(Code::kProtocol, "manifest reply is shorter than its MAC");
  const size_t n = reply->size() - kMacBytes;
  Digest256 want = ManifestMac(key, request_id, reply->data(), n);
  if (!ConstantTimeEqual(want.data(), reinterpret_cast<const uint8_t*>(reply->data()) + n, kMacBytes)) {
    return Status(Code::kAuth, "manifest MAC does not verify: altered on the way, or not from the "
                               "authenticated source");
  }
  reply->resize(n);
  return Status::Ok();
}

}  // namespace rlboost
