// One Bind* function per native component; module.cpp calls them all.
#pragma once
#include <pybind11/pybind11.h>

namespace rlboost {
void BindErrors(pybind11::module_& m);
void BindTransfer(pybind11::module_& m);   // csrc/bindings/transfer.cpp
void BindChecksums(pybind11::module_& m);  // csrc/bindings/checksums.cpp
void BindMigration(pybind11::module_& m);  // csrc/bindings/migration.cpp
void BindDelta(pybind11::module_& m);      // csrc/bindings/delta.cpp
}  // namespace rlboost
