"""Plain-numpy attention with an explicit loop over queries and keys: the test oracle.

Written as the textbook defines attention, one output b_i at a time, and independently of
``attn.scores`` and ``attn.masks`` (real concatenations, one (q_i, k_j) pair at a time) so that
it can catch mistakes in the vectorised forms. Scores and masks that depend on positions are
given as plain per-pair Python functions of (q_i, k_j, i, j) and (i, j). Float64 throughout.
Slow; for tests only.

`bert` is the same kind of oracle for `attn.bert`: a BERT forward pass written from the BERT
paper and a Hugging Face checkpoint's own tensor names, one sentence and one head at a time,
sharing nothing with `attn.bert` (not its key mapping, not its attention).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PairMask", "PairScore", "attention", "bert"]

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


def bert(tensors: Any, config: Any, ids: Any, mask: Any, types: Any = None) -> np.ndarray:
    """Last hidden states [B, L, D] (float64) of a BERT checkpoint (post-LayerNorm blocks, exact
    GELU, absolute positions).

    tensors: {name: array} under a BertModel's own names (no "bert." prefix; linear weights
    [out, in], as PyTorch stores them); config: config.json as a dict; ids, mask (1 = real
    token), types: [B, L] (types default 0). Positions are 0..L-1; padding keys are left out of
    every softmax.
    """
    t = {name: np.asarray(x, np.float64) for name, x in tensors.items()}
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    types = np.zeros_like(ids) if types is None else np.asarray(types)
    eps = float(config.get("layer_norm_eps", 1e-12))
    heads = int(config["num_attention_heads"])
    d = t["embeddings.word_embeddings.weight"].shape[1]
    dh = d // heads

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * t[f"{name}.weight"] + t[f"{name}.bias"]

    erf = np.vectorize(math.erf)

    def gelu(x: np.ndarray) -> np.ndarray:  # exact: x * Phi(x)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))

    batch, length = ids.shape
    out = np.zeros((batch, length, d))
    for b in range(batch):
        real = mask[b]
        x = (
            t["embeddings.word_embeddings.weight"][ids[b]]
            + t["embeddings.position_embeddings.weight"][:length]
            + t["embeddings.token_type_embeddings.weight"][types[b]]
        )
        x = norm(x, "embeddings.LayerNorm")
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}"
            q = linear(x, f"{p}.attention.self.query")
            k = linear(x, f"{p}.attention.self.key")[real]
            v = linear(x, f"{p}.attention.self.value")[real]
            per_head = []
            for h in range(heads):
                cols = slice(h * dh, (h + 1) * dh)
                s = q[:, cols] @ k[:, cols].T / math.sqrt(dh)
                w = np.exp(s - s.max(-1, keepdims=True))
                per_head.append((w / w.sum(-1, keepdims=True)) @ v[:, cols])
            a = linear(np.concatenate(per_head, axis=-1), f"{p}.attention.output.dense")
            x = norm(x + a, f"{p}.attention.output.LayerNorm")
            f = linear(gelu(linear(x, f"{p}.intermediate.dense")), f"{p}.output.dense")
            x = norm(x + f, f"{p}.output.LayerNorm")
        out[b] = x
    return out
