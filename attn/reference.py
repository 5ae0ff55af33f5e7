"""Plain-numpy attention with an explicit loop over queries and keys: the test oracle.

Written as the textbook defines attention, one output b_i at a time, and independently of
``attn.scores`` and ``attn.masks`` (real concatenations, one (q_i, k_j) pair at a time) so that
it can catch mistakes in the vectorised forms. Scores and masks that depend on positions are
given as plain per-pair Python functions of (q_i, k_j, i, j) and (i, j). Float64 throughout.
Slow; for tests only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PairMask", "PairScore", "attention"]

PairScore = Callable[[np.ndarray, np.ndarray, int, int], float]  # (q_i [d], k_j [d], i, j)
PairMask = Callable[[int, int], bool]  # (i, j) -> may query i attend to key j


def _pair_score(name: str, p: Any, q: np.ndarray, k: np.ndarray) -> float:
    """Score one query vector q [d] against one key vector k [d]."""
    if name == "dot":
        return float(q @ k)
    if name == "scaled_dot":
        return float(q @ k) / math.sqrt(q.shape[0])
    if name == "general":
        return float(q @ p["w_DxD"] @ k)
    if name == "additive":
        w_2DxA = np.concatenate([p["wq_DxH"], p["wk_DxH"]], axis=0)
        return float(p["v_H"] @ np.tanh(np.concatenate([q, k]) @ w_2DxA + p["b_H"]))
    if name == "mlp":
        w_3DxA = np.concatenate([p["wq_DxH"], p["wk_DxH"], p["wp_DxH"]], axis=0)
        h = np.tanh(np.concatenate([q, k, q * k]) @ w_3DxA + p["b1_H"])
        return float(p["w2_H"] @ h)
    raise ValueError(f"score must be one of dot, scaled_dot, general, additive, mlp; got {name!r}")


def attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    *,
    score: str | PairScore = "scaled_dot",
    score_params: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """out [Lq, dv], weights [Lq, Lk] for q [Lq, d], k [Lk, d], v [Lk, dv].

    mask: None, bool [Lk] or [Lq, Lk], or a PairMask. score: a built-in name, or a PairScore.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    p = None
    if score_params is not None:
        p = {name: np.asarray(x, np.float64) for name, x in score_params.items()}
    lq, lk = q.shape[0], k.shape[0]
    if mask is None:
        allowed = np.ones((lq, lk), bool)
    elif callable(mask):
        allowed = np.array([[bool(mask(i, j)) for j in range(lk)] for i in range(lq)], bool)
        allowed = allowed.reshape(lq, lk)
    else:
        allowed = np.broadcast_to(np.asarray(mask), (lq, lk))
    out = np.zeros((lq, v.shape[1]))
    weights = np.zeros((lq, lk))
    for i in range(lq):
        keys = [j for j in range(lk) if allowed[i, j]]
        if not keys:  # attends nowhere: weights and output stay 0
            continue
        if callable(score):
            s = np.array([float(score(q[i], k[j], i, j)) for j in keys])
        else:
            s = np.array([_pair_score(score, p, q[i], k[j]) for j in keys])
        e = np.exp(s - s.max())
        weights[i, keys] = e / e.sum()
        for j in keys:
            out[i] += weights[i, j] * v[j]
    return out, weights
