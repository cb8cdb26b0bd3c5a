// Connect-time mutual authentication and a per-connection MAC key.
//
// hello(client nonce, client id) -> challenge(server nonce) -> auth(client proof) ->
// welcome(identity, server proof). The client id names the client's process, so a server
// can cap the connections of one peer; it is covered by both proofs. The client proves first: a server answers a stranger
// with nothing but a fresh nonce, so nothing it sends lets a stranger test guesses of a
// weak secret offline. Proofs are HMAC-SHA256(secret, role label | both nonces), so a
// recorded exchange cannot be replayed and one side's proof cannot be reflected.
//
// Both sides then derive session_key = HMAC-SHA256(secret, key label | both nonces) and
// MAC the manifest reply with it (request id included). The manifest carries a tag of
// every chunk (weights/chunk_tag.h), which the puller verifies, so an on-path swap of the
// manifest or of any chunk's bytes is caught (AuthError, resp. IntegrityError) while the
// bulk data path stays plain bytes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "common/deadline.h"
#include "transport/tcp/socket.h"

namespace rlboost {

using SessionKey = std::array<uint8_t, 32>;
constexpr size_t kMacBytes = 32;

// Who a server is: lets a puller tell same-host sources (shared memory) and itself.
struct PeerIdentity {
  uint64_t server_id = 0;
  std::array<uint8_t, 16> host_key{};  // equal for processes that can share memory
  uint32_t pid = 0;
  SessionKey session_key{};  // the client side's key for this connection (not sent)
};

// This process's host key (boot id + pid namespace).
const std::array<uint8_t, 16>& LocalHostKey();
// This process's client id: random, drawn again in a forked child.
uint64_t LocalClientId();

// Fills *server, including its session_key. kAuth when either side lacks the secret.
// The whole exchange must finish by `d`, however the peer paces its bytes.
Status ClientHandshake(Socket& s, const std::string& secret, Deadline d, PeerIdentity* server);
// admit: asked once the client has proven itself, with its client id; false refuses it
// (kPeerLost, before the server proves itself).
Status ServerHandshake(Socket& s, const std::string& secret, const PeerIdentity& self, Deadline d,
                       const std::function<bool(uint64_t client_id)>& admit, SessionKey* session_key);

// A manifest reply with this connection's MAC appended (bound to the request id).
std::string SealManifest(const SessionKey& key, uint64_t request_id, std::string encoded);
// Checks and strips that MAC: kAuth when it does not verify (tampered on the way, or not
// sent by the authenticated peer).
Status OpenManifest(const SessionKey& key, uint64_t request_id, std::string* reply);

}  // namespace rlboost
