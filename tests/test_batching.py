"""Batching and encoding: truncation, bucket shapes, determinism, exact resume across epochs, eval
coverage, prefetch."""

import itertools
import threading
import time

import numpy as np
import pytest

from experiments.data import batching, encoding, tokenizers
from experiments.errors import UserError

BUCKETS = (8, 16, 32, 48)
MAX_LEN = 40  # 48 is above max_len, so the bucket set is (8, 16, 32, 40)
SIZES = (8, 16, 32, 40)


def _data(n=500, seed=1):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, MAX_LEN + 1, n)
    encoded = [rng.integers(3, 50, k).astype(np.int32) for k in lengths]
    labels = rng.integers(0, 3, n).astype(np.int32)
    return encoded, labels


def _epoch(encoded, labels, seed=0, epoch=0, batch_size=32):
    """One epoch of the stream as (example indices, batch) pairs."""
    lengths = np.array([len(s) for s in encoded])
    order = batching.epoch_order(lengths, batch_size, seed, epoch)
    stream = batching.train_stream(
        encoded,
        labels,
        batch_size=batch_size,
        buckets=BUCKETS,
        max_len=MAX_LEN,
        seed=seed,
        start_step=epoch * len(order),
    )
    return list(zip(order, stream, strict=False))


def _assert_same(a: list[dict], b: list[dict]):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype
            np.testing.assert_array_equal(x[k], y[k])


def _check_batch(idx, batch, encoded, labels, batch_size):
    """`batch` holds examples `idx` in its first rows, then weight-0 fillers."""
    tokens, mask = batch["tokens"], batch["mask"]
    assert set(batch) == {"tokens", "mask", "label", "weight"}
    assert tokens.dtype == np.int32 and mask.dtype == bool and batch["weight"].dtype == np.float32
    assert batch["label"].dtype == np.int32
    B, L = tokens.shape
    assert B == batch_size and L in SIZES and len(idx) <= B
    longest = max((len(encoded[i]) for i in idx), default=0)
    assert L == min(s for s in SIZES if s >= longest)  # the smallest bucket that fits
    np.testing.assert_array_equal(mask, tokens != tokenizers.PAD)
    np.testing.assert_array_equal(batch["weight"], np.arange(B) < len(idx))
    for row in range(B):
        if row >= len(idx):
            assert not mask[row].any() and batch["label"][row] == 0
            continue
        seq = encoded[idx[row]]
        np.testing.assert_array_equal(tokens[row, : len(seq)], seq)
        assert not tokens[row, len(seq) :].any() and batch["label"][row] == labels[idx[row]]


def test_an_epoch_covers_every_example_once_with_bucket_shapes():
    encoded, labels = _data()
    epoch = _epoch(encoded, labels)
    assert len(epoch) == batching.steps_per_epoch(500, 32) == 16
    for idx, batch in epoch:
        _check_batch(idx, batch, encoded, labels, 32)
    assert sorted(np.concatenate([idx for idx, _ in epoch]).tolist()) == list(range(500))


def test_train_order_is_pure_function_of_seed_and_epoch():
    encoded, labels = _data()
    a = [b for _, b in _epoch(encoded, labels, seed=3, epoch=2)]
    _assert_same(a, [b for _, b in _epoch(encoded, labels, seed=3, epoch=2)])
    orders = [
        np.concatenate([idx for idx, _ in _epoch(encoded, labels, seed=s, epoch=e)])
        for s, e in ((3, 2), (3, 1), (4, 2))
    ]
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], orders[2])


@pytest.mark.parametrize("start", [0, 1, 7, 15, 16, 40])
def test_stream_from_a_start_step_equals_the_uninterrupted_stream(start):
    """Epochs follow one another (16 batches each); step n is the same batch however reached."""
    encoded, labels = _data()
    kw = dict(batch_size=32, buckets=BUCKETS, max_len=MAX_LEN, seed=5)
    full = list(itertools.islice(batching.train_stream(encoded, labels, **kw), 60))
    resumed = batching.train_stream(encoded, labels, start_step=start, **kw)
    _assert_same(list(itertools.islice(resumed, 60 - start)), full[start:])
    epochs = [[b for _, b in _epoch(encoded, labels, seed=5, epoch=e)] for e in range(3)]
    _assert_same(full[:48], epochs[0] + epochs[1] + epochs[2])


def test_length_sorting_within_chunks_reduces_padding():
    encoded, labels = _data(n=2000)
    epoch = _epoch(encoded, labels)
    spreads = []
    for idx, _ in epoch:
        lengths = [len(encoded[i]) for i in idx]
        spreads.append(max(lengths) - min(lengths))
    # A chunk of 50 batches sorted by length: lengths 0..40 spread over ~50 batches each.
    assert np.median(spreads) <= 2
    batches = [b for _, b in epoch]
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
    for idx, batch in batches:
        _check_batch(idx, batch, encoded, labels, 10)
    assert sorted(np.concatenate([idx for idx, _ in batches]).tolist()) == list(range(103))
    assert sum(b["weight"].sum() for _, b in batches) == 103


def test_empty_inputs():
    assert list(batching.eval_batches([], [], batch_size=4, buckets=BUCKETS, max_len=8)) == []
    with pytest.raises(ValueError, match="no training examples"):
        next(batching.train_stream([], [], batch_size=4, buckets=BUCKETS, max_len=8, seed=0))


def test_bucket_sizes():
    assert batching.bucket_sizes((64, 32, 256, 512), 128) == (32, 64, 128)
    assert batching.bucket_sizes((), 50) == (50,)
    with pytest.raises(ValueError, match="buckets"):
        batching.bucket_sizes((0, 8), 16)
    # The bag's lengths: short batches keep the buckets, longer ones max_len doubled.
    assert batching.bag_sizes((8, 16, 32, 48), 40, 300) == (8, 16, 32, 40, 48, 80, 160, 300)
    assert batching.bag_sizes((8, 16), 16, 64) == (8, 16, 32, 64)


def test_batches_carry_what_the_bag_reads():
    """With bag ids (a longer cut of each text), a batch holds them as bag_tokens, padded to the
    smallest bag size that fits the batch's longest; without, there is no such key."""
    encoded, labels = _data(n=150)
    rng = np.random.default_rng(2)
    bag_ids = [np.concatenate([s, rng.integers(3, 50, rng.integers(0, 200))]) for s in encoded]
    kw = {"batch_size": 16, "buckets": BUCKETS, "max_len": MAX_LEN}
    sizes = batching.bag_sizes(BUCKETS, MAX_LEN, 300)
    lengths = np.array([len(s) for s in encoded])
    order = batching.epoch_order(lengths, 16, 0, 0)
    stream = batching.train_stream(encoded, labels, seed=0, bag_ids=bag_ids, bag_len=300, **kw)
    evals = batching.eval_batches(encoded, labels, bag_ids=bag_ids, bag_len=300, **kw)
    for idx, batch in [*zip(order, stream, strict=False), *evals]:
        bag = batch.pop("bag_tokens")
        _check_batch(idx, batch, encoded, labels, 16)  # the rest is as without the bag
        longest = max(len(bag_ids[i]) for i in idx)
        assert bag.dtype == np.int32 and bag.shape[1] == min(m for m in sizes if m >= longest)
        for row, i in enumerate(idx):
            np.testing.assert_array_equal(bag[row, : len(bag_ids[i])], bag_ids[i])
            assert not bag[row, len(bag_ids[i]) :].any()
        assert not bag[len(idx) :].any()
    assert "bag_tokens" not in next(batching.train_stream(encoded, labels, seed=0, **kw))


@pytest.mark.parametrize("add_cls", [False, True])
def test_the_bag_window_is_a_longer_cut_with_the_same_share_of_the_end(add_cls):
    class Data:
        max_len, tail_len, bag_len = 9, 6, 17

    window = encoding.bag_window(Data, add_cls)
    assert window["max_len"] == 17 and window["tail_len"] == 6 * (17 - add_cls) // (9 - add_cls)
    text = "abcdefghijklmnopqrstuvwxyz"
    ids = encoding.cut([_Chars().encode(text)], **window)[0]
    short = encoding.encode(_Chars(), [text], max_len=9, add_cls=add_cls, tail_len=6)[0]
    assert len(ids) == 17 and set(short.tolist()) <= set(ids.tolist())  # it reads more
    np.testing.assert_array_equal(ids[-6:], short[-6:])  # both end where the text ends
    np.testing.assert_array_equal(ids[: 9 - 6], short[: 9 - 6])  # and start where it starts
    Data.bag_len = 8
    with pytest.raises(UserError, match=r"data.bag_len must be 0 or an integer >= max_len \(9\)"):
        encoding.bag_window(Data, add_cls)


class _Chars:
    def encode(self, text):
        return np.array([ord(c) for c in text], np.int32)


@pytest.mark.parametrize("add_cls", [False, True])
def test_encode_truncates_and_prepends_cls(add_cls):
    texts = ["", "abc", "x" * 100]
    out = encoding.encode(_Chars(), texts, max_len=10, add_cls=add_cls)
    assert [len(s) for s in out] == [0 + add_cls, 3 + add_cls, 10]
    for s, t in zip(out, texts, strict=True):
        assert s.dtype == np.int32
        body = s[1:] if add_cls else s
        assert not add_cls or s[0] == tokenizers.CLS
        np.testing.assert_array_equal(body, [ord(c) for c in t[: len(body)]])


@pytest.mark.parametrize("add_cls", [False, True])
def test_encode_tail_len_keeps_the_start_and_the_end(add_cls):
    long, short = "abcdefghijklmnopqrstuvwxyz", "abcdef"
    out = encoding.encode(_Chars(), [long, short], max_len=10, add_cls=add_cls, tail_len=4)
    body = out[0][1:] if add_cls else out[0]
    keep_head = 10 - add_cls - 4
    np.testing.assert_array_equal(body, [ord(c) for c in long[:keep_head] + "wxyz"])
    np.testing.assert_array_equal(out[1][add_cls:], [ord(c) for c in short])  # fits: uncut
    whole_tail = encoding.encode(_Chars(), [long], max_len=10, add_cls=False, tail_len=10)[0]
    np.testing.assert_array_equal(whole_tail, [ord(c) for c in long[-10:]])


@pytest.mark.parametrize("tail_len", [-1, 10, 2.5])
def test_encode_refuses_a_tail_longer_than_what_is_kept(tail_len):
    with pytest.raises(UserError, match="data.tail_len must be an integer in \\[0, 9\\]"):
        encoding.encode(_Chars(), ["abc"], max_len=10, add_cls=True, tail_len=tail_len)


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


@pytest.mark.parametrize("with_bag", [False, True])
def test_rows_of_each_process_make_up_the_whole_batch(with_bag):
    """Several processes each build their rows of a batch; together they are the one batch a
    single process builds, with its bucket length (set by the longest example of all rows)."""
    encoded, labels = _data(n=103)
    kw = {"batch_size": 12, "buckets": BUCKETS, "max_len": MAX_LEN}
    if with_bag:  # bag_tokens too: each process pads them to the whole batch's bag size
        kw |= {"bag_ids": [np.concatenate([s, s, s]) for s in encoded], "bag_len": 120}
    parts = [slice(0, 4), slice(4, 8), slice(8, 12)]  # three processes

    def train(rows=slice(None)):
        return itertools.islice(batching.train_stream(encoded, labels, seed=3, rows=rows, **kw), 20)

    def evaluate(rows=slice(None)):
        return [b for _, b in batching.eval_batches(encoded, labels, rows=rows, **kw)]

    assert 103 % 12 == 7  # last eval batch: process 1 holds a filler row, process 2 only fillers
    for make in (train, evaluate):
        wholes, shares = list(make()), [list(make(r)) for r in parts]
        assert all(len(s) == len(wholes) for s in shares)
        for n, whole in enumerate(wholes):
            assert ("bag_tokens" in whole) == with_bag
            for key in whole:
                assert all(s[n][key].shape[0] == 4 for s in shares)
                np.testing.assert_array_equal(
                    np.concatenate([s[n][key] for s in shares]), whole[key]
                )
