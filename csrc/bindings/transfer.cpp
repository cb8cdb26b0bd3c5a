// Bindings for the weight server, version store, puller and transports. Thin: argument
// conversion, GIL release around every blocking call, and lifetimes (a pull job keeps its
// destination object alive until its threads have stopped). Constructors take keywords
// only; the Python config validates ranges for users, and the boundary checks them again
// so that a direct call with a bad value is a ValueError, never a crash.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>

#include "bindings/bind.h"
#include "bindings/buffer_view.h"
#include "common/frame.h"
#include "channel/handshake.h"
#include "transport/transport.h"
#ifdef RLBOOST_HAS_UCX
#include "transport/ucx/ucx_transport.h"
#endif
#include "weights/delta_publish.h"
#include "weights/puller.h"
#include "weights/server.h"

namespace py = pybind11;

namespace rlboost {
namespace {

template <typename T>
void RequireAtLeast(const char* name, T value, T low) {
  if (value < low) {
    throw StatusError(Status(Code::kInvalidArgument, std::string(name) + " must be >= " + std::to_string(low) +
                                                         ", got " + std::to_string(value)));
  }
}

template <typename T>
void RequireAtMost(const char* name, T value, T high) {
  if (value > high) {
    throw StatusError(Status(Code::kInvalidArgument, std::string(name) + " must be <= " + std::to_string(high) +
                                                         ", got " + std::to_string(value)));
  }
}

void RequirePositive(const char* name, double value) {
  if (!(value > 0)) {
    throw StatusError(Status(Code::kInvalidArgument, std::string(name) + " must be > 0, got " + std::to_string(value)));
  }
}

EncryptPolicy PolicyOf(int encrypt) {
  if (encrypt < 0 || encrypt > 2) {
    throw StatusError(Status(Code::kInvalidArgument, "encrypt must be 0 (off), 1 (auto) or 2 (on), got " +
                                                         std::to_string(encrypt)));
  }
  return static_cast<EncryptPolicy>(encrypt);
}

// A running pull plus the Python object that owns its destination memory.
struct PyPullJob {
  std::unique_ptr<PullJob> job;
  py::object keepalive;
  ~PyPullJob() {
    py::gil_scoped_release release;
    job.reset();  // cancels and joins the lanes before the destination can be freed
  }
};

py::dict StatsDict(const PullStats& s) {
  py::list sources;
  for (auto& src : s.sources) {
    sources.append(py::dict(py::arg("address") = src.address, py::arg("transport") = src.transport,
                            py::arg("bytes") = src.bytes, py::arg("chunks") = src.chunks,
                            py::arg("not_held") = src.not_held,
                            py::arg("integrity_failures") = src.integrity_failures,
                            py::arg("reconnects") = src.reconnects, py::arg("error") = src.error));
  }
  return py::dict(py::arg("chunk_requests") = s.chunk_requests,
                  py::arg("chunks_fetched") = s.chunks_fetched, py::arg("refetched") = s.refetched,
                  py::arg("sources") = sources);
}

py::dict ServerStatsDict(const ServerStats& s) {
  return py::dict(py::arg("bytes_sent") = s.bytes_sent, py::arg("chunks_sent") = s.chunks_sent,
                  py::arg("not_held_replies") = s.not_held_replies,
                  py::arg("connections_accepted") = s.connections_accepted,
                  py::arg("connections_refused") = s.connections_refused,
                  py::arg("connections_evicted") = s.connections_evicted,
                  py::arg("stalled_evicted") = s.stalled_evicted,
                  py::arg("handshakes_dropped") = s.handshakes_dropped,
                  py::arg("deadlines_missed") = s.deadlines_missed,
                  py::arg("auth_failures") = s.auth_failures,
                  py::arg("protocol_errors") = s.protocol_errors,
                  py::arg("active_connections") = s.active_connections,
                  py::arg("leases_expired") = s.leases_expired,
                  py::arg("leases_revoked") = s.leases_revoked,
                  py::arg("encrypted_connections") = s.encrypted_connections,
                  py::arg("accept_queue_peak") = s.accept_queue_peak,
                  py::arg("accept_errors") = s.accept_errors,
                  py::arg("resource_errors") = s.resource_errors);
}

void BindRecords(py::module_& m) {
  py::class_<Region, std::shared_ptr<Region>>(m, "Region", py::buffer_protocol(),
                                              "Native memory a server serves; a writable buffer.")
      .def_static("create", [](uint64_t nbytes) {
            std::shared_ptr<Region> r;
            Status st;
            {
              py::gil_scoped_release release;
              st = Region::CreateShared(nbytes, &r);
            }
            ThrowIfError(st);
            return r;
          }, py::arg("nbytes"), "A zero-filled shared-memory region (memfd), pre-faulted.")
      .def_property_readonly("address", [](const Region& r) { return reinterpret_cast<uintptr_t>(r.data()); })
      .def_property_readonly("nbytes", &Region::size)
      .def_property_readonly("shareable", [](const Region& r) { return r.fd() >= 0; })
      .def_buffer([](Region& r) {
        return py::buffer_info(r.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(r.size())}, {1});
      });

  py::class_<Manifest>(m, "Manifest", "Native manifest: payload size, chunking, chunk tags, metadata.")
      .def(py::init([](int64_t version, uint64_t total, uint32_t chunk, py::bytes tags, py::bytes meta) {
             Manifest mf;
             mf.version = version;
             mf.total_bytes = total;
             mf.chunk_bytes = chunk;
             mf.meta = meta;
             std::string t = tags;
             uint32_t n;
             ThrowIfError(ChunkCount(total, chunk, &n));
             if (t.size() != uint64_t{n} * kChunkTagBytes) {
               ThrowIfError(Status(Code::kInvalidArgument, "tags: 16 bytes per chunk"));
             }
             mf.tags.resize(n);
             for (uint32_t i = 0; i < n; ++i) std::copy_n(t.data() + 16 * i, 16, mf.tags[i].begin());
             return mf;
           }), py::kw_only(), py::arg("version"), py::arg("total_bytes"), py::arg("chunk_bytes"),
           py::arg("tags"), py::arg("meta"))
      .def_readonly("version", &Manifest::version)
      .def_readonly("total_bytes", &Manifest::total_bytes)
      .def_readonly("chunk_bytes", &Manifest::chunk_bytes)
      .def_property_readonly("num_chunks", &Manifest::num_chunks)
      .def_property_readonly("tags", [](const Manifest& mf) {
        std::string out;
        for (const ChunkTag& t : mf.tags) out.append(reinterpret_cast<const char*>(t.data()), t.size());
        return py::bytes(out);
      }, "16 bytes per chunk, in chunk order.")
      .def_property_readonly("meta", [](const Manifest& mf) { return py::bytes(mf.meta); })
      .def_property_readonly("tags_digest", &TagsDigest, "Hex SHA-256 of the tags: what deltas name versions by.")
      .def("mismatched_chunks", [](const Manifest& mf, uintptr_t address, uint64_t nbytes, py::bytes secret,
                                   int threads) {
            if (nbytes < mf.total_bytes) ThrowIfError(Status(Code::kInvalidArgument, "buffer smaller than the payload"));
            std::string sec = secret;
            py::gil_scoped_release release;
            return MismatchedChunks(mf, reinterpret_cast<const uint8_t*>(address), sec, threads);
          }, py::kw_only(), py::arg("address"), py::arg("nbytes"), py::arg("secret"), py::arg("threads") = 2,
          "Chunks of the bytes at address that do not match their tags (empty: exactly this version).")
      .def("encode", [](const Manifest& mf) { return py::bytes(EncodeManifest(mf)); })
      .def_static("decode", [](py::bytes data) {
        std::string s = data;
        Manifest mf;
        ThrowIfError(DecodeManifest(reinterpret_cast<const uint8_t*>(s.data()), s.size(), &mf));
        return mf;
      }, py::arg("data"));
}

void BindStoreAndServer(py::module_& m) {
  py::class_<VersionStore, std::shared_ptr<VersionStore>>(m, "VersionStore",
                                                          "Versions a server holds, with read pins.")
      .def(py::init([](int versions_kept, py::bytes secret) {
             RequireAtLeast("versions_kept", versions_kept, 1);
             return std::make_shared<VersionStore>(versions_kept, std::string(secret));
           }), py::kw_only(), py::arg("versions_kept"), py::arg("secret"),
           "secret keys the tags of the chunks this store commits.")
      .def("stage", [](VersionStore& s, int64_t v, uint64_t n) {
            std::shared_ptr<Region> r;
            ThrowIfError(s.Stage(v, n, &r));
            return r;
          }, py::arg("version"), py::arg("nbytes"), py::call_guard<py::gil_scoped_release>())
      .def("commit", [](VersionStore& s, int64_t v, uint32_t chunk, py::bytes meta, int threads) {
            std::string m = meta;
            Manifest out;
            Status st;
            {
              py::gil_scoped_release release;
              st = s.Commit(v, chunk, std::move(m), threads, &out);
            }
            ThrowIfError(st);
            return out;
          }, py::arg("version"), py::arg("chunk_bytes"), py::arg("meta"), py::arg("threads") = 2)
      .def("discard_staged", &VersionStore::DiscardStaged, py::arg("version"))
      .def("add_partial", [](VersionStore& s, const Manifest& mf, std::shared_ptr<Region> r, bool complete) {
            uint64_t registration = 0;
            ThrowIfError(s.AddPartial(mf, std::move(r), &registration, complete));
            return registration;
          }, py::arg("manifest"), py::arg("region"), py::arg("complete") = false,
          "Serves a version as a pull fills it in (complete: already whole); returns the "
          "registration id for start().")
      .def("add_partial_borrowed", [](VersionStore& s, const Manifest& mf, uintptr_t addr, uint64_t n,
                                      bool complete) {
            uint64_t registration = 0;
            ThrowIfError(s.AddPartial(mf, Region::Borrow(reinterpret_cast<uint8_t*>(addr), n), &registration,
                                      complete));
            return registration;
          }, py::arg("manifest"), py::arg("address"), py::arg("nbytes"), py::arg("complete") = false,
          "Like add_partial over memory the caller owns and keeps alive until retire() returns.")
      .def("commit_delta", [](VersionStore& s, int64_t base, int64_t target, uint32_t chunk_bytes,
                              double max_fraction, uint32_t block_bytes, int threads) {
            DeltaPublishOptions o;
            o.chunk_bytes = chunk_bytes;
            o.max_fraction = max_fraction;
            o.block_bytes = block_bytes;
            o.threads = threads;
            DeltaPublished out;
            Status st;
            {
              py::gil_scoped_release release;
              st = PublishDelta(s, base, target, o, &out);
            }
            ThrowIfError(st);
            return py::dict(py::arg("manifest") = out.manifest, py::arg("declined") = out.declined,
                            py::arg("target_bytes") = out.target_bytes,
                            py::arg("encode_s") = out.encode_s, py::arg("total_s") = out.total_s,
                            py::arg("changed_words") = out.counts.changed_words,
                            py::arg("raw_blocks") = out.counts.raw_blocks);
          }, py::kw_only(), py::arg("base"), py::arg("target"), py::arg("chunk_bytes"), py::arg("max_fraction"),
          py::arg("block_bytes") = kDefaultDeltaBlockBytes, py::arg("threads") = 2,
          "Encodes delta(base -> target) of two committed versions and serves it under delta_key(target) "
          "(a marker saying it was declined when larger than max_fraction of the target); returns its "
          "manifest and timings.")
      .def("retire", [](VersionStore& s, int64_t v, double timeout_s) {
            ThrowIfError(s.Retire(v, Deadline::After(timeout_s)));
          }, py::arg("version"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("retire_if_idle", &VersionStore::RetireIfIdle, py::arg("version"),
           "Retires a version no read holds now; False (still served) while one does.")
      .def("pins", &VersionStore::Pins, "Reads in flight per version (only versions with any).")
      .def("held_bytes", &VersionStore::HeldBytes,
           "Bytes of every region held: served, retired but still read, staged, the spare.")
      .def("latest", &VersionStore::Latest)
      .def("versions", &VersionStore::Versions);

  py::class_<WeightServer>(m, "WeightServer", "Serves a VersionStore on one TCP port.")
      .def(py::init([](std::shared_ptr<VersionStore> store, const std::string& host, int port, py::bytes secret,
                       uint64_t egress, int max_connections, int max_connections_per_peer,
                       int max_connections_per_host, int max_handshakes, double handshake_timeout_s,
                       double frame_timeout_s, double send_timeout_s, double lease_timeout_s, int encrypt) {
             RequireAtLeast("port", port, 0);
             RequireAtMost("port", port, 65535);
             RequireAtLeast("max_connections", max_connections, 1);
             RequireAtLeast("max_connections_per_peer", max_connections_per_peer, 1);
             RequireAtLeast("max_connections_per_host", max_connections_per_host, 1);
             RequireAtLeast("max_handshakes", max_handshakes, 1);
             RequirePositive("handshake_timeout_s", handshake_timeout_s);
             RequirePositive("frame_timeout_s", frame_timeout_s);
             RequirePositive("send_timeout_s", send_timeout_s);
             RequirePositive("lease_timeout_s", lease_timeout_s);
             ServerOptions o;
             o.encrypt = PolicyOf(encrypt);
             o.host = host;
             o.port = port;
             o.secret = secret;
             o.egress_bytes_per_s = egress;
             o.limits.max_connections = max_connections;
             o.limits.max_connections_per_peer = max_connections_per_peer;
             o.limits.max_connections_per_host = max_connections_per_host;
             o.limits.max_handshakes = max_handshakes;
             // One peer host may fill a quarter of the handshake slots.
             o.limits.max_handshakes_per_host = std::max(1, max_handshakes / 4);
             o.handshake_timeout_s = handshake_timeout_s;
             o.frame_timeout_s = frame_timeout_s;
             o.send_timeout_s = send_timeout_s;
             o.lease_timeout_s = lease_timeout_s;
             std::unique_ptr<WeightServer> s;
             Status st;
             {
               py::gil_scoped_release release;
               st = WeightServer::Start(o, std::move(store), &s);
             }
             ThrowIfError(st);
             return s;
           }), py::kw_only(), py::arg("store"), py::arg("host"), py::arg("port"), py::arg("secret"),
           py::arg("egress_bytes_per_s") = 0, py::arg("max_connections") = 256,
           py::arg("max_connections_per_peer") = 96, py::arg("max_connections_per_host") = 192,
           py::arg("max_handshakes") = 128, py::arg("handshake_timeout_s") = 2.0,
           py::arg("frame_timeout_s") = 30.0, py::arg("send_timeout_s") = 300.0,
           py::arg("lease_timeout_s") = 60.0, py::arg("encrypt") = 1)
      .def_property_readonly("host", &WeightServer::host)
      .def_property_readonly("port", &WeightServer::port)
      .def_property_readonly("server_id", &WeightServer::server_id)
      .def("stats", [](const WeightServer& s) {
            ServerStats stats;
            {
              py::gil_scoped_release release;  // takes the server's connection lock
              stats = s.stats();
            }
            return ServerStatsDict(stats);
          })
      .def("close", &WeightServer::Close, py::call_guard<py::gil_scoped_release>());
}

void BindPuller(py::module_& m) {
  py::class_<PullPlan>(m, "PullPlan", "A version resolved against the sources.")
      .def_property_readonly("manifest", [](const PullPlan& p) { return p.manifest; })
      .def_readonly("skipped", &PullPlan::skipped)
      .def_property_readonly("num_sources", [](const PullPlan& p) { return p.sources.size(); });

  py::class_<PyPullJob>(m, "PullJob", "Bytes moving into one destination.")
      .def("wait", [](PyPullJob& j, double timeout_s) { return j.job->Wait(timeout_s); },
           py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
           "True once finished; then raise_if_failed() tells how.")
      .def("raise_if_failed", [](PyPullJob& j) { ThrowIfError(j.job->result()); })
      .def("cancel", [](PyPullJob& j) { j.job->Cancel(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("bytes_done", [](PyPullJob& j) { return j.job->bytes_done(); })
      .def_property_readonly("total_bytes", [](PyPullJob& j) { return j.job->manifest().total_bytes; })
      .def("stats", [](PyPullJob& j) {
            PullStats stats;
            {
              py::gil_scoped_release release;  // a lane may hold a source's lock for a moment
              stats = j.job->stats();
            }
            return StatsDict(stats);
          })
      .def("held_bitmap", [](PyPullJob& j) {
        auto bits = j.job->HeldBitmap();
        return py::bytes(reinterpret_cast<const char*>(bits.data()), bits.size());
      });

  py::class_<ConnectionPool, std::shared_ptr<ConnectionPool>>(
      m, "ConnectionPool", "Authenticated connections to sources, kept open between pulls.")
      .def(py::init([](size_t max_idle_per_source, double max_idle_s) {
             RequirePositive("max_idle_s", max_idle_s);
             return std::make_shared<ConnectionPool>(max_idle_per_source, max_idle_s);
           }), py::kw_only(), py::arg("max_idle_per_source"), py::arg("max_idle_s"))
      .def_property_readonly("idle", &ConnectionPool::idle, "Connections open and unused now.")
      .def("close", &ConnectionPool::Close, py::call_guard<py::gil_scoped_release>(),
           "Closes the idle connections; those in use close when their pull ends.");

  py::class_<Puller>(m, "Puller", "Connects out to sources and starts pulls.")
      .def(py::init([](std::vector<std::pair<std::string, int>> sources, py::bytes secret,
                       const std::string& transport, int streams, int max_in_flight,
                       double request_timeout_s, double connect_timeout_s, int reconnect_attempts,
                       uint64_t self_server_id, std::shared_ptr<ConnectionPool> pool, uint32_t relay_poll_ms,
                       int encrypt, uint64_t max_version_bytes) {
             RequireAtLeast("streams", streams, 1);
             RequireAtLeast("max_in_flight", max_in_flight, 1);
             RequireAtLeast("reconnect_attempts", reconnect_attempts, 0);
             RequirePositive("request_timeout_s", request_timeout_s);
             RequirePositive("connect_timeout_s", connect_timeout_s);
             RequireAtLeast("max_version_bytes", max_version_bytes, uint64_t{1});
             RequireAtLeast("relay_poll_ms", relay_poll_ms, uint32_t{1});
             PullOptions o;
             o.secret = secret;
             o.encrypt = PolicyOf(encrypt);
             o.max_version_bytes = max_version_bytes;
             o.transport = transport;
             o.streams = streams;
             o.max_in_flight = max_in_flight;
             o.request_timeout_s = request_timeout_s;
             o.connect_timeout_s = connect_timeout_s;
             o.reconnect_attempts = reconnect_attempts;
             o.pool = std::move(pool);
             o.have_wait_ms = relay_poll_ms;  // a source waits kMaxHaveWaitMs at most
             std::vector<SourceAddress> addrs;
             for (auto& s : sources) addrs.push_back(SourceAddress{s.first, s.second});
             return std::make_unique<Puller>(o, addrs, self_server_id);
           }), py::kw_only(), py::arg("sources"), py::arg("secret"), py::arg("transport"), py::arg("streams"),
           py::arg("max_in_flight"), py::arg("request_timeout_s"), py::arg("connect_timeout_s"),
           py::arg("reconnect_attempts"), py::arg("self_server_id") = 0, py::arg("pool") = nullptr,
           py::arg("relay_poll_ms") = 500, py::arg("encrypt") = 1,
           py::arg("max_version_bytes") = kDefaultMaxVersionBytes)
      .def("resolve", [](Puller& p, int64_t version, double timeout_s, double source_timeout_s) {
            auto plan = std::make_unique<PullPlan>();
            ThrowIfError(p.Resolve(version, timeout_s, source_timeout_s, plan.get()));
            return plan;
          }, py::arg("version"), py::arg("timeout_s"), py::arg("source_timeout_s"),
          py::call_guard<py::gil_scoped_release>())
      .def("await_version", [](Puller& p, int64_t version, double timeout_s) {
            bool found = false;
            Status st;
            {
              py::gil_scoped_release release;
              st = p.Await(version, timeout_s, &found);
            }
            ThrowIfError(st);
            return found;
          }, py::arg("version"), py::arg("timeout_s"),
          "Waits until any source holds some of `version`; False when none does within timeout_s.")
      .def("start", [](Puller& p, PullPlan& plan, uintptr_t address, uint64_t nbytes,
                       std::shared_ptr<VersionStore> relay, uint64_t registration, py::bytes held,
                       py::object keepalive) {
            if (nbytes < plan.manifest.total_bytes) {
              ThrowIfError(Status(Code::kInvalidArgument, "destination of " + std::to_string(nbytes) +
                                                              " bytes is smaller than the payload (" +
                                                              std::to_string(plan.manifest.total_bytes) + ")"));
            }
            if (plan.sources.empty()) ThrowIfError(Status(Code::kInvalidArgument, "plan already started"));
            std::string h = held;
            std::vector<uint8_t> seed(h.begin(), h.end());
            auto out = std::make_unique<PyPullJob>();
            out->keepalive = std::move(keepalive);
            Status st;
            {
              py::gil_scoped_release release;
              st = p.Start(std::move(plan), reinterpret_cast<uint8_t*>(address),
                           RelayTarget{std::move(relay), registration}, seed, &out->job);
            }
            ThrowIfError(st);
            return out;
          }, py::arg("plan"), py::arg("address"), py::arg("nbytes"), py::arg("relay"),
          py::arg("registration"), py::arg("held"), py::arg("keepalive"));
}

void BindUtilities(py::module_& m) {
  m.def("transports", [] {
        py::list out;
        for (auto& name : BuiltTransports()) {
          std::unique_ptr<Transport> t;
          ThrowIfError(MakeTransport(name, &t));
          TransportCaps c = t->caps();
          out.append(py::dict(py::arg("name") = name, py::arg("same_host_only") = c.same_host_only,
                              py::arg("needs_shared_region") = c.needs_shared_region,
                              py::arg("source_cpu_free") = c.source_cpu_free,
                              py::arg("device_memory") = c.device_memory));
        }
        return out;
      }, "Built transports and their capabilities.");
#ifdef RLBOOST_HAS_UCX
  m.def("ucx_service_stats", [] {
        UcxServiceStats st = GetUcxServiceStats();
        return py::dict(py::arg("endpoints") = st.endpoints, py::arg("rejected") = st.rejected);
      }, "UCX serving in this process: endpoints open now, connection requests refused.");
#endif
  m.attr("WIRE") = py::dict(
      py::arg("magic") = kWireMagic, py::arg("format_version") = kWireFormatVersion,
      py::arg("header_bytes") = kFrameHeaderBytes, py::arg("min_chunk_bytes") = kMinChunkBytes,
      py::arg("max_chunk_bytes") = kMaxChunkBytes, py::arg("nonce_bytes") = kNonceBytes,
      py::arg("hello") = static_cast<int>(FrameType::kHello),
      py::arg("challenge") = static_cast<int>(FrameType::kChallenge),
      py::arg("auth") = static_cast<int>(FrameType::kAuth),
      py::arg("welcome") = static_cast<int>(FrameType::kWelcome),
      py::arg("manifest_request") = static_cast<int>(FrameType::kManifestRequest),
      py::arg("manifest") = static_cast<int>(FrameType::kManifest),
      py::arg("chunk_request") = static_cast<int>(FrameType::kChunkRequest),
      py::arg("chunk") = static_cast<int>(FrameType::kChunk),
      py::arg("have_request") = static_cast<int>(FrameType::kHaveRequest),
      py::arg("have") = static_cast<int>(FrameType::kHave),
      py::arg("shm_open_request") = static_cast<int>(FrameType::kShmOpenRequest),
      py::arg("shm_open") = static_cast<int>(FrameType::kShmOpen),
      py::arg("shm_close") = static_cast<int>(FrameType::kShmClose),
      py::arg("chunk_prefix_bytes") = kChunkPrefixBytes, py::arg("tag_bytes") = kChunkTagBytes,
      py::arg("error") = static_cast<int>(FrameType::kError),
      py::arg("reply_ok") = static_cast<int>(ReplyStatus::kOk),
      py::arg("reply_not_held") = static_cast<int>(ReplyStatus::kNotHeld),
      py::arg("reply_unknown_version") = static_cast<int>(ReplyStatus::kUnknownVersion),
      py::arg("frame_tag_bytes") = kFrameTagBytes);
}

}  // namespace

void BindTransfer(py::module_& m) {
  BindRecords(m);
  BindStoreAndServer(m);
  BindPuller(m);
  BindUtilities(m);
}

}  // namespace rlboost
