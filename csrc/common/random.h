// Unpredictable bytes from the kernel, for authentication nonces and region names.
#pragma once

#include <cstddef>

#include "common/status.h"

namespace rlboost {

Status SecureRandom(void* out, size_t n);

}  // namespace rlboost
