// Which process holds the other end of a loopback TCP connection: what lets the "auto"
// encryption rule tell the source process itself from a relay on the same host that
// passed its login along (both look like a loopback peer).
#pragma once

#include <cstdint>

namespace rlboost {

// True when process `pid` (in this pid namespace) holds the socket at the other end of
// the connected TCP socket `fd`, found through a sock_diag lookup (or /proc/net/tcp{,6})
// and /proc/<pid>/fd.
// False when it does not, or when that cannot be read (then the caller seals).
bool PeerSocketHeldBy(int fd, uint32_t pid);

}  // namespace rlboost
