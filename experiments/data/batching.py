"""Token id sequences -> fixed-shape numpy batches, padded to length buckets; a prefetch thread.

A batch: {"tokens": int32 [B, L], "mask": bool [B, L] (tokens != PAD), "label": int32 [B],
"weight": float32 [B] (1 real, 0 filler)}, plus "bag_tokens": int32 [B, M] when the bag reads more
of each text than attention does (config.data.bag_len), and a training stream's `extra` arrays
(per example, [B, ...]: a teacher's logits) under their names. B is always the batch size (a
short last batch is filled with weight-0 rows, so shapes stay few and evaluation counts every
example exactly once); L is the smallest bucket >= the longest sequence in the batch, so jit
compiles one program per bucket (M likewise, from the buckets and max_len times powers of two up
to bag_len).

Training order: batch n of the stream is batch n mod E of epoch n // E (E batches per epoch). An
epoch's order for (seed, epoch): shuffle with default_rng([seed, epoch]), sort by length within
chunks of ~50 batches (similar lengths share a batch: less padding), cut into batches, shuffle the
batch order. So the order is a pure function of (seed, n), which is what makes resume exact; only
lengths are touched before a batch is produced, so starting at step n skips cheaply.

Several processes: each builds the same order and keeps only its `rows` of every batch (L is still
the whole batch's), which the devices module joins into one global batch.
"""

import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from experiments.data.tokenizers import PAD

Batch = dict[str, np.ndarray]
SORT_CHUNK_BATCHES = 50


def options(data: Any) -> dict:
    """The batching keyword arguments that config.data sets for training."""
    return {
        "batch_size": data.batch_size,
        "buckets": tuple(data.buckets),
        "max_len": data.max_len,
        "bag_len": data.bag_len,
    }


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return -(-num_examples // batch_size)


def bucket_sizes(buckets: Sequence[int], max_len: int) -> tuple[int, ...]:
    """Sorted buckets capped at max_len, max_len always included."""
    if any(int(b) < 1 for b in buckets):
        raise ValueError(f"buckets must be positive, got {tuple(buckets)}")
    return tuple(sorted({int(b) for b in buckets if b < max_len} | {max_len}))


def bag_sizes(buckets: Sequence[int], max_len: int, bag_len: int) -> tuple[int, ...]:
    """The lengths M a batch's bag_tokens are padded to: the buckets, then max_len doubled up to
    bag_len. Texts no longer than max_len give the bag what the attention gets, so such batches
    keep their short bucket."""
    doubled, m = [], max_len
    while m < bag_len:
        doubled.append(m)
        m *= 2
    return bucket_sizes((*buckets, *doubled), bag_len)


def pad_one(x_L: np.ndarray, sizes: Sequence[int], fill: int) -> np.ndarray:
    """int32 [X]: one text's x_L and `fill` after it, X the first of `sizes` that holds it (its
    own length when none does), so that texts of one bucket share one compiled shape."""
    size = next((s for s in sizes if s >= len(x_L)), len(x_L))
    out = np.full((size,), fill, np.int32)
    out[: len(x_L)] = x_L
    return out


def epoch_order(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The example indices of each batch of one epoch, in training order."""
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    chunk = SORT_CHUNK_BATCHES * batch_size
    order = np.concatenate(
        [
            c[np.argsort(lengths[c], kind="stable")]
            for c in np.split(perm, range(chunk, len(perm), chunk))
        ]
    )
    groups = np.split(order, range(batch_size, len(order), batch_size)) if len(order) else []
    return [groups[b] for b in rng.permutation(len(groups))]


def train_stream(
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    batch_size: int,
    buckets: Sequence[int],
    max_len: int,
    seed: int,
    start_step: int = 0,
    rows: slice = slice(None),
    bag_ids: Sequence[np.ndarray] | None = None,
    bag_len: int = 0,
    extra: dict[str, np.ndarray] | None = None,
) -> Iterator[Batch]:
    """Training batches start_step, start_step + 1, ... across epochs, without end; only `rows`
    of each. With `bag_ids` (per text, [m <= bag_len]) they also hold bag_tokens; each `extra`
    array [N, ...] gives its rows of the batch's examples (zeros for fillers)."""
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if not len(ids):
        raise ValueError("no training examples")
    labels = np.asarray(labels, np.int32)
    lengths = np.array([len(s) for s in ids], np.int64)
    sizes = bucket_sizes(buckets, max_len)
    bag = (bag_ids, bag_sizes(buckets, max_len, bag_len)) if bag_ids is not None else None
    first_epoch, offset = divmod(start_step, steps_per_epoch(len(ids), batch_size))
    for epoch in itertools.count(first_epoch):
        for idx in epoch_order(lengths, batch_size, seed, epoch)[offset:]:
            yield _make_batch(ids, labels, idx, batch_size, sizes, rows, bag, extra)
        offset = 0


def eval_batches(
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    batch_size: int,
    buckets: Sequence[int],
    max_len: int,
    rows: slice = slice(None),
    bag_ids: Sequence[np.ndarray] | None = None,
    bag_len: int = 0,
) -> Iterator[tuple[np.ndarray, Batch]]:
    """(example indices [n <= B], batch): every example exactly once, sorted by length to pad
    little; rows n and on are fillers of weight 0. The indices are the whole batch's, the batch
    only its `rows`. `bag_ids` as in `train_stream`."""
    labels = np.asarray(labels, np.int32)
    lengths = np.array([len(s) for s in ids], np.int64)
    order = np.argsort(lengths, kind="stable")
    sizes = bucket_sizes(buckets, max_len)
    bag = (bag_ids, bag_sizes(buckets, max_len, bag_len)) if bag_ids is not None else None
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield idx, _make_batch(ids, labels, idx, batch_size, sizes, rows, bag)


def _make_batch(
    ids: Sequence[np.ndarray],
    labels: np.ndarray,
    idx: np.ndarray,
    batch_size: int,
    sizes: tuple[int, ...],
    rows: slice,
    bag: tuple[Sequence[np.ndarray], tuple[int, ...]] | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> Batch:
    start, stop, _ = rows.indices(batch_size)
    own = idx[start:stop]  # fewer than stop - start rows when fillers fall in `rows`
    tokens = _padded(ids, idx, own, stop - start, sizes)
    n = len(own)
    label = np.zeros(stop - start, np.int32)
    label[:n] = labels[own]
    weight = np.zeros(stop - start, np.float32)
    weight[:n] = 1.0
    batch = {"tokens": tokens, "mask": tokens != PAD, "label": label, "weight": weight}
    if bag is not None:
        batch["bag_tokens"] = _padded(bag[0], idx, own, stop - start, bag[1])
    for name, values in (extra or {}).items():
        batch[name] = np.zeros((stop - start, *values.shape[1:]), values.dtype)
        batch[name][:n] = values[own]
    return batch


def _padded(
    ids: Sequence[np.ndarray], idx: np.ndarray, own: np.ndarray, n: int, sizes: tuple[int, ...]
) -> np.ndarray:
    """int32 [n, L]: the `own` rows of ids, PAD after; L the smallest size >= the longest of the
    whole batch `idx` (so every process pads alike)."""
    longest = max((len(ids[i]) for i in idx), default=0)
    L = next((s for s in sizes if s >= longest), sizes[-1])  # longer than max_len: truncated
    out = np.full((n, L), PAD, np.int32)
    for row, i in enumerate(own):
        seq = ids[i][:L]
        out[row, : len(seq)] = seq
    return out


_DONE = object()


def prefetch(iterator: Iterator, size: int = 2) -> Iterator:
    """Runs `iterator` in a daemon thread, `size` items ahead; its exceptions re-raise here."""
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in iterator:
                if not put((item, None)):
                    return
        except BaseException as e:  # handed to the consumer, which re-raises it
            put((_DONE, e))
            return
        put((_DONE, None))

    threading.Thread(target=produce, daemon=True).start()
    try:
        while True:
            item, error = q.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()  # the consumer stopped early: let the producer thread exit
