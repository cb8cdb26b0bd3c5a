"""`--set` overrides reach nested config fields with the field's type, and reject typos."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from rlboost.config.overrides import apply_overrides


@dataclass(kw_only=True, slots=True, frozen=True)
class _Inner:
    lr: float = 1e-3
    steps: int = 10
    name: str = "x"
    enabled: bool = False
    cap: float | None = None
    ids: tuple[int, ...] = ()
    mode: Literal["a", "b"] = "a"


@dataclass(kw_only=True, slots=True, frozen=True)
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    seed: int = 0


def test_nested_values_are_parsed_by_type():
    cfg = apply_overrides(_Outer(), [
        "inner.lr=3e-4", "inner.steps=0x10", "inner.name=run", "inner.enabled=yes",
        "inner.cap=2.5", "inner.ids=1,2,3", "inner.mode=b", "seed=7",
    ])
    assert cfg.inner == _Inner(lr=3e-4, steps=16, name="run", enabled=True, cap=2.5, ids=(1, 2, 3), mode="b")
    assert cfg.seed == 7


def test_optional_accepts_none():
    cfg = apply_overrides(_Outer(inner=_Inner(cap=1.0)), ["inner.cap=none"])
    assert cfg.inner.cap is None


@pytest.mark.parametrize("assignment, message", [
    ("inner.lrr=1", "unknown field 'lrr'"),
    ("inner.steps=ten", r"inner.steps=ten: expected an integer, e.g. inner.steps="),
    ("inner.enabled=maybe", "expected true or false"),
    ("inner=3", "is a section"),
    ("inner.mode=c", "expected one of"),
    ("seed", "expects key=value"),
])
def test_bad_overrides_raise_value_error_naming_the_key(assignment, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(_Outer(), [assignment])


def test_validation_of_the_config_still_runs():
    @dataclass(kw_only=True, slots=True, frozen=True)
    class Checked:
        n: int = 1

        def __post_init__(self):
            if self.n < 1:
                raise ValueError(f"n must be >= 1, got {self.n}")

    with pytest.raises(ValueError, match="n must be >= 1"):
        apply_overrides(Checked(), ["n=0"])
