"""Delta weight updates on a real GRPO run: how much smaller than the full version the
delta of each published version is, how fast it encodes and applies per core, whether 100
chained deltas give a full pull's bytes, and how much faster 4 instances behind a 1 Gbit/s
trainer link sync their weights with deltas than without.

The runs are `rlboost train --recipe smollm2_cpu` (SmolLM2-135M, fetched and converted on
first use) with bf16 weights at each learning rate; a puller in this process pulls every
version the trainer publishes (into the previous one, as an instance does) and saves its
bytes, so every figure below is on the versions a real run published.

    python bench/delta_weights.py --save                    # lr 1e-6 and 1e-5, 21 steps each (~1 h here)
    python bench/delta_weights.py --lrs 1e-6 --steps 6      # a short look
    python bench/delta_weights.py --lrs 1e-6:21,1e-5:11 --save  # fewer steps at the larger rate
    python bench/delta_weights.py --reuse --keep --save     # the figures again, on the versions captured before
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import _delta  # noqa: E402
from _common import emit_json, hardware_tag, render_table, today  # noqa: E402

CAP_BYTES_PER_S = 125_000_000  # 1 Gbit/s
METHOD = """\
What each row measures.
- run: `rlboost train --recipe smollm2_cpu --set rollout.embedded.dtype=bfloat16 --set
  trainer.optimizer.lr=LR --set run.steps=STEPS` (2 FSDP ranks, AdamW, one reserved engine and one
  preemptible instance, a preemption notice in step 2). Deltas on (the default): the trainer's
  publisher encodes each delta on its own thread after the version is served. A puller in the
  bench process pulls every version the trainer publishes into the previous one (a delta once it
  holds one) and saves its bytes.
- full / delta bytes: the version's payload, and delta(k -> k+1) as the publisher encodes it
  (re-encoded here from the saved versions; the run's own instances and the capture puller pulled
  the same bytes). ratio = full / delta per step; "aggregate" = sum of full / sum of delta.
- ceiling (entropy): the zero-order entropy of the (gap, XOR value) symbols of the changed 16-bit
  words: what an ideal coder of each symbol alone would need. Peers on the same pairs: zstd level 1
  on the raw XOR (one thread), and zstd level 1 run over our delta (what a general compressor would
  add on top).
- per core: GB of payload per CPU second of the one thread doing it (thread CPU time, so the
  shared machine's load does not count), best of 3-4, on real pairs: encode; apply in place (only
  changed words are written); apply into another buffer; verify (every chunk's tag, POLYVAL +
  HMAC-SHA256, as a puller checks the result); ceilings memcpy and one XOR pass over both versions.
- chain: versions synthesized after the run's last one (the run is shorter than 100 steps): each
  the previous float32 master + lr * sign(noise) (Adam-sized steps) cast to bf16, published through a
  real WeightPublisher while a WeightPuller follows with deltas over TCP; then its bytes, a fresh
  full pull's and the source's are compared by SHA-256.
- weight sync: a WeightPublisher whose egress is capped at 1 Gbit/s and 4 instance processes (relay
  on, each with the trainer and the 3 others as sources, TCP); all hold version k; the trainer
  publishes k+1 (the real captured bytes); seconds from the publish returning (its delta not yet
  encoded) until the last instance holds k+1, verified. Without deltas every instance pulls the full
  version (trainer and relays). The machine's 2 cores serve the publisher and all 4 instances.
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lrs", default="1e-6,1e-5",
                   help="learning rates, each LR or LR:STEPS (its own step count; default --steps)")
    p.add_argument("--steps", type=int, default=21, help="GRPO steps per run (versions = steps + 1)")
    p.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "rlboost-delta-bench"))
    p.add_argument("--reuse", action="store_true", help="use versions captured before when there are enough")
    p.add_argument("--keep", action="store_true", help="keep the captured versions (about 6 GB per run)")
    p.add_argument("--chain", type=int, default=100)
    p.add_argument("--sync-rounds", type=int, default=3)
    p.add_argument("--save", action="store_true")
    args = p.parse_args()
    runs = _parse_lrs(args.lrs, args.steps)
    lrs = list(runs)
    started, load0 = time.time(), os.getloadavg()[0]
    captured = {lr: _captured(lr, steps, args) for lr, steps in runs.items()}
    sections, figures = [], {}
    for lr, cap in captured.items():
        md, figures[lr] = _sizes(lr, cap)
        sections.append(md)
    speed_md, speeds = _speeds(captured, figures)
    sections.append(speed_md)
    sections.append(_publish_path(captured))
    chain = _delta.chain_exactness(captured[lrs[0]], args.chain, lrs[0], print)
    sections.append(render_table(f"{args.chain} chained deltas (synthesized after the lr {lrs[0]:g} run)",
                                 ["links", "taken as deltas", "SHA-256 chain", "SHA-256 full pull", "equal"],
                                 [[str(chain["links"]), str(chain["delta_links"]), chain["digest_chain"][:16],
                                   chain["digest_full"][:16], str(chain["equal"])]]))
    sync_md, sync = _sync(captured[lrs[0]], args.sync_rounds)
    sections.append(sync_md)
    first = figures[lrs[0]]
    line = emit_json(
        f"delta_ratio_lr{lrs[0]:g}_mean", round(first["mean"], 1), "x smaller than the full version",
        round(first["entropy"], 1),
        {"aggregate": round(first["aggregate"], 1), "min": round(first["min"], 1),
         "zstd1_xor": round(first["zstd_xor"], 1), "ours_plus_zstd1": round(first["ours_zstd"], 1),
         **{f"lr{lr:g}_mean": round(f["mean"], 1) for lr, f in figures.items()},
         "encode_gbps_core": round(speeds["encode"], 2), "apply_gbps_core": round(speeds["apply_in_place"], 2),
         "apply_copy_gbps_core": round(speeds["apply_copy"], 2), "memcpy_gbps_core": round(speeds["memcpy"], 2),
         "chain_equal": chain["equal"], "sync_s_delta": round(sync["delta"], 3),
         "sync_s_full": round(sync["full"], 3), "sync_speedup": round(sync["full"] / sync["delta"], 1)})
    if args.save:
        _save(args, sections, line, load0, time.time() - started)
    if not args.keep:
        for cap in captured.values():
            for path in cap.root.glob("v*.bin"):
                path.unlink()
    return 0


def _parse_lrs(text: str, default_steps: int) -> dict[float, int]:
    """'1e-6:21,1e-5' -> {1e-6: 21, 1e-5: default_steps}."""
    runs = {}
    for item in text.split(","):
        lr, _, steps = item.strip().partition(":")
        try:
            runs[float(lr)] = int(steps) if steps else default_steps
        except ValueError:
            raise SystemExit(f"--lrs: {item!r} is not LR or LR:STEPS (e.g. 1e-6:21)") from None
        if runs[float(lr)] < 2:
            raise SystemExit(f"--lrs: {item!r} needs at least 2 steps (a delta needs two versions after the first)")
    return runs


def _captured(lr: float, steps: int, args) -> _delta.Captured:
    cap = _delta.Captured(Path(args.work) / f"lr{lr:g}")
    if args.reuse and len(cap.versions) >= steps + 1 and cap.info():
        print(f"lr {lr:g}: reusing {len(cap.versions)} captured versions in {cap.root}")
        return cap
    print(f"lr {lr:g}: running {steps} GRPO steps (bf16), capturing every version ...", flush=True)
    return _delta.capture_run(lr, steps, cap.root, print)


def _sizes(lr: float, cap: _delta.Captured) -> tuple[str, dict]:
    versions = cap.versions
    rows, ratios, fulls, deltas, entropy, ours_zstd, zstd_xor = [], [], [], [], [], [], []
    import zstandard

    z = zstandard.ZstdCompressor(level=1)
    pulls = {p["version"]: p for p in cap.info().get("pulls", [])}
    run_delta = {m.get("publish_delta", {}).get("target"): m["publish_delta"] for m in _delta.run_metrics(cap)
                 if m.get("publish_delta")}
    a = cap.load(versions[0])
    for k in versions[:-1]:
        b = cap.load(k + 1)
        delta, counts = _delta.encode(a, b)
        n = a.size
        ratio = n / len(delta)
        ratios.append(ratio)
        fulls.append(n)
        deltas.append(len(delta))
        entropy.append(_delta.entropy_bytes(a, b))
        ours_zstd.append(len(z.compress(delta)))
        if k in (versions[0], versions[len(versions) // 2], versions[-2]):
            zstd_xor.append(n / len(z.compress(np.bitwise_xor(a, b))))
        served = run_delta.get(k + 1, {})
        pulled = pulls.get(k + 1, {})
        rows.append([f"{k} -> {k + 1}", f"{n:,}", f"{len(delta):,}", f"{ratio:.1f}x",
                     f"{100 * counts['changed_words'] / (n // 2):.3f}%",
                     f"{served.get('bytes', 0):,}" if served else "-", pulled.get("route", "-")])
        a = b
    f = {"mean": float(np.mean(ratios)), "median": float(np.median(ratios)), "min": float(np.min(ratios)),
         "max": float(np.max(ratios)), "p10": float(np.percentile(ratios, 10)),
         "aggregate": sum(fulls) / sum(deltas), "entropy": sum(fulls) / max(sum(entropy), 1.0),
         "ours_zstd": sum(fulls) / sum(ours_zstd), "zstd_xor": float(np.mean(zstd_xor)), "steps": len(ratios)}
    md = render_table(f"lr {lr:g}: full version vs delta, per step (bf16, {len(ratios)} real steps)",
                      ["step", "full bytes", "delta bytes", "ratio", "bf16 values changed",
                       "delta the run served", "capture pull"], rows)
    md += "\n" + render_table(
        f"lr {lr:g}: ratio distribution over {len(ratios)} steps",
        ["mean", "median", "p10", "min", "max", "aggregate", "ceiling (entropy)", "zstd-1 on XOR",
         "ours + zstd-1"],
        [[f"{f[k]:.1f}x" for k in ("mean", "median", "p10", "min", "max", "aggregate", "entropy", "zstd_xor",
                                    "ours_zstd")]])
    return md, f


def _speeds(captured: dict, figures: dict) -> tuple[str, dict]:
    from rlboost.transfer import new_secret

    rows, best = [], {}
    for lr, cap in captured.items():
        versions = cap.versions
        for k in (versions[0], versions[len(versions) // 2]):
            s = _delta.codec_speed(cap.load(k), cap.load(k + 1), new_secret(), zstd=True)
            rows.append([f"lr {lr:g}, {k} -> {k + 1}", *(f"{getattr(s, f):.2f}" for f in (
                "encode", "apply_in_place", "apply_copy", "verify", "memcpy", "xor_pass", "zstd_xor"))])
            for field in ("encode", "apply_in_place", "apply_copy", "memcpy"):
                best.setdefault(field, []).append(getattr(s, field))
    md = render_table("Per core: GB of payload per CPU second (one thread)",
                      ["pair", "encode", "apply in place", "apply into a copy", "verify (tags)", "memcpy (ceiling)",
                       "XOR pass (ceiling)", "zstd-1 on XOR (peer)"], rows)
    return md, {k: min(v) for k, v in best.items()}  # the slowest pair: what every step gets at least


def _publish_path(captured: dict) -> str:
    rows = []
    for lr, cap in captured.items():
        metrics = _delta.run_metrics(cap)
        deltas = [m["publish_delta"] for m in metrics if m.get("publish_delta", {}).get("total_s") is not None]
        rows.append([f"lr {lr:g}", f"{_delta.median([m['phase_publish_s'] for m in metrics]):.2f}",
                     f"{_delta.median([d['total_s'] for d in deltas]):.3f}",
                     f"{_delta.median([m['step_wall_s'] for m in metrics]):.1f}",
                     f"{sum(m.get('weight_delta_pulls', 0) for m in metrics)} of {sum(m.get('pulls', 0) for m in metrics)}"])
    return render_table("The runs' own publishing (medians over steps)",
                        ["run", "publish (gather + stage + tags), s", "delta encode + tag (own thread, after), s",
                         "step, s", "instance pulls that took a delta"], rows)


def _sync(cap: _delta.Captured, rounds: int) -> tuple[str, dict]:
    versions = cap.versions
    pairs = versions[len(versions) // 2: len(versions) // 2 + rounds]
    rows, out = [], {}
    for label, delta in (("with deltas", True), ("without deltas", False)):
        got = _delta.weight_sync(cap, pairs, 4, CAP_BYTES_PER_S, delta)
        out["delta" if delta else "full"] = _delta.median([r["sync_s"] for r in got])
        for r in got:
            applied = [i.get("apply_s", 0) + i.get("verify_s", 0) for i in r["instances"]]
            rows.append([label, f"{r['version'] - 1} -> {r['version']}", f"{r['sync_s']:.3f}", ",".join(r["routes"]),
                         f"{r['trainer_bytes']:,}", f"{r['trainer_bytes'] / CAP_BYTES_PER_S:.3f}",
                         f"{r['encode_s']:.3f}" if delta else "-", f"{max(applied):.3f}" if delta else "-"])
    rows.append(["speedup (medians)", "", f"{out['full'] / out['delta']:.1f}x", "", "", "", "", ""])
    md = render_table("Weight sync per step: 4 instances behind a 1 Gbit/s trainer link",
                      ["", "step", "sync, s", "route", "bytes from the trainer", "their link time, s",
                       "delta encode, s", "apply + verify, s (slowest instance)"], rows)
    return md, out


def _save(args, sections: list[str], line: str, load0: float, took_s: float) -> None:
    out = Path(__file__).parent / "results" / f"delta_{hardware_tag()}_{today()}.md"
    cmd = " ".join(["python bench/delta_weights.py", *sys.argv[1:]])
    head = [f"# Delta weight updates, {hardware_tag()}, {today()}", "", f"Command: `{cmd}` ({took_s / 60:.0f} min)",
            "", f"Load average (1 min) at start / end: {load0:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
            "cores (the machine is shared; compare ratios, not absolute figures).", "", METHOD]
    out.write_text("\n".join(head) + "\n" + "\n".join(sections) + "\n```\n" + line + "\n```\n")
    print(f"saved {out}")


if __name__ == "__main__":
    sys.exit(main())
