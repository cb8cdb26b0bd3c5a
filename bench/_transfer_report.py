"""Tables, target ratios and the JSON line of bench/transfer_bandwidth.py, computed from
its measured rows (best of the repeats on both sides of every ratio)."""

from __future__ import annotations

from _common import Missing, Row, fmt_size, render_table
from _pull import CheckCost, Latency, Provision

LARGE = 256 << 20  # "beats gloo / Ray" is judged on payloads at least this big

def best_by_size(rows: list[Row], key: str) -> dict[int, float]:
    return {r.nbytes: r.best for r in rows if r.key == key}


def ceiling_by_size(rows: list[Row]) -> dict[int, float]:
    """memcpy ceiling per size: the faster of the numpy and torch copies."""
    out: dict[int, float] = {}
    for key in ("memcpy_numpy", "memcpy_torch"):
        for n, v in best_by_size(rows, key).items():
            out[n] = max(out.get(n, 0.0), v)
    return out


def _ratio(num: dict[int, float], den: dict[int, float], sizes) -> dict[str, float]:
    both = [n for n in sizes if n in num and n in den]
    return {fmt_size(n, compact=True): round(num[n] / den[n], 3) for n in both}


# ratio name -> (comparison, threshold) that the transfer core is meant to meet
TARGETS = {
    "tcp_pull/socket": (">=", 1.0),
    "tcp_enc_pull/tcp_pull": (">=", 0.7),
    "shm_pull/memcpy": (">=", 0.5),
    "tcp_pull/gloo": (">", 1.0),
    "tcp_pull/ray_cross_node": (">", 1.0),
    "shm_pull/gloo": (">", 1.0),
    "shm_pull/ray_same_host": (">", 1.0),
    "provision4_relay/no_relay": ("<=", 0.5),
}


def meets(name: str, value: float) -> str:
    if name not in TARGETS:
        return ""
    op, bound = TARGETS[name]
    ok = {">=": value >= bound, ">": value > bound, "<=": value <= bound}[op]
    return "yes" if ok else "NO"


def compute_ratios(rows: list[Row], provisions: list[Provision]) -> dict[str, dict[str, float]]:
    """The ratios the targets are stated in (best of the repeats on both sides)."""
    by = {key: best_by_size(rows, key) for key in {r.key for r in rows}}
    memcpy, sizes = ceiling_by_size(rows), sorted({r.nbytes for r in rows})
    large = [n for n in sizes if n >= LARGE]
    out = {
        "tcp_pull/socket": _ratio(by.get("tcp_pull", {}), by.get("socket", {}), sizes),
        "tcp_enc_pull/tcp_pull": _ratio(by.get("tcp_enc_pull", {}), by.get("tcp_pull", {}), sizes),
        "shm_pull/memcpy": _ratio(by.get("shm_pull", {}), memcpy, sizes),
        "tcp_pull/ucxx_tcp": _ratio(by.get("tcp_pull", {}), by.get("ucxx_tcp", {}), sizes),
        "shm_pull/ucxx_auto": _ratio(by.get("shm_pull", {}), by.get("ucxx_auto", {}), sizes),
        "ucx_pull/ucxx_tcp": _ratio(by.get("ucx_pull", {}), by.get("ucxx_tcp", {}), sizes),
        "ucx_pull/ucxx_auto": _ratio(by.get("ucx_pull", {}), by.get("ucxx_auto", {}), sizes),
        "socket/memcpy": _ratio(by.get("socket", {}), memcpy, sizes),
        "tcp_pull/ref_tcp": _ratio(by.get("tcp_pull", {}), by.get("ref_tcp", {}), sizes),
        "tcp_enc_pull/ref_tcp": _ratio(by.get("tcp_enc_pull", {}), by.get("ref_tcp", {}), sizes),
    }
    cpu = {key: {r.nbytes: r.cpu_per_gb for r in rows if r.key == key and r.cpu_per_gb}
           for key in ("tcp_pull", "tcp_enc_pull", "socket", "ref_tcp", "shm_pull", "memcpy_numpy")}
    out["cpu per GB: tcp_pull/socket"] = _ratio(cpu["tcp_pull"], cpu["socket"], sizes)
    out["cpu per GB: tcp_enc_pull/tcp_pull"] = _ratio(cpu["tcp_enc_pull"], cpu["tcp_pull"], sizes)
    out["cpu per GB: tcp_pull/ref_tcp"] = _ratio(cpu["tcp_pull"], cpu["ref_tcp"], sizes)
    out["cpu per GB: shm_pull/memcpy"] = _ratio(cpu["shm_pull"], cpu["memcpy_numpy"], sizes)
    # Each pull against the peers that move bytes the same way: TCP between hosts (Ray's
    # object manager across nodes), shared memory on one host (Ray's plasma).
    for mine, others in (("tcp_pull", ("gloo", "ray_cross_node")),
                         ("shm_pull", ("gloo", "ray_same_host"))):
        for other in others:
            out[f"{mine}/{other}"] = _ratio(by.get(mine, {}), by.get(other, {}), large)
    best = {(p.newcomers, p.relay): p for p in provisions}
    for (count, relay), p in sorted(best.items()):
        if relay and (count, False) in best:
            payload = fmt_size(p.nbytes, compact=True)
            out[f"provision{count}_relay/no_relay"] = {
                payload: round(p.best / best[(count, False)].best, 3)}
    return {k: v for k, v in out.items() if v}


def bandwidth_table(rows: list[Row], missing: list[Missing]) -> str:
    body = [[r.peer, fmt_size(r.nbytes), f"{r.best:.2f}", f"{r.median:.2f}",
             "-" if r.cpu_per_gb is None else f"{r.cpu_per_gb:.3f}", r.note] for r in rows]
    body += [[m.peer, "-", "-", "-", "-", m.reason] for m in missing]
    return render_table("Transfer bandwidth (GB/s = 1e9 B/s, best and median of the repeats)",
                        ["path", "payload", "best GB/s", "median GB/s", "CPU s/GB", "note"],
                        body)


def provision_table(provisions: list[Provision], egress_cap: float) -> str:
    body = []
    for p in provisions:
        floor = p.nbytes / egress_cap * (1 if p.relay else p.newcomers)
        body.append([str(p.newcomers), "on" if p.relay else "off", f"{p.best:.2f}",
                     f"{p.median:.2f}", f"{floor:.2f}", f"{max(p.peer_share):.0%}"])
    title = (f"Time to provision newcomers ({fmt_size(provisions[0].nbytes)}, trainer egress "
             f"capped at {egress_cap / 1e6:.0f} MB/s)")
    return render_table(title, ["newcomers", "relay", "best s", "median s",
                                "trainer-bound floor s", "bytes from peers"], body)


def ratio_table(ratios: dict[str, dict[str, float]]) -> str:
    body = []
    for name, per in ratios.items():
        op, bound = TARGETS.get(name, ("", ""))
        for size, value in per.items():
            body.append([name, size, f"{value:.2f}", f"{op}{bound}", meets(name, value)])
    return render_table("Ratios (best vs best, same run, same bytes)",
                        ["ratio", "payload", "value", "target", "met"], body)


def latency_table(latencies: list[Latency], nbytes: int) -> str:
    body = [[x.path, f"{x.median:.2f}", f"{x.p90:.2f}", str(len(x.millis))] for x in latencies]
    return render_table(f"Time per transfer of a small payload ({fmt_size(nbytes)}, ms)",
                        ["path", "median ms", "p90 ms", "runs"], body)


def check_table(costs: list[CheckCost]) -> str:
    body = [[c.name, f"{c.gbps:.2f}", f"{1 / c.gbps:.3f}", c.note] for c in costs]
    return render_table("Chunk check cost on one core (64 MiB resident, thread CPU time)",
                        ["check", "GB/s per core", "CPU s/GB", "note"], body)


def tables(rows: list[Row], missing: list[Missing], provisions: list[Provision],
           latencies: list[Latency], ratios, egress_cap: float, costs: list[CheckCost] = ()) -> str:
    """Prints every table and returns them as markdown."""
    out = bandwidth_table(rows, missing) + "\n"
    if costs:
        out += check_table(list(costs)) + "\n"
    if provisions:
        out += provision_table(provisions, egress_cap) + "\n"
    if latencies:
        out += latency_table(latencies, latencies[0].nbytes) + "\n"
    return out + (ratio_table(ratios) if ratios else "")


def json_peers(rows: list[Row], missing: list[Missing], ratios, provisions: list[Provision],
               latencies: list[Latency], egress_cap: float, costs: list[CheckCost] = ()) -> dict:
    peers: dict = {}
    if costs:
        peers["check_GBps_per_core"] = {c.key: round(c.gbps, 3) for c in costs}
    for r in rows:
        size = fmt_size(r.nbytes, compact=True)
        peers.setdefault(f"{r.key}_GBps", {})[size] = round(r.best, 3)
        peers.setdefault(f"{r.key}_median_GBps", {})[size] = round(r.median, 3)
        if r.cpu_per_gb is not None:
            peers.setdefault(f"{r.key}_cpu_s_per_GB", {})[size] = round(r.cpu_per_gb, 4)
    for p in provisions:
        mode = "relay" if p.relay else "no_relay"
        for key, value in (("provision_s", p.best), ("provision_median_s", p.median),
                           ("provision_peer_share", max(p.peer_share))):
            peers.setdefault(key, {}).setdefault(str(p.newcomers), {})[mode] = round(value, 3)
    if provisions:
        peers["provision_setup"] = {"payload": fmt_size(provisions[0].nbytes, compact=True),
                                    "egress_cap_Bps": egress_cap}
    for x in latencies:
        size = fmt_size(x.nbytes, compact=True)
        peers.setdefault("latency_ms", {})[x.key] = {
            "payload": size, "median": round(x.median, 3), "p90": round(x.p90, 3)}
    peers["ratios"] = ratios
    peers["targets"] = {k: f"{op}{bound}" for k, (op, bound) in TARGETS.items()}
    peers["missing"] = {m.peer: m.reason for m in missing}
    return peers


def headline(rows: list[Row]) -> tuple[float | None, float | None]:
    """tcp pull and memcpy best GB/s at the largest payload both were measured on."""
    tcp, memcpy = best_by_size(rows, "tcp_pull"), ceiling_by_size(rows)
    common = sorted(set(tcp) & set(memcpy))
    if common:
        return round(tcp[common[-1]], 3), round(memcpy[common[-1]], 3)
    return None, (round(memcpy[max(memcpy)], 3) if memcpy else None)


