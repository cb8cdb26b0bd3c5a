// Bindings for the request-state codec and KV page gather/scatter.
#include "bindings/bind.h"

namespace rlboost {
void BindMigration(pybind11::module_& m) { (void)m; }
}  // namespace rlboost
