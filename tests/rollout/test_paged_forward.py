"""The engine's paged forward computes DecoderLM's function, and a sample's logits do not
depend on its batch, its block size, or how its prefix got into the cache."""

import pytest
import torch

from rlboost.models import build_tiny_checkpoint, load_pretrained
from rlboost.rollout.embedded.forward import Chunk, PagedForward
from rlboost.rollout.embedded.kv_cache import PagedKVCache


def make_runner(model, block_size=16, num_blocks=96):
    c = model.config
    cache = PagedKVCache(num_layers=c.num_hidden_layers, num_kv_heads=c.num_key_value_heads,
                         head_dim=c.head_dim, num_blocks=num_blocks, block_size=block_size,
                         dtype=torch.float32, device=torch.device("cpu"))
    return PagedForward(model, cache), cache


def greedy_batch(model, prompts, steps):
    """Prefill all prompts in one step, then decode them together; return per-sample
    tokens and the logits of every generated position."""
    run, cache = make_runner(model)
    blocks = [cache.allocator.allocate(16) for _ in prompts]
    seqs, logits = [list(p) for p in prompts], [[] for _ in prompts]
    chunks = [Chunk(list(p), 0, b, True) for p, b in zip(prompts, blocks)]
    for _ in range(steps):
        out = run(chunks)
        for i, row in enumerate(out):
            logits[i].append(row)
            seqs[i].append(int(row.argmax()))
        chunks = [Chunk([s[-1]], len(s) - 1, b, True) for s, b in zip(seqs, blocks)]
    return seqs, [torch.stack(x) for x in logits]


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 259, (n,), generator=gen).tolist() for n in (3, 40, 90)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_paged_logits_equal_dense_forward(tmp_path, arch, prompts):
    model = load_pretrained(build_tiny_checkpoint(tmp_path, arch=arch, seed=1)).requires_grad_(False)
    seqs, logits = greedy_batch(model, prompts, steps=30)
    for prompt, seq, got in zip(prompts, seqs, logits):
        dense = model(torch.tensor([seq[:-1]]))[0, len(prompt) - 1:]
        torch.testing.assert_close(got, dense, rtol=0, atol=1e-4)


def test_sample_alone_chunked_or_reprefilled_matches_batched(tiny_ckpt, prompts):
    model = load_pretrained(tiny_ckpt).requires_grad_(False)
    seqs, batched = greedy_batch(model, prompts, steps=90)  # contexts cross several key segments
    for i, prompt in enumerate(prompts):
        seq, n = seqs[i], len(prompts[i])
        for block_size in (16, 5):
            run, cache = make_runner(model, block_size=block_size)
            blocks = cache.allocator.allocate(60)
            alone = []
            for start in range(0, n, 7):  # chunked prefill, 7 tokens a step
                end = min(n, start + 7)
                out = run([Chunk(seq[start:end], start, blocks, end == n)])
            alone.append(out[0])
            for t in range(n, len(seq) - 1):
                alone.append(run([Chunk([seq[t]], t, blocks, True)])[0])
            torch.testing.assert_close(torch.stack(alone), batched[i], rtol=0, atol=1e-6)
        run, cache = make_runner(model)
        reprefill = run([Chunk(seq[:-1], 0, cache.allocator.allocate(16), True)])[0]
        torch.testing.assert_close(reprefill, batched[i][-1], rtol=0, atol=1e-6)


def test_block_allocator_hands_out_and_takes_back():
    run_cache = PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=2, num_blocks=4, block_size=2,
                             dtype=torch.float32, device=torch.device("cpu"))
    alloc = run_cache.allocator
    a = alloc.allocate(3)
    assert a == [0, 1, 2] and alloc.num_free == 1
    with pytest.raises(MemoryError):
        alloc.allocate(2)
    alloc.free(a)
    assert sorted(alloc.allocate(4)) == [0, 1, 2, 3]
    assert run_cache.slot_ids([3, 1], 1, 4) == [7, 2, 3]


def test_decodes_attend_in_buckets_of_similar_length():
    from rlboost.rollout.embedded.forward import KEY_SEGMENT, decode_buckets

    lengths = [5, 12, 60, 64, 65, 130, 4000] + [20] * 30
    chunks = [Chunk([1], n - 1, [], True) for n in lengths]
    buckets = decode_buckets(chunks)
    assert sorted(i for idx in buckets.values() for i in idx) == list(range(len(lengths)))
    for width, idx in buckets.items():
        assert all(lengths[i] <= width < 2 * max(lengths[i], KEY_SEGMENT) for i in idx)
    # keys read per layer: bounded by twice what the samples need, not samples x the longest
    read = sum(width * len(idx) for width, idx in buckets.items())
    assert read <= 2 * sum(max(n, KEY_SEGMENT) for n in lengths) < len(lengths) * 4096 / 4


def test_a_long_context_in_the_batch_does_not_change_short_samples(tiny_ckpt, prompts):
    model = load_pretrained(tiny_ckpt).requires_grad_(False)
    long_prompt = torch.randint(0, 259, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    _, alone = greedy_batch(model, prompts, steps=6)
    run, cache = make_runner(model, num_blocks=200)
    seqs = [list(p) for p in [*prompts, long_prompt]]
    blocks = [cache.allocator.allocate(40) for _ in seqs]
    chunks = [Chunk(list(s), 0, b, True) for s, b in zip(seqs, blocks)]
    mixed = [[] for _ in seqs]
    for _ in range(6):
        out = run(chunks)
        for i, row in enumerate(out):
            mixed[i].append(row)
            seqs[i].append(int(row.argmax()))
        chunks = [Chunk([s[-1]], len(s) - 1, b, True) for s, b in zip(seqs, blocks)]
    for i in range(len(prompts)):
        torch.testing.assert_close(torch.stack(mixed[i]), alone[i], rtol=0, atol=1e-6)
