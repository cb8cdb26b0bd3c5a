"""What a run is, read from its config.json: real compute (engines and trainer on a
device), or emulated (engines and a trainer that take a named GPU's time, every duration
divided by one time_scale, each emulated token standing for token_block real ones). Every
figure a run reports is read at this fidelity, so its summary says it first."""

from __future__ import annotations

from typing import Any


def run_fidelity(config: dict[str, Any], tokens_per_s: float) -> dict[str, Any]:
    """{"fidelity": one line} and, for an emulated run, "modelled_tokens_per_s": the run's
    rollout rate as tokens per second of the modelled cluster; {} for a config that does not
    say (an older or a damaged one).

    >>> run_fidelity({"rollout": {"backend": "emulated", "emulated": {"model": "qwen3-8b",
    ...     "accelerator": "h100-sxm", "time_scale": 25.0, "token_block": 64}}}, 100.0)["modelled_tokens_per_s"]
    256.0
    """
    rollout, trainer = config.get("rollout"), config.get("trainer") or {}
    if not isinstance(rollout, dict) or not isinstance(trainer, dict) or not isinstance(rollout.get("backend"), str):
        return {}
    if rollout["backend"] != "emulated":
        return {"fidelity": f"real: {rollout['backend']} engines, trainer on {trainer.get('device', '?')}"}
    e = rollout.get("emulated") if isinstance(rollout.get("emulated"), dict) else {}
    try:
        scale, block = float(e.get("time_scale", 1.0)), int(e.get("token_block", 1))
        modelled = tokens_per_s * block / scale
    except (TypeError, ValueError, ZeroDivisionError):
        return {}
    timed = (f"engines and trainer take the time of {e.get('model')} on {e.get('accelerator')}" if e.get("model")
             else "engines decode at their configured rates")
    return {"fidelity": f"emulated on this machine: {timed}; time_scale {scale:g} (a second of the run is {scale:g} s "
                        f"of the modelled cluster), {block} real tokens per emulated token",
            "modelled_tokens_per_s": modelled}
