// Definitions of epoll_create1 and EVP_CIPHER_CTX_new in the test executable take the
// place of the C library's and libcrypto's for the statically linked core; each forwards to
// the real function (found with dlsym(RTLD_NEXT)) unless its failure was asked for.
#include "fault_injection.h"

#include <dlfcn.h>

#include <cerrno>

namespace rlboost::testing {
std::atomic<bool> fail_epoll_create{false};
std::atomic<bool> fail_cipher_context{false};
}  // namespace rlboost::testing

extern "C" int epoll_create1(int flags) {
  if (rlboost::testing::fail_epoll_create.load()) {
    errno = EMFILE;
    return -1;
  }
  using Fn = int (*)(int);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "epoll_create1"));
  return real(flags);
}

#ifdef RLBOOST_HAS_AEAD
extern "C" void* EVP_CIPHER_CTX_new(void) {
  if (rlboost::testing::fail_cipher_context.load()) return nullptr;
  using Fn = void* (*)();
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "EVP_CIPHER_CTX_new"));
  return real();
}
#endif
