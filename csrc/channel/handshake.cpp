// Login (wire format 4): client proof first, HKDF-derived proofs and frame keys over the
// whole exchange (see handshake.h).
#include "channel/handshake.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/bytes.h"
#include "common/frame.h"
#include "common/random.h"
#include "common/sha256.h"
#include "channel/frame_io.h"
#include "channel/peer_process.h"

namespace rlboost {
namespace {

constexpr char kClientLabel[] = "rlboost-v4 client proof";
constexpr char kServerLabel[] = "rlboost-v4 server proof";
constexpr char kKeysLabel[] = "rlboost-v4 frame keys";
constexpr size_t kHelloBytes = kNonceBytes + 8 + 4;

// Hello flags: what the client asks for and can do.
constexpr uint32_t kWantsAead = 1;   // its policy asks to seal this connection
constexpr uint32_t kCanAead = 2;     // it was built with AES-256-GCM
constexpr uint32_t kRequiresAead = 4;  // its policy is "on"

std::string AsKey(const Digest256& d) { return std::string(reinterpret_cast<const char*>(d.data()), d.size()); }

bool Wants(EncryptPolicy p, bool peer_loopback) {
  return p == EncryptPolicy::kOn || (p == EncryptPolicy::kAuto && !peer_loopback);
}

// HKDF-Extract with both nonces as the salt: every login has its own pseudo-random key.
Digest256 Extract(const std::string& secret, const std::string& hello, const std::string& challenge) {
  std::string salt = hello.substr(0, kNonceBytes) + challenge;
  return HmacSha256(salt, secret.data(), secret.size());
}

Digest256 Mac(const Digest256& prk, const char* label, const std::string& a, const std::string& b,
              const std::string& c = "") {
  std::string msg = std::string(label) + a + b + c;
  return HmacSha256(AsKey(prk), msg.data(), msg.size());
}

// HKDF-Expand over the whole login: client-to-server key, then server-to-client key.
void FrameKeys(const Digest256& prk, const std::string& hello, const std::string& challenge,
               const std::string& proof, const std::string& welcome, Key256* c2s, Key256* s2c) {
  std::string transcript = hello + challenge + proof + welcome;
  Digest256 th = Sha256Of(transcript.data(), transcript.size());
  std::string info = std::string(kKeysLabel) + AsKey(th);
  std::string m1 = info + '\x01';
  Digest256 t1 = HmacSha256(AsKey(prk), m1.data(), m1.size());
  std::string m2 = AsKey(t1) + info + '\x02';
  Digest256 t2 = HmacSha256(AsKey(prk), m2.data(), m2.size());
  std::copy(t1.begin(), t1.end(), c2s->begin());
  std::copy(t2.begin(), t2.end(), s2c->begin());
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

std::string Identity(const PeerIdentity& id) {
  std::string out;
  ByteWriter w(&out);
  w.U64(id.server_id);
  w.Raw(id.host_key.data(), id.host_key.size());
  w.U32(id.pid);
  w.U32(static_cast<uint32_t>(id.mode));
  return out;
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

namespace {

Status ParseWelcome(const std::string& body, PeerIdentity* server, std::string* signed_part, uint8_t proof[kMacBytes]) {
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  uint32_t mode = 0;
  RLB_RETURN_IF_ERROR(r.U64(&server->server_id));
  RLB_RETURN_IF_ERROR(r.Raw(server->host_key.data(), server->host_key.size()));
  RLB_RETURN_IF_ERROR(r.U32(&server->pid));
  RLB_RETURN_IF_ERROR(r.U32(&mode));
  RLB_RETURN_IF_ERROR(r.Raw(proof, kMacBytes));
  RLB_RETURN_IF_ERROR(r.ExpectEnd());
  if (mode != static_cast<uint32_t>(SealMode::kMac) && mode != static_cast<uint32_t>(SealMode::kAead)) {
    return Status(Code::kProtocol, "welcome names an unknown frame mode");
  }
  server->mode = static_cast<SealMode>(mode);
  *signed_part = body.substr(0, body.size() - kMacBytes);
  return Status::Ok();
}

// An error frame during the login carries no MAC: it is reported as unverified, and only
// as the refusals an honest server sends there (a wrong secret, a malformed frame).
Status LoginRefused(const Status& st, const FrameHeader& h) {
  if (h.type != FrameType::kError || st.message().rfind("peer reported: ", 0) != 0) return st;
  const Code code = st.code() == Code::kAuth ? Code::kAuth : Code::kProtocol;
  return Status(code, "the source refused the login (an unauthenticated reply, which anyone on the path could "
                      "have sent): " + st.message());
}

Status RecvLoginFrame(Socket& s, FrameType expected, std::string* body, Deadline d) {
  FrameHeader h;
  h.type = expected;  // stays so unless a whole header arrived
  Status st = RecvExpected(s, expected, &h, body, d);
  return st.ok() ? st : LoginRefused(st, h);
}

}  // namespace

Status ClientHandshake(Socket& s, const std::string& secret, EncryptPolicy policy, Deadline d,
                       PeerIdentity* server, LoginMode* mode) {
  uint8_t nonce[kNonceBytes];
  RLB_RETURN_IF_ERROR(SecureRandom(nonce, kNonceBytes));
  const bool loopback = PeerIsLoopback(s.fd());
  const bool seal_anyway = mode != nullptr && mode->seal_loopback;
  const bool wants = Wants(policy, loopback) || (policy == EncryptPolicy::kAuto && seal_anyway);
  std::string hello(reinterpret_cast<const char*>(nonce), kNonceBytes);
  ByteWriter w(&hello);
  w.U64(LocalClientId());
  w.U32((wants ? kWantsAead : 0) | (AeadBuilt() ? kCanAead : 0) | (policy == EncryptPolicy::kOn ? kRequiresAead : 0));
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kHello, 0, 0, hello, d));
  std::string challenge, body;
  RLB_RETURN_IF_ERROR(RecvLoginFrame(s, FrameType::kChallenge, &challenge, d));
  if (challenge.size() != kNonceBytes) return Status(Code::kProtocol, "challenge has the wrong size");
  const Digest256 prk = Extract(secret, hello, challenge);
  const std::string proof = AsKey(Mac(prk, kClientLabel, hello, challenge));
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kAuth, 0, 0, proof, d));
  RLB_RETURN_IF_ERROR(RecvLoginFrame(s, FrameType::kWelcome, &body, d));
  std::string identity;
  uint8_t server_proof[kMacBytes];
  RLB_RETURN_IF_ERROR(ParseWelcome(body, server, &identity, server_proof));
  Digest256 want = Mac(prk, kServerLabel, hello, challenge, identity);
  if (!ConstantTimeEqual(want.data(), server_proof, kMacBytes)) {
    return Status(Code::kAuth, "the server's welcome does not carry its proof of the shared secret: it does not "
                               "know the secret (check RLBOOST_SECRET), or the welcome was altered on the way");
  }
  if (server->mode == SealMode::kAead && !AeadBuilt()) {
    return Status(Code::kProtocol, "the server chose AES-256-GCM, which this build lacks");
  }
  if (policy == EncryptPolicy::kOn && server->mode != SealMode::kAead) {
    return Status(Code::kAuth, "the source does not encrypt (transfer.encrypt=on here; its build lacks "
                               "libcrypto)");
  }
  // "auto" leaves a loopback connection MACed only when its other end is the source
  // process itself: a relay on this host (which passed the login along) would otherwise
  // read every byte. Anything else is logged in again, sealed.
  // (Asked again, a source that still answers MACed cannot seal: as off loopback, its
  // signed choice stands.)
  // (A source on another host reached through loopback, a port forward, sees a peer off
  // its loopback and asks to seal itself.)
  if (policy == EncryptPolicy::kAuto && loopback && !seal_anyway && server->mode == SealMode::kMac && AeadBuilt() &&
      server->host_key == LocalHostKey() && !PeerSocketHeldBy(s.fd(), server->pid)) {
    if (mode != nullptr) mode->seal_loopback = true;
    return Status(Code::kPeerLost, "the loopback peer is not the source process itself (a relay on this host): "
                                   "logging in again, sealed");
  }
  Key256 c2s, s2c;
  FrameKeys(prk, hello, challenge, proof, identity, &c2s, &s2c);
  std::shared_ptr<FrameSeal> seal;
  RLB_RETURN_IF_ERROR(FrameSeal::Create(server->mode, c2s, s2c, false, &seal));
  s.set_seal(std::move(seal));
  return Status::Ok();
}

ServerLogin::ServerLogin(const std::string& secret, const PeerIdentity& self, EncryptPolicy policy,
                         bool peer_loopback)
    : secret_(secret), self_(self), policy_(policy), peer_loopback_(peer_loopback) {}

Status ServerLogin::OnHello(const std::string& body, std::string* challenge) {
  if (body.size() != kHelloBytes) return Status(Code::kProtocol, "hello has the wrong size");
  hello_ = body;
  std::memcpy(&client_id_, body.data() + kNonceBytes, 8);
  std::memcpy(&flags_, body.data() + kNonceBytes + 8, 4);
  challenge_.resize(kNonceBytes);
  RLB_RETURN_IF_ERROR(SecureRandom(&challenge_[0], kNonceBytes));
  *challenge = challenge_;
  return Status::Ok();
}

Status ServerLogin::OnAuth(const std::string& body) {
  if (body.size() != kMacBytes) return Status(Code::kProtocol, "auth has the wrong size");
  prk_ = Extract(secret_, hello_, challenge_);
  Digest256 want = Mac(prk_, kClientLabel, hello_, challenge_);
  if (!ConstantTimeEqual(want.data(), reinterpret_cast<const uint8_t*>(body.data()), kMacBytes)) {
    return Status(Code::kAuth, "wrong shared secret");
  }
  proof_ = body;
  const bool asked = Wants(policy_, peer_loopback_) || (flags_ & kWantsAead) != 0;
  const bool both_can = AeadBuilt() && (flags_ & kCanAead) != 0;
  self_.mode = asked && both_can ? SealMode::kAead : SealMode::kMac;
  if (self_.mode != SealMode::kAead && policy_ == EncryptPolicy::kOn) {
    return Status(Code::kAuth, "this server requires encryption (transfer.encrypt=on) and the client's build "
                               "lacks libcrypto");
  }
  if (self_.mode != SealMode::kAead && (flags_ & kRequiresAead) != 0) {
    return Status(Code::kAuth, "the client requires encryption (transfer.encrypt=on) and this server's build "
                               "lacks libcrypto");
  }
  return Status::Ok();
}

std::string ServerLogin::Welcome() {
  welcome_ = Identity(self_);
  // Only now, to a client that proved it holds the secret, does the server prove itself.
  return welcome_ + AsKey(Mac(prk_, kServerLabel, hello_, challenge_, welcome_));
}

Status ServerLogin::Seal(std::shared_ptr<FrameSeal>* out) const {
  Key256 c2s, s2c;
  FrameKeys(prk_, hello_, challenge_, proof_, welcome_, &c2s, &s2c);
  return FrameSeal::Create(self_.mode, s2c, c2s, true, out);
}

Status ServerHandshake(Socket& s, const std::string& secret, const PeerIdentity& self, EncryptPolicy policy,
                       Deadline d, const std::function<bool(uint64_t)>& admit) {
  ServerLogin login(secret, self, policy, PeerIsLoopback(s.fd()));
  FrameHeader h;
  std::string body, challenge;
  RLB_RETURN_IF_ERROR(RecvExpected(s, FrameType::kHello, &h, &body, d));
  RLB_RETURN_IF_ERROR(login.OnHello(body, &challenge));
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kChallenge, 0, 0, challenge, d));
  RLB_RETURN_IF_ERROR(RecvExpected(s, FrameType::kAuth, &h, &body, d));
  RLB_RETURN_IF_ERROR(login.OnAuth(body));
  if (admit && !admit(login.client_id())) return Status(Code::kPeerLost, "no connection slot for this peer");
  std::string welcome = login.Welcome();
  std::shared_ptr<FrameSeal> seal;
  RLB_RETURN_IF_ERROR(login.Seal(&seal));
  RLB_RETURN_IF_ERROR(SendFrame(s, FrameType::kWelcome, 0, 0, welcome, d));
  s.set_seal(std::move(seal));
  return Status::Ok();
}

}  // namespace rlboost
