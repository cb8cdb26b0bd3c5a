// SecureRandom: getrandom(2), retried on interruption.
#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace rlboost {

Status SecureRandom(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return Status(Code::kIo, std::string("getrandom failed: ") + std::strerror(errno));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace rlboost
