"""Weight buckets: about a byte budget each, in order, never cutting a decoder layer (an
engine that repacks fused layers needs each whole in one call), a new bucket per kind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.models.buckets import buckets, decoder_layer


def test_a_bucket_never_cuts_a_decoder_layer(tmp_path):
    ckpt = build_tiny_checkpoint(tmp_path, arch="qwen3", seed=0, num_layers=3)
    pairs = list(load_pretrained(ckpt).named_weights().items())
    layer_bytes = sum(t.nbytes for n, t in pairs if n.startswith("model.layers.1."))
    cut = list(buckets(pairs, bucket_bytes=layer_bytes // 3, nbytes=lambda p: p[1].nbytes,
                       unit=lambda p: decoder_layer(p[0])))
    assert [p for b in cut for p in b] == pairs  # all of them, in order
    for i in range(3):
        holding = [k for k, b in enumerate(cut) if any(n.startswith(f"model.layers.{i}.") for n, _ in b)]
        assert len(holding) == 1, f"layer {i} is cut over buckets {holding}"
        (k,) = holding
        assert {n for n, _ in cut[k]} == {n for n, _ in pairs if n.startswith(f"model.layers.{i}.")}


def test_a_new_kind_starts_a_new_bucket():
    items = [("a", 4, "f32"), ("b", 4, "f32"), ("c", 4, "bf16"), ("d", 4, "f32")]
    cut = list(buckets(items, bucket_bytes=100, nbytes=lambda i: i[1], kind=lambda i: i[2]))
    assert [[i[0] for i in b] for b in cut] == [["a", "b"], ["c"], ["d"]]


def test_a_budget_below_one_byte_is_refused():
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(buckets([1], bucket_bytes=0, nbytes=lambda i: 1))


@given(sizes=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 50)), max_size=40),
       budget=st.integers(1, 120))
def test_buckets_keep_order_and_units_and_stay_within_budget(sizes, budget):
    items = [(f"model.layers.{layer}.w{i}", n) for i, (layer, n) in enumerate(sizes)]
    cut = list(buckets(items, bucket_bytes=budget, nbytes=lambda i: i[1], unit=lambda i: decoder_layer(i[0])))
    assert [i for b in cut for i in b] == items
    run_of, run = [], -1  # consecutive items of one layer are one unit
    for k, (name, _) in enumerate(items):
        run += k == 0 or decoder_layer(name) != decoder_layer(items[k - 1][0])
        run_of.append(run)
    k = 0
    bucket_of_run: dict[int, int] = {}
    for b_index, b in enumerate(cut):
        runs = set()
        for _ in b:
            assert bucket_of_run.setdefault(run_of[k], b_index) == b_index, "a unit is cut"
            runs.add(run_of[k])
            k += 1
        assert sum(n for _, n in b) <= budget or len(runs) == 1  # over budget: one unit alone
