// Bindings for the checksums and keyed hashes of the native core: CRC-32C (the wire
// format's pre-checks, migration codecs), POLYVAL and chunk tags (weights/chunk_tag.h),
// HMAC-SHA256. Exposed so tests can check them against independent references.
#include <pybind11/pybind11.h>

#include <algorithm>

#include "bindings/bind.h"
#include "bindings/buffer_view.h"
#include "common/crc32c.h"
#include "common/polyval.h"
#include "common/sha256.h"
#include "common/status.h"
#include "weights/chunk_tag.h"

namespace py = pybind11;

namespace rlboost {

void BindChecksums(py::module_& m) {
  m.def("crc32c", [](py::object data, uint32_t crc) {
        BufferView view(data, false);
        py::gil_scoped_release release;
        return Crc32cExtend(crc, view.data(), view.size());
      }, py::arg("data"), py::arg("crc") = 0, "CRC-32C of a contiguous buffer, continuing from `crc`.");
  m.def("crc32c_copy", [](py::object dst, py::object src, uint32_t crc, bool streaming) {
        BufferView d(dst, true), s(src, false);
        if (d.size() < s.size()) ThrowIfError(Status(Code::kInvalidArgument, "dst is smaller than src"));
        py::gil_scoped_release release;
        return Crc32cCopy(crc, d.data(), s.data(), s.size(), streaming);
      }, py::arg("dst"), py::arg("src"), py::arg("crc") = 0, py::arg("streaming") = false,
      "Copies src into the start of dst and returns the CRC-32C of src, in one pass.");
  m.def("crc32c_portable", [](py::bytes b) {
        std::string s = b;
        return Crc32cExtendPortable(0, s.data(), s.size());
      }, py::arg("data"));
  m.def("crc32c_uses_hardware", &Crc32cUsesHardware);
  m.def("crc32c_uses_folding", &Crc32cUsesFolding);
  m.def("polyval", [](py::bytes key, py::object data) {
        std::string k = key;
        if (k.size() != 16) ThrowIfError(Status(Code::kInvalidArgument, "key: 16 bytes"));
        Block128 h;
        std::copy(k.begin(), k.end(), h.begin());
        BufferView view(data, false);
        Block128 out;
        {
          py::gil_scoped_release release;
          out = PolyvalOf(PolyvalKey(h), view.data(), view.size());
        }
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      }, py::arg("key"), py::arg("data"), "POLYVAL (RFC 8452) of a buffer, zero-padded to 16 bytes.");
  m.def("polyval_portable", [](py::bytes key, py::bytes data) {
        std::string k = key, d = data;
        if (k.size() != 16) ThrowIfError(Status(Code::kInvalidArgument, "key: 16 bytes"));
        Block128 h;
        std::copy(k.begin(), k.end(), h.begin());
        Block128 out = PolyvalPortable(h, d.data(), d.size());
        return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      }, py::arg("key"), py::arg("data"), "POLYVAL from its definition, bit by bit (slow).");
  m.def("polyval_uses_hardware", &PolyvalUsesHardware);
  m.def("chunk_tag", [](py::bytes secret, int64_t version, uint32_t index, py::object data) {
        std::string sec = secret;
        BufferView view(data, false);
        ChunkKeys keys(sec, version);
        ChunkTag tag = keys.Tag(index, static_cast<uint32_t>(view.size()),
                                PolyvalOf(keys.hash_key(), view.data(), view.size()));
        return py::bytes(reinterpret_cast<const char*>(tag.data()), tag.size());
      }, py::arg("secret"), py::arg("version"), py::arg("index"), py::arg("data"),
      "The tag a publisher computes for chunk `index` holding `data`.");
  m.def("hmac_sha256", [](py::bytes key, py::bytes msg) {
        std::string k = key, s = msg;
        Digest256 d = HmacSha256(k, s.data(), s.size());
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      }, py::arg("key"), py::arg("msg"));
}

}  // namespace rlboost
