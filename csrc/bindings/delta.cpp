// Bindings of the delta codec (weights/delta_codec.h): encode, apply and read the header
// of a delta between two versions of a payload. Addresses and byte counts in, as everywhere
// in the native core; the caller keeps the memory alive for the call.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "weights/delta_codec.h"
#include "weights/version_store.h"

namespace py = pybind11;

namespace rlboost {
namespace {

const uint8_t* At(uintptr_t address) { return reinterpret_cast<const uint8_t*>(address); }

py::dict HeaderDict(const DeltaHeader& h) {
  return py::dict(py::arg("base") = h.base, py::arg("target") = h.target, py::arg("total_bytes") = h.total_bytes,
                  py::arg("block_bytes") = h.block_bytes, py::arg("num_blocks") = h.num_blocks);
}

}  // namespace

void BindDelta(py::module_& m) {
  m.def("delta_encode", [](uintptr_t base, uintptr_t target, uint64_t nbytes, int64_t base_version,
                           int64_t target_version, uint32_t block_bytes, int threads) {
        DeltaHeader h;
        h.base = base_version;
        h.target = target_version;
        h.total_bytes = nbytes;
        h.block_bytes = block_bytes;
        EncodedDelta d;
        Status st;
        {
          py::gil_scoped_release release;
          st = EncodeDelta(At(base), At(target), h, threads, &d);
        }
        ThrowIfError(st);
        py::bytes out(nullptr, d.size());
        d.WriteTo(reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out.ptr())));
        const DeltaCounts& c = d.counts();
        return py::make_tuple(out, py::dict(py::arg("same_blocks") = c.same_blocks,
                                            py::arg("sparse_blocks") = c.sparse_blocks,
                                            py::arg("raw_blocks") = c.raw_blocks,
                                            py::arg("changed_words") = c.changed_words));
      }, py::kw_only(), py::arg("base"), py::arg("target"), py::arg("nbytes"), py::arg("base_version"),
      py::arg("target_version"), py::arg("block_bytes") = kDefaultDeltaBlockBytes, py::arg("threads") = 1,
      "(delta bytes, block counts) of the payload at `target` against the one at `base`.");
  m.def("delta_apply", [](uintptr_t delta, uint64_t delta_bytes, uintptr_t base, uintptr_t dst, uint64_t nbytes,
                          int threads) {
        DeltaHeader h;
        Status st;
        {
          py::gil_scoped_release release;
          st = ApplyDelta(At(delta), delta_bytes, At(base), reinterpret_cast<uint8_t*>(dst), nbytes, threads, &h);
        }
        ThrowIfError(st);
        return HeaderDict(h);
      }, py::kw_only(), py::arg("delta"), py::arg("delta_bytes"), py::arg("base"), py::arg("dst"),
      py::arg("nbytes"), py::arg("threads") = 1,
      "Writes base with the delta applied to dst (dst may be base); returns the delta's header. "
      "ProtocolError for a malformed delta (dst is then partly written).");
  m.def("delta_header", [](uintptr_t delta, uint64_t delta_bytes) {
        DeltaHeader h;
        ThrowIfError(ReadDeltaHeader(At(delta), delta_bytes, &h));
        return HeaderDict(h);
      }, py::kw_only(), py::arg("delta"), py::arg("delta_bytes"), "A delta's header, checked.");
  m.attr("DELTA") = py::dict(py::arg("magic") = kDeltaMagic, py::arg("format_version") = kDeltaFormat,
                             py::arg("header_bytes") = kDeltaHeaderBytes,
                             py::arg("block_bytes") = kDefaultDeltaBlockBytes,
                             py::arg("min_block_bytes") = kMinDeltaBlockBytes,
                             py::arg("max_block_bytes") = kMaxDeltaBlockBytes,
                             py::arg("key_bit") = kDeltaKeyBit);
}

}  // namespace rlboost
