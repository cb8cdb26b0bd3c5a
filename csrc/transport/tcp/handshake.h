// Connect-time mutual authentication: HMAC-SHA256 challenge-response over fresh nonces
// from both sides, so neither a client nor a server without the shared secret gets past
// the first round trip, and a recorded exchange cannot be replayed.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/deadline.h"
#include "transport/tcp/socket.h"

namespace rlboost {

// Who a server is: lets a puller tell same-host sources (shared memory) and itself.
struct PeerIdentity {
  uint64_t server_id = 0;
  std::array<uint8_t, 16> host_key{};  // equal for processes that can share memory
  uint32_t pid = 0;
};

// This process's host key (boot id + pid namespace).
const std::array<uint8_t, 16>& LocalHostKey();

Status ClientHandshake(Socket& s, const std::string& secret, Deadline d, PeerIdentity* server);
Status ServerHandshake(Socket& s, const std::string& secret, const PeerIdentity& self, Deadline d);

}  // namespace rlboost
