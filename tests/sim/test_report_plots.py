"""The simulator's report: the knee is where the reserved GPUs train for most of the step, the
saturation plot labels readable instance counts, and the headline compares with reserved only."""

from __future__ import annotations

from rlboost.sim.metrics import SimSummary
from rlboost.sim.report import SaturationPoint, _tick_counts, headline, knee, plot_saturation, plot_steps


def _point(n: int, tokens_per_s: float, window: float, idle: float, step: float = 200.0) -> SaturationPoint:
    s = SimSummary(steps=10, tokens=tokens_per_s * step * 10, seconds=step * 10, usd=100.0 + n, trainer_idle_s=idle,
                   rollout_idle_s=0.0, window_s=window, offload_share=0.5, preemptions=0, deaths=0,
                   mean_preemptible=n)
    return SaturationPoint(n, s)


def test_the_knee_is_the_first_count_where_window_and_idle_are_under_a_quarter_of_the_step(tmp_path):
    points = [_point(0, 10e3, 150, 0), _point(4, 16e3, 80, 20), _point(24, 25e3, 30, 10), _point(200, 28e3, 17, 7)]
    assert knee(points) == 24
    assert knee(points[:2]) is None
    # counts that would crowd each other on a linear axis are not all labelled; the knee always is
    ticks = _tick_counts([0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 200], 3)
    assert ticks[0] == 0 and ticks[-1] == 200 and 3 in ticks and 1 not in ticks
    plot_saturation(points, tmp_path / "s.png", title="t")
    records = [{"step": i, "tokens_per_s": 1e4, "generated_tokens_per_s": 9e3, "preemptible_up": 4} for i in (1, 2, 3)]
    plot_steps(records, tmp_path / "p.png", title="t")
    assert (tmp_path / "s.png").stat().st_size > 0 and (tmp_path / "p.png").stat().st_size > 0
    lines = headline(points, points[0].summary)
    assert lines[1].startswith("reserved only") and "2.80x" in lines[-1]
