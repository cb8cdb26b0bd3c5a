// Bindings for the request-state codec, the migration batch codec and KV page
// gather/scatter. Arguments are bytes-like buffers, addresses and sizes; every call that
// copies or checksums bulk bytes drops the GIL for that part.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>
#include <vector>

#include "bindings/bind.h"
#include "bindings/buffer_view.h"
#include "common/crc32c.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "migration/batch_codec.h"
#include "migration/kv_pages.h"
#include "migration/state_codec.h"

namespace py = pybind11;

namespace rlboost {
namespace {

using migration::BatchKV;
using migration::BatchLayout;
using migration::Span;

Span SpanOf(const BufferView& b) { return {b.data(), b.size()}; }

py::bytes NewBytes(size_t n) { return py::bytes(nullptr, n); }
uint8_t* BytesData(const py::bytes& b) { return reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(b.ptr())); }

py::bytes EncodeStates(const py::object& records, const py::object& prompt, const py::object& output,
                       const py::object& logprobs, const py::object& stop, uint16_t record_version) {
  BufferView r(records, false), p(prompt, false), o(output, false), l(logprobs, false), s(stop, false);
  migration::StateColumns cols{SpanOf(r), SpanOf(p), SpanOf(o), SpanOf(l), SpanOf(s), record_version};
  migration::StateLayout layout;
  ThrowIfError(migration::PlanStates(cols, &layout));
  py::bytes out = NewBytes(layout.total);
  uint8_t* dst = BytesData(out);  // only this call holds `out` until it returns
  {
    py::gil_scoped_release release;
    migration::WriteStates(cols, layout, dst);
  }
  return out;
}

py::tuple DecodeStates(const py::object& buf) {
  BufferView b(buf, false);
  migration::StateLayout l;
  Status st;
  {
    py::gil_scoped_release release;
    st = migration::DecodeStates(b.data(), b.size(), &l);
  }
  ThrowIfError(st);
  return py::make_tuple(l.count, l.record_version, l.records, l.prompt, l.output, l.logprobs, l.stop);
}

void CopyPages(bool scatter, uint64_t cache_addr, uint64_t cache_nbytes, int cache_device,
               std::tuple<uint64_t, uint64_t, uint64_t, uint64_t> geometry, const py::object& block_ids,
               const py::object& samples, int data_device, uint64_t stream) {
  BufferView ids(block_ids, false), rows(samples, false);
  if (ids.size() % sizeof(int64_t) != 0 || rows.size() % sizeof(migration::SampleRef) != 0) {
    throw StatusError(Status(Code::kInvalidArgument, "block ids / sample rows are not whole int64 items"));
  }
  auto [layers, blocks, block_size, row_bytes] = geometry;
  migration::KVGeometry g{layers, blocks, block_size, row_bytes};
  migration::MemRef cache{cache_addr, cache_nbytes, cache_device};
  Status st;
  {
    py::gil_scoped_release release;
    st = migration::CopyPages(scatter ? migration::Direction::kScatter : migration::Direction::kGather,
                              cache, g, reinterpret_cast<const int64_t*>(ids.data()),
                              ids.size() / sizeof(int64_t),
                              reinterpret_cast<const migration::SampleRef*>(rows.data()),
                              rows.size() / sizeof(migration::SampleRef), data_device, stream);
  }
  ThrowIfError(st);
}

using LayoutTuple = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint8_t>;
using KVRow = std::tuple<uint64_t, uint64_t, uint64_t>;  // kv_tokens, address, nbytes

BatchLayout PlanBatch(const BufferView& states, uint64_t count, const std::optional<LayoutTuple>& layout,
                      uint16_t batch_version, uint16_t kv_version, const std::vector<KVRow>& kv) {
  BatchLayout l;
  l.count = count;
  l.states_len = states.size();
  l.batch_version = batch_version;
  l.kv_version = kv_version;
  l.has_kv = layout.has_value();
  if (layout) std::tie(l.num_layers, l.num_kv_heads, l.head_dim, l.block_size, l.dtype) = *layout;
  for (const auto& [tokens, addr, nbytes] : kv) {
    l.kv.push_back(BatchKV{tokens, 0, nbytes, reinterpret_cast<const uint8_t*>(addr)});
  }
  ThrowIfError(migration::PlanBatch(states.data(), &l));
  return l;
}

// Returns a new bytes object, or (given `out`) writes into it and returns the byte count.
py::object EncodeBatch(const py::object& states, uint64_t count, std::optional<LayoutTuple> layout,
                       uint16_t batch_version, uint16_t kv_version, const std::vector<KVRow>& kv,
                       const py::object& out) {
  BufferView s(states, false);
  BatchLayout l = PlanBatch(s, count, layout, batch_version, kv_version, kv);
  if (out.is_none()) {
    py::bytes result = NewBytes(l.total);
    uint8_t* dst = BytesData(result);  // only this call holds `result` until it returns
    {
      py::gil_scoped_release release;
      migration::WriteBatch(s.data(), l, dst);
    }
    return std::move(result);
  }
  BufferView o(out, true);
  if (o.size() < l.total) {
    throw StatusError(Status(Code::kInvalidArgument, "out holds " + std::to_string(o.size()) +
                                                         " bytes but the batch needs " + std::to_string(l.total)));
  }
  {
    py::gil_scoped_release release;
    migration::WriteBatch(s.data(), l, o.data());
  }
  return py::int_(l.total);
}

py::tuple DecodeBatch(const py::object& buf) {
  BufferView b(buf, false);
  BatchLayout l;
  Status st;
  {
    py::gil_scoped_release release;
    st = migration::DecodeBatch(b.data(), b.size(), &l);
  }
  ThrowIfError(st);
  py::object layout = py::none();
  if (l.has_kv) layout = py::make_tuple(l.num_layers, l.num_kv_heads, l.head_dim, l.block_size, l.dtype);
  py::list kv;
  for (const BatchKV& e : l.kv) kv.append(py::make_tuple(e.kv_tokens, e.offset, e.nbytes));
  return py::make_tuple(l.count, l.batch_version, l.kv_version, l.states_offset, l.states_len, layout, kv);
}

uint32_t Checksum(const py::object& buf) {
  BufferView b(buf, false);
  py::gil_scoped_release release;
  return migration::ParallelCrc32c(b.data(), b.size());
}

}  // namespace

void BindMigration(py::module_& parent) {
  py::module_ m = parent.def_submodule("migration", "Request-state codec, batch codec, KV page copies");
  m.attr("STATE_WIRE_VERSION") = migration::kStateWireVersion;
  m.attr("BATCH_WIRE_VERSION") = migration::kBatchWireVersion;
  m.attr("STATE_RECORD_BYTES") = migration::kStateRecordBytes;
  m.def("encode_states", &EncodeStates, py::arg("records"), py::arg("prompt"), py::arg("output"),
        py::arg("logprobs"), py::arg("stop"), py::arg("record_version"),
        "Pack state columns into one checksummed buffer (bytes).");
  m.def("decode_states", &DecodeStates, py::arg("buf"),
        "Verify a state buffer; returns (count, record_version, records, prompt, output, logprobs, "
        "stop) byte offsets. Raises ProtocolError on any fault.");
  m.def("copy_pages", &CopyPages, py::arg("scatter"), py::arg("cache_addr"), py::arg("cache_nbytes"),
        py::arg("cache_device"), py::arg("geometry"), py::arg("block_ids"), py::arg("samples"),
        py::arg("data_device"), py::arg("stream"),
        "Gather (scatter=False) or scatter KV pages. geometry = (num_layers, num_blocks, "
        "block_size, row_bytes); block_ids: int64 buffer; samples: int64 rows (table_offset, "
        "table_len, kv_tokens, data_addr, data_nbytes). Device -1 is host memory.");
  m.def("encode_batch", &EncodeBatch, py::arg("states"), py::arg("count"), py::arg("layout"),
        py::arg("batch_version"), py::arg("kv_version"), py::arg("kv"), py::arg("out") = py::none(),
        "Pack a state buffer and per-sample KV bytes (kv_tokens, address, nbytes) into one batch "
        "buffer; layout = (num_layers, num_kv_heads, head_dim, block_size, dtype code) or None. "
        "Returns bytes, or with `out` (a writable buffer) the number of bytes written into it.");
  m.def("decode_batch", &DecodeBatch, py::arg("buf"),
        "Verify a batch buffer; returns (count, batch_version, kv_version, states_offset, "
        "states_len, layout or None, [(kv_tokens, offset, nbytes)]). Raises ProtocolError.");
  m.def("crc32c", &Checksum, py::arg("buf"),
        "CRC-32C of a bytes-like object, in pieces on the thread pool (the same checksum as "
        "rlboost._C.crc32c).");
  m.def("pool_threads", &PoolThreads, "Threads used for host copies and checksums.");
}

}  // namespace rlboost
