// Bindings for the weight server, puller and transports (filled in by the transfer core).
#include "bindings/bind.h"

namespace rlboost {
void BindTransfer(pybind11::module_& m) { (void)m; }
}  // namespace rlboost
