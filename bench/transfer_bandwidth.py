"""Weight-transfer bandwidth: rlboost pulls against memcpy, a raw socket, gloo, Ray and UCX,
and the time to provision simultaneous newcomers from a trainer with capped egress.

Every peer moves the same bytes between two processes into pre-faulted memory in the same
run, so the ratios hold even on a shared, noisy machine.

    python bench/transfer_bandwidth.py            # 64 MiB, 256 MiB, 1 GiB (~2 min)
    python bench/transfer_bandwidth.py --quick    # 64 MiB, 2 repeats (~25 s)
    python bench/transfer_bandwidth.py --big      # adds 2 GiB
    python bench/transfer_bandwidth.py --save     # also writes bench/results/transfer_*.md
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rlboost.errors import RlboostError  # noqa: E402

import _peers  # noqa: E402
import _pull  # noqa: E402
import _reftcp  # noqa: E402
import _transfer_report as report  # noqa: E402
from _common import (  # noqa: E402
    GiB,
    MiB,
    Missing,
    Row,
    Schedule,
    SharedPayload,
    WrongBytes,
    alloc_prefaulted,
    digest,
    emit_json,
    hardware_tag,
    parse_size,
    run_interleaved,
    today,
)

SEED = 20251129
DEFAULT_SIZES = (64 * MiB, 256 * MiB, 1 * GiB)
ALL_PEERS = ("memcpy", "socket", "reftcp", "gloo", "ray", "ucxx", "pull", "provision", "latency")
INTERLEAVED = ("memcpy", "socket", "reftcp", "gloo", "ray", "pull")
TRANSPORTS = ("tcp", "shm", "ucx")
METHOD = """\
What each row measures. The payload is written once into a /dev/shm file that every
sender maps, so all peers send the same physical bytes; every destination is pre-faulted
(MAP_POPULATE) and reused; one warm-up run, then best and median of the timed runs; each
cell's bytes are checked against the payload's xxh3 digest after its last run. memcpy,
the raw socket, gloo, Ray and the rlboost pulls alternate run by run, so a burst of load
on the shared machine hits them alike; ucxx, provisioning and the small payload run on
their own.
- memcpy: one process copies a resident buffer into another (numpy: 1 thread, torch
  copy_: all threads); the faster of the two is the ceiling.
- raw socket: a child answers an 8-byte size request on 127.0.0.1 with sendall of 4 MiB
  slices; the receiver times request -> last recv_into byte.
- reference TCP engine: the published reference's weight engine, rebuilt from its
  description (bench/_reftcp.py): the sender pushes, per transfer, K contiguous chunks
  over K new connections (16-byte offset/length header, then os.sendfile from the
  payload file; 16 MiB socket buffers); the receiver's K listeners recv_into the
  destination. No authentication, integrity check or encryption. K = --ref-streams
  (8, the reference's config.toml).
- gloo broadcast: torch.distributed over gloo, 2 processes; the receiver times one
  broadcast after a barrier.
- ray get: Ray 2.x object store, two nodes on this machine (two raylets, each with
  its own plasma store). Per run an actor puts a fresh copy of the payload into its
  node's store (untimed, as a publish is for rlboost), then the driver times ray.get +
  one copy into the destination (get returns read-only plasma memory; the copy puts the
  bytes where a consumer wants them). "same-host": the actor is on the driver's node,
  get maps the plasma shared memory: the peer of shm pull. "cross-node": the actor is
  on the second node, get has Ray's object manager move the object between the stores
  over loopback TCP: the peer of tcp pull, which models a transfer between hosts.
- ucxx tag: two children, endpoints from worker addresses, tag send/recv of the payload
  after an 8-byte request; UCX_NET_DEVICES=lo; "tcp" forces UCX_TLS=tcp, "auto" lets UCX
  pick its same-host transports (cma, posix, sysv).
- rlboost pull (tcp / shm / ucx): a WeightPublisher in a child publishes the payload as
  32 MiB bfloat16 tensors, once per payload size before its runs (untimed); the
  receiver's WeightPuller (relay off, library defaults: 4 streams x 2 requests in flight,
  8 MiB chunks, one per transport, kept across runs so its connections stay open) times
  pull(version, into=<the pre-faulted destination>): resolve the version, move every
  chunk and verify its tag (POLYVAL of its bytes, then HMAC-SHA256 under a key from the
  run's secret: what no one without the secret can forge; there is no weaker mode). tcp models a transfer between hosts (over loopback its
  connections use a 1 MiB send buffer; toward other hosts the kernel autotunes it); shm
  maps the publisher's region and copies out of it; ucx is UCX get over its TCP transport.
  Every frame after the login carries a MAC under the login's keys (wire format 4).
- rlboost pull (tcp, AES-256-GCM): the same tcp pull with transfer.encrypt=on, so the
  publisher seals every frame and chunk (OpenSSL's libcrypto): it encrypts 256 KiB at a
  time as it sends, the puller decrypts each piece in place as it lands and hashes it
  for the chunk's tag while it is in cache. What a pull between hosts costs with
  encrypt=auto; set against the plaintext tcp pull of the same run.
- provisioning: a trainer publisher whose egress is capped, and N newcomer processes told
  to pull at the same instant; the figure is 'go' -> the last newcomer holds the verified
  version. With relay each newcomer serves what it holds and gets the trainer and every
  other newcomer as sources; "from peers" is the share of bytes that came from newcomers.
- small payload (1 MiB, like a migration batch): time per transfer, median and p90 of
  200 runs after a warm-up, alternating run by run: a WeightPuller per transport that
  keeps its connections between pulls (the default) or connects and authenticates
  anew for every pull (keep_connections=False), and the raw socket on its open
  connection (request -> last byte), the floor.
- ratios: every target compares bests of the same run and payload; tcp pull is set
  against the peers that also cross hosts (gloo over TCP, Ray cross-node), shm pull
  against those on one host (gloo, Ray same-host), and each against its own ceiling.
- chunk check cost: one core's GB/s (thread CPU time) for the check rlboost runs on
  every chunk (POLYVAL), CRC-32C and SHA-256 (OpenSSL, SHA-NI where present), over the
  same 64 MiB of resident payload.
- CPU s/GB: user + system CPU seconds of the receiving and the sending process (all
  threads, /proc tick counters) per GB moved, over the timed runs. Unlike GB/s it does
  not depend on what else the shared machine runs. Ray's CPU is the driver's and the
  raylets' (object manager, plasma store) of the nodes involved; "-" where a row's work
  runs in processes that are not counted (ucxx children).
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: tuple(parse_size(x) for x in s.split(",")),
                   help="comma-separated payload sizes, e.g. 64M,256M,1G")
    p.add_argument("--quick", action="store_true", help="64 MiB only, 2 repeats (~25 s)")
    p.add_argument("--big", action="store_true", help="add a 2 GiB payload (needs ~13 GiB free)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per cell (after 1 warm-up)")
    p.add_argument("--peers", default=",".join(ALL_PEERS),
                   help=f"what to measure (default: all of {','.join(ALL_PEERS)})")
    p.add_argument("--provision-size", type=parse_size, default=256 * MiB,
                   help="payload of the provisioning runs (default 256M; 64M with --quick)")
    p.add_argument("--egress-cap", type=float, default=300e6,
                   help="trainer egress cap in bytes/s during provisioning (default 300e6)")
    p.add_argument("--newcomers", default="1,2,4", help="newcomer counts to provision")
    p.add_argument("--latency-size", type=parse_size, default=1 * MiB,
                   help="payload of the per-pull latency runs (default 1M)")
    p.add_argument("--ref-streams", type=int, default=8,
                   help="parallel streams of the reference TCP engine peer (default 8, its config.toml)")
    p.add_argument("--pull-config", type=_pull_config, default={},
                   help="TransferConfig fields for every puller, e.g. streams=1,max_in_flight=1 "
                        "(default: the library's defaults)")
    p.add_argument("--save", action="store_true",
                   help="also write bench/results/transfer_<hardware>_<date>.md")
    args = p.parse_args(argv)
    args.peers = tuple(x for x in args.peers.split(",") if x)
    args.newcomers = tuple(int(x) for x in args.newcomers.split(",") if x)
    if args.quick:
        args.provision_size, args.newcomers = min(args.provision_size, 64 * MiB), (1, 2)
    if not 1 <= args.ref_streams <= 64:
        p.error(f"--ref-streams must be 1..64, got {args.ref_streams}")
    if min(args.newcomers, default=0) < 1 or args.egress_cap < 1024:
        p.error("--newcomers must be positive counts and --egress-cap >= 1024")
    unknown = set(args.peers) - set(ALL_PEERS)
    if unknown:
        p.error(f"unknown peers {sorted(unknown)}; choose from {ALL_PEERS}")
    return args


def _pull_config(text: str) -> dict[str, int]:
    """'streams=1,max_in_flight=1' -> {'streams': 1, 'max_in_flight': 1}."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise argparse.ArgumentTypeError(f"expected KEY=INTEGER, got {item!r}")
        out[key.strip()] = int(value)
    return out


def build_schedule(args: argparse.Namespace) -> Schedule:
    if args.sizes:
        sizes = args.sizes
    elif args.quick:
        sizes = (64 * MiB,)
    else:
        sizes = DEFAULT_SIZES + ((2 * GiB,) if args.big else ())
    repeats = 2 if args.quick else args.repeats
    if repeats < 1 or min(sizes) < 1:
        raise SystemExit("--repeats and every size must be positive")
    return Schedule(sizes=tuple(sorted(set(sizes))), repeats=repeats, warmup=1)


# --------------------------------------------------------------------------- running
@dataclasses.dataclass(slots=True)
class Results:
    rows: list[Row] = dataclasses.field(default_factory=list)
    missing: list[Missing] = dataclasses.field(default_factory=list)
    provisions: list[_pull.Provision] = dataclasses.field(default_factory=list)
    latencies: list[_pull.Latency] = dataclasses.field(default_factory=list)
    costs: list[_pull.CheckCost] = dataclasses.field(default_factory=list)


def run_all(args, payload: SharedPayload, dst, schedule, expect) -> Results:
    """Every selected peer: the in-process and two-process ones alternate run by run
    (so load bursts hit all alike); ucxx, provisioning and latency run on their own."""
    out = Results()
    jobs = {
        "ucxx": lambda: _run_ucx(schedule, payload.path, expect),
        "provision": lambda: _run_provisioning(args, payload, out.provisions),
        "latency": lambda: _run_latency(args, payload, dst, out.latencies),
    }
    together = [p for p in args.peers if p in INTERLEAVED]
    if together:
        _run_one("+".join(together), lambda: _run_interleaved(
            together, payload, dst, schedule, expect, out.missing, args.pull_config,
            args.ref_streams), out)
    for name in args.peers:
        if name not in INTERLEAVED:
            _run_one(name, jobs[name], out)
    return out


def _run_interleaved(names, payload: SharedPayload, dst, schedule: Schedule, expect,
                     missing: list[Missing], pull_config: dict, ref_streams: int = 8) -> list[Row]:
    biggest, path = max(schedule.sizes), payload.path
    makers = {
        "memcpy": lambda: [_peers.MemcpySession(payload.array, dst, use_torch=t)
                           for t in (False, True)],
        "socket": lambda: [_peers.SocketSession(dst, path, biggest)],
        "reftcp": lambda: [_reftcp.RefTcpSession(dst, path, ref_streams)],
        "gloo": lambda: [_peers.GlooSession(dst, path, biggest)],
        "ray": lambda: _ray_sessions(stack, path, biggest, dst),
        "pull": lambda: _pull_sessions(stack, path, biggest, dst, missing, pull_config),
    }
    with contextlib.ExitStack() as stack:
        sessions = []
        for name in names:
            opened = _guarded(name, makers[name], missing)
            for session in opened or []:
                stack.callback(session.close)
            sessions += opened or []
        rows, failed = run_interleaved(sessions, schedule, dst, expect, tolerate=(RlboostError,))
    missing += failed
    return rows


def _pull_sessions(stack, path: str, biggest: int, dst, missing: list[Missing],
                   pull_config: dict) -> list:
    built = _pull.built_transports()
    missing += [Missing(f"rlboost pull ({t})", "transport not built")
                for t in TRANSPORTS if t not in built]
    publisher = _pull.Publisher(path, biggest)
    stack.callback(publisher.close)
    sessions = [_pull.PullSession(publisher, t, dst, pull_config) for t in TRANSPORTS if t in built]
    from rlboost import _C

    if _C.HAS_AEAD:
        sessions.append(_pull.PullSession(publisher, "tcp", dst, pull_config, encrypt=True))
    else:
        missing.append(Missing("rlboost pull (tcp, AES-256-GCM)", "built without libcrypto (HAS_AEAD False)"))
    return sessions


def _ray_sessions(stack, path: str, biggest: int, dst) -> list:
    cluster = _peers.RayCluster(path, biggest)
    stack.callback(cluster.close)
    return [_peers.RaySession(cluster, dst, cross_node=c) for c in (False, True)]


def _run_ucx(schedule: Schedule, path: str, expect) -> list[Row]:
    if not _peers.ucx_installed():
        raise ModuleNotFoundError("not installed (pip install ucxx-cu12)")
    return (_peers.measure_ucx(schedule, path, expect, tls="tcp")
            + _peers.measure_ucx(schedule, path, expect, tls=None))


def _run_provisioning(args, payload: SharedPayload, out: list) -> list[Row]:
    n = args.provision_size
    out.extend(_pull.measure_provisioning(n, args.newcomers, int(args.egress_cap),
                                          1 if args.quick else 3, payload.path,
                                          digest(payload.array[:n]), args.pull_config))
    return []


def _run_latency(args, payload: SharedPayload, dst, out: list) -> list[Row]:
    n = args.latency_size
    out.extend(_pull.measure_latency(payload.path, dst, n, 30 if args.quick else 200,
                                     digest(payload.array[:n]), args.pull_config))
    return []


def _guarded(name: str, job, missing: list[Missing]):
    """job(), or None with the reason recorded when this peer cannot run here."""
    try:
        return job()
    except (ModuleNotFoundError, ImportError) as exc:
        missing.append(Missing(name, str(exc).splitlines()[0]))
    except WrongBytes:
        raise
    except Exception as exc:  # reported in the table and the JSON line, traceback on stderr
        traceback.print_exc(file=sys.stderr)
        missing.append(Missing(name, f"failed: {str(exc).splitlines()[0][:80]}"))
    return None


def _run_one(name: str, job, out: Results) -> None:
    t0 = time.perf_counter()
    print(f"[{name}] ...", file=sys.stderr, flush=True)
    out.rows.extend(_guarded(name, job, out.missing) or [])
    print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def save_results(markdown: str, argv: list[str], load: tuple[float, float]) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "results", f"transfer_{hardware_tag()}_{today()}.md")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    command = " ".join(["python bench/transfer_bandwidth.py", *argv])
    with open(path, "w") as f:
        f.write(f"# Transfer bandwidth, {hardware_tag()}, {today()}\n\n")
        f.write(f"Command: `{command}`\n\n")
        f.write(f"Load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f} on "
                f"{os.cpu_count()} cores (the machine is shared; compare ratios, not "
                f"absolute figures).\n\n{METHOD}\n{markdown}")
    return path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # A terminated run still unwinds, so the shared payload file is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Keep UCX (rlboost's ucx transport and the ucxx peers) on loopback; children inherit.
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    schedule = build_schedule(args)
    load_at_start = os.getloadavg()[0]
    biggest = max(schedule.sizes)
    dst = alloc_prefaulted(max(biggest, args.latency_size))
    with SharedPayload(max(biggest, args.provision_size, args.latency_size), SEED) as payload:
        expect = {n: digest(payload.array[:n]) for n in schedule.sizes}
        res = run_all(args, payload, dst, schedule, expect)
        res.costs = _pull.measure_check_costs(payload.array[:min(64 * MiB, payload.nbytes)])
    ratios = report.compute_ratios(res.rows, res.provisions)
    markdown = report.tables(res.rows, res.missing, res.provisions, res.latencies, ratios,
                             args.egress_cap, res.costs)
    if args.save:
        path = save_results(markdown, argv, (load_at_start, os.getloadavg()[0]))
        print(f"saved {path}", file=sys.stderr)
    value, ceiling = report.headline(res.rows)
    peers = report.json_peers(res.rows, res.missing, ratios, res.provisions, res.latencies,
                              args.egress_cap, res.costs)
    emit_json("tcp_pull_GBps", value, "GB/s", ceiling, peers)

if __name__ == "__main__":
    main()
