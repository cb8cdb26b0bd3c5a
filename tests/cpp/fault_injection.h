// Failures injected into library calls the native core makes, for tests of its error
// paths: while a flag is set, the next call fails as the real one can.
#pragma once

#include <atomic>

namespace rlboost::testing {

extern std::atomic<bool> fail_epoll_create;   // epoll_create1 -> -1, errno EMFILE
extern std::atomic<bool> fail_cipher_context;  // EVP_CIPHER_CTX_new -> nullptr

}  // namespace rlboost::testing
