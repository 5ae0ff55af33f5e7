"""Batching: truncation, bucket shapes, determinism, exact resume, eval coverage, prefetch."""

import threading
import time

import numpy as np
import pytest

from experiments import batching, tokenizers

BUCKETS = (8, 16, 32, 48)
MAX_LEN = 40  # 48 is above max_len, so the bucket set is (8, 16, 32, 40)
SIZES = (8, 16, 32, 40)


def _data(n=500, seed=1):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, MAX_LEN + 1, n)
    encoded = [rng.integers(3, 50, k).astype(np.int32) for k in lengths]
    labels = rng.integers(0, 3, n).astype(np.int32)
    return encoded, labels


def _train(encoded, labels, **kw):
    args = dict(batch_size=32, buckets=BUCKETS, max_len=MAX_LEN, seed=0, epoch=0)
    args.update(kw)
    return list(batching.train_batches(encoded, labels, **args))


def _assert_same(a: list[dict], b: list[dict]):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype
            np.testing.assert_array_equal(x[k], y[k])


def _check_batch(batch, encoded, labels, batch_size):
    tokens, mask, index = batch["tokens"], batch["mask"], batch["index"]
    assert tokens.dtype == np.int32 and mask.dtype == bool and batch["weight"].dtype == np.float32
    assert batch["label"].dtype == np.int32 and index.dtype == np.int32
    B, L = tokens.shape
    assert B == batch_size and L in SIZES
    real = index >= 0
    longest = max((len(encoded[i]) for i in index[real]), default=0)
    assert L == min(s for s in SIZES if s >= longest)  # the smallest bucket that fits
    np.testing.assert_array_equal(mask, tokens != tokenizers.PAD)
    np.testing.assert_array_equal(batch["weight"], real.astype(np.float32))
    for row, i in enumerate(index):
        if i < 0:
            assert not mask[row].any() and batch["label"][row] == 0
            continue
        seq = encoded[i]
        np.testing.assert_array_equal(tokens[row, : len(seq)], seq)
        assert not tokens[row, len(seq) :].any() and batch["label"][row] == labels[i]


def test_train_batches_cover_epoch_once_with_bucket_shapes():
    encoded, labels = _data()
    batches = _train(encoded, labels)
    assert len(batches) == batching.steps_per_epoch(500, 32) == 16
    for b in batches:
        _check_batch(b, encoded, labels, 32)
    idx = np.concatenate([b["index"] for b in batches])
    assert sorted(idx[idx >= 0].tolist()) == list(range(500))
    assert (idx == -1).sum() == 16 * 32 - 500


def test_train_order_is_pure_function_of_seed_and_epoch():
    encoded, labels = _data()
    a = _train(encoded, labels, seed=3, epoch=2)
    _assert_same(a, _train(encoded, labels, seed=3, epoch=2))
    orders = [
        np.concatenate([b["index"] for b in _train(encoded, labels, seed=s, epoch=e)])
        for s, e in ((3, 2), (3, 1), (4, 2))
    ]
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], orders[2])


@pytest.mark.parametrize("start", [0, 1, 7, 15, 16, 40])
def test_resume_equals_uninterrupted_suffix(start):
    encoded, labels = _data()
    full = _train(encoded, labels, seed=5, epoch=1)
    _assert_same(_train(encoded, labels, seed=5, epoch=1, start_step=start), full[start:])


def test_length_sorting_within_chunks_reduces_padding():
    encoded, labels = _data(n=2000)
    batches = _train(encoded, labels)
    spreads = []
    for b in batches:
        lengths = [len(encoded[i]) for i in b["index"] if i >= 0]
        spreads.append(max(lengths) - min(lengths))
    # A chunk of 50 batches sorted by length: lengths 0..40 spread over ~50 batches each.
    assert np.median(spreads) <= 2
    fill = sum(b["mask"].sum() for b in batches) / sum(b["tokens"].size for b in batches)
    # The same buckets without sorting: batches of randomly drawn examples.
    random_fill = []
    for g in np.split(np.random.default_rng(0).permutation(2000), range(32, 2000, 32)):
        lengths = [len(encoded[i]) for i in g]
        random_fill.append(np.mean(lengths) / min(s for s in SIZES if s >= max(lengths)))
    assert fill > np.mean(random_fill) + 0.15


def test_eval_batches_cover_every_example_exactly_once():
    encoded, labels = _data(n=103)
    batches = list(
        batching.eval_batches(encoded, labels, batch_size=10, buckets=BUCKETS, max_len=MAX_LEN)
    )
    assert len(batches) == 11
    for b in batches:
        _check_batch(b, encoded, labels, 10)
    idx = np.concatenate([b["index"] for b in batches])
    assert sorted(idx[idx >= 0].tolist()) == list(range(103)) and (idx == -1).sum() == 7
    assert sum(b["weight"].sum() for b in batches) == 103


def test_empty_inputs():
    assert _train([], np.zeros(0, np.int32)) == []
    assert list(batching.eval_batches([], [], batch_size=4, buckets=BUCKETS, max_len=8)) == []


def test_bucket_sizes():
    assert batching.bucket_sizes((64, 32, 256, 512), 128) == (32, 64, 128)
    assert batching.bucket_sizes((), 50) == (50,)
    with pytest.raises(ValueError, match="buckets"):
        batching.bucket_sizes((0, 8), 16)


class _Chars:
    def encode(self, text):
        return np.array([ord(c) for c in text], np.int32)


@pytest.mark.parametrize("add_cls", [False, True])
def test_encode_all_truncates_and_prepends_cls(add_cls):
    texts = ["", "abc", "x" * 100]
    out = batching.encode_all(_Chars(), texts, max_len=10, add_cls=add_cls)
    assert [len(s) for s in out] == [0 + add_cls, 3 + add_cls, 10]
    for s, t in zip(out, texts, strict=True):
        assert s.dtype == np.int32
        body = s[1:] if add_cls else s
        assert not add_cls or s[0] == tokenizers.CLS
        np.testing.assert_array_equal(body, [ord(c) for c in t[: len(body)]])


def test_prefetch_yields_in_order_and_reraises():
    assert list(batching.prefetch(iter(range(100)), size=3)) == list(range(100))

    def failing():
        yield 1
        yield 2
        raise KeyError("boom")

    got = []
    with pytest.raises(KeyError, match="boom"):
        for x in batching.prefetch(failing()):
            got.append(x)
    assert got == [1, 2]


def test_prefetch_producer_stops_when_consumer_stops():
    before = threading.active_count()
    it = batching.prefetch(iter(range(10**9)), size=2)
    assert next(it) == 0
    it.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before
