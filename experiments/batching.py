"""Token id sequences -> fixed-shape numpy batches, padded to length buckets; a prefetch thread.

A batch: {"tokens": int32 [B, L], "mask": bool [B, L] (tokens != PAD), "label": int32 [B],
"weight": float32 [B] (1 real, 0 filler), "index": int32 [B] (example index, -1 for filler)}.
B is always the batch size (a short last batch is filled with weight-0 rows, so shapes stay few and
evaluation counts every example exactly once); L is the smallest bucket >= the longest sequence in
the batch, so jit compiles one program per bucket.

Training order for (seed, epoch): shuffle with default_rng([seed, epoch]), sort by length within
chunks of ~50 batches (similar lengths share a batch: less padding), cut into batches, shuffle the
batch order. Only lengths are touched before a batch is produced, so `start_step` skips cheaply.
"""

import queue
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from experiments.tokenizers import CLS, PAD

Batch = dict[str, np.ndarray]
SORT_CHUNK_BATCHES = 50


def encode_all(tokenizer, texts: Sequence[str], *, max_len: int, add_cls: bool) -> list[np.ndarray]:
    """Token ids per text, int32 [n <= max_len], keeping the first tokens; CLS (if any) counts."""
    if max_len < 1 + add_cls:
        raise ValueError(f"max_len must be >= {1 + add_cls}, got {max_len}")
    keep = max_len - add_cls
    prefix = np.array([CLS] * add_cls, np.int32)
    return [np.concatenate([prefix, tokenizer.encode(t)[:keep]]) for t in texts]


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return -(-num_examples // batch_size)


def bucket_sizes(buckets: Sequence[int], max_len: int) -> tuple[int, ...]:
    """Sorted buckets capped at max_len, max_len always included."""
    if any(int(b) < 1 for b in buckets):
        raise ValueError(f"buckets must be positive, got {tuple(buckets)}")
    return tuple(sorted({int(b) for b in buckets if b < max_len} | {max_len}))


def train_batches(
    encoded: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    batch_size: int,
    buckets: Sequence[int],
    max_len: int,
    seed: int,
    epoch: int,
    start_step: int = 0,
) -> Iterator[Batch]:
    """One epoch of shuffled, length-bucketed batches; order is a pure function of (seed, epoch).

    start_step=N yields exactly the batches N, N+1, ... of the uninterrupted epoch (for resuming).
    """
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    labels = np.asarray(labels, np.int32)
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(encoded))
    lengths = np.array([len(s) for s in encoded], np.int64)
    chunk = SORT_CHUNK_BATCHES * batch_size
    order = np.concatenate(
        [
            c[np.argsort(lengths[c], kind="stable")]
            for c in np.split(perm, range(chunk, len(perm), chunk))
        ]
    )
    groups = np.split(order, range(batch_size, len(order), batch_size)) if len(order) else []
    sizes = bucket_sizes(buckets, max_len)
    for b in rng.permutation(len(groups))[start_step:]:
        yield _make_batch(encoded, labels, groups[b], batch_size, sizes)


def eval_batches(
    encoded: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    batch_size: int,
    buckets: Sequence[int],
    max_len: int,
) -> Iterator[Batch]:
    """Every example exactly once (filler rows have weight 0), sorted by length to pad little."""
    labels = np.asarray(labels, np.int32)
    lengths = np.array([len(s) for s in encoded], np.int64)
    order = np.argsort(lengths, kind="stable")
    sizes = bucket_sizes(buckets, max_len)
    for start in range(0, len(order), batch_size):
        yield _make_batch(encoded, labels, order[start : start + batch_size], batch_size, sizes)


def _make_batch(
    encoded: Sequence[np.ndarray],
    labels: np.ndarray,
    idx: np.ndarray,
    batch_size: int,
    sizes: tuple[int, ...],
) -> Batch:
    longest = max((len(encoded[i]) for i in idx), default=0)
    L = next((s for s in sizes if s >= longest), sizes[-1])  # longer than max_len: truncated
    tokens = np.full((batch_size, L), PAD, np.int32)
    for row, i in enumerate(idx):
        seq = encoded[i][:L]
        tokens[row, : len(seq)] = seq
    n = len(idx)
    index = np.full(batch_size, -1, np.int32)
    index[:n] = idx
    label = np.zeros(batch_size, np.int32)
    label[:n] = labels[idx]
    weight = np.zeros(batch_size, np.float32)
    weight[:n] = 1.0
    return {
        "tokens": tokens,
        "mask": tokens != PAD,
        "label": label,
        "weight": weight,
        "index": index,
    }


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
