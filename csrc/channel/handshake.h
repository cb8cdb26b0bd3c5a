// Connect-time mutual authentication, and the keys that bind every later frame to it.
//
// hello(client nonce, client id, flags) -> challenge(server nonce) -> auth(client proof)
// -> welcome(server id, host key, pid, mode, server proof). The client proves first: a
// server answers a stranger with nothing but a fresh nonce, so nothing it sends lets a
// stranger test guesses of a weak secret offline. Wire format 4 follows HKDF (RFC 5869)
// over HMAC-SHA256: prk = HMAC(client nonce | server nonce, secret); the client's proof is
// HMAC(prk, label | hello | challenge), the server's covers the welcome's identity and
// mode too, so neither can be replayed, reflected or altered; and the two directions'
// frame keys are expanded from prk over the whole login (both identities, the mode and
// the client's proof). Everything after the login is MACed or sealed under those keys
// (frame_seal.h): a relay that passed the four login frames along learns no key, so
// every request it makes afterwards is refused (AuthError), and every reply it alters is
// caught by the puller (IntegrityError).
//
// The mode: sealed (AES-256-GCM) when either side asks for it (transfer.encrypt "on", or
// "auto" unless the peer is the source process itself, reached over loopback) and both
// can; else MACed. A side set to "on" refuses a connection that would not be sealed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/deadline.h"
#include "channel/frame_seal.h"
#include "channel/socket.h"

namespace rlboost {

constexpr size_t kMacBytes = 32;

// Who a server is: lets a puller tell same-host sources (shared memory) and itself.
struct PeerIdentity {
  uint64_t server_id = 0;
  std::array<uint8_t, 16> host_key{};  // equal for processes that can share memory
  uint32_t pid = 0;
  SealMode mode = SealMode::kMac;  // of the connection this identity came with
};

// This process's host key (boot id + pid namespace).
const std::array<uint8_t, 16>& LocalHostKey();
// This process's client id: random, drawn again in a forked child.
uint64_t LocalClientId();

// What a client's login asks beyond its policy. seal_loopback: seal even a loopback
// connection under "auto"; set by ClientHandshake itself when the loopback peer is not
// the source process (a relay on this host), and the login must be made again.
struct LoginMode {
  bool seal_loopback = false;
};

// Fills *server and seals the socket. kAuth when either side lacks the secret (or the
// encryption one side requires cannot be had). The whole exchange must finish by `d`.
// Under "auto" a loopback connection stays MACed only when the welcome's process holds
// the other end of this very connection; otherwise it fails with kPeerLost and sets
// mode->seal_loopback, for a new login on a new connection.
Status ClientHandshake(Socket& s, const std::string& secret, EncryptPolicy policy, Deadline d,
                       PeerIdentity* server, LoginMode* mode = nullptr);

// The server's half of one login, step by step, so a login stage can drive many logins
// without a thread each: OnHello -> (send challenge) -> OnAuth -> (admit) -> Welcome ->
// (send it) -> Seal.
class ServerLogin {
 public:
  ServerLogin(const std::string& secret, const PeerIdentity& self, EncryptPolicy policy, bool peer_loopback);
  Status OnHello(const std::string& body, std::string* challenge);
  // Checks the client's proof and chooses the mode. kAuth when either fails.
  Status OnAuth(const std::string& body);
  uint64_t client_id() const { return client_id_; }
  std::string Welcome();
  // The frame seal for this connection (call after Welcome).
  Status Seal(std::shared_ptr<FrameSeal>* out) const;

 private:
  const std::string secret_;
  PeerIdentity self_;
  EncryptPolicy policy_;
  bool peer_loopback_;
  std::string hello_, challenge_, proof_, welcome_;
  uint64_t client_id_ = 0;
  uint32_t flags_ = 0;
  Digest256 prk_{};
};

// The blocking server login (a thread per login): admit is asked once the client has
// proven itself, with its client id; false refuses it (kPeerLost, before the server
// proves itself).
Status ServerHandshake(Socket& s, const std::string& secret, const PeerIdentity& self, EncryptPolicy policy,
                       Deadline d, const std::function<bool(uint64_t client_id)>& admit);

}  // namespace rlboost
