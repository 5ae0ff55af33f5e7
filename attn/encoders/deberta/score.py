"""DeBERTa's disentangled attention as an attn score (He et al. 2021, "DeBERTa: decoding-enhanced
BERT with disentangled attention"): for query i and key j of one head,

    s_ij = (q_i · k_j  +  q_i · Pk[c(δ_ij)]  +  k_j · Pq[c(δ_ij)]) / √(K · (1 + #terms))
            content       content-to-position    position-to-content

with δ_ij = i - j, log-bucketed when the model has position buckets (`log_bucket`), and c(δ) =
clip(δ + S, 0, 2S - 1) its row in the per-head position tables Pk, Pq [2S, K] (the layer's key
and query projections of the relative position embeddings; the model computes them and passes
them as this score's params). A model may have either position term or both (pos_att_type c2p,
p2c); #terms counts them.

It is a positional score (`attn.scores`): it depends on (q_i, k_j, i, j) and its params only, so
`attn.attention`'s "matrix" form and its "chunked" form (one block of queries and keys at a time)
both compute it. A block of I queries and J keys projects its queries and keys on the tables,
[I, 2S] and [J, 2S], and gathers the [I, J] scores from them: memory stays linear in L, and no
[L, L, K] tensor is ever formed. "xla" cannot add the position terms.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import scores

__all__ = ["TERMS", "Disentangled", "log_bucket", "score"]

TERMS = ("c2p", "p2c")  # the position terms a model may have (config.json's pos_att_type)
_TABLES = {"c2p": "pos_key_rxK", "p2c": "pos_query_rxK"}  # score params: r = 2S table rows


def log_bucket(rel: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
    """DeBERTa's log buckets of relative positions (integers, any shape) -> int32: |δ| up to
    buckets // 2 as they are, farther ones on a log scale that reaches buckets - 1 at
    max_position - 1, signed (odd: bucket(-δ) = -bucket(δ)). In float64, the exact values:
    transformers' float32 agrees with them for every |δ| up to 20,000 at buckets 256 and
    max_position 512 (DeBERTa-v3's), where XLA's float32 log puts |δ| = 17,852 one bucket off."""
    rel = np.asarray(rel, np.int64)
    mid = buckets // 2
    far = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    with np.errstate(divide="ignore", invalid="ignore"):  # near ones (far <= mid) are not used
        log_pos = np.ceil(np.log(far / mid) / np.log((max_position - 1) / mid) * (mid - 1)) + mid
    return np.where(far <= mid, rel, np.sign(rel) * log_pos).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class Disentangled:
    """The score's static settings (a frozen dataclass: hashed and compared by value, so the
    `Score` built on it is a jit-static argument).

    span: S, the relative positions the tables hold, [-S, S) (2S rows); buckets: position
    buckets (<= 0: δ = i - j unbucketed, clipped to the span); max_position: where the log
    buckets end; max_distance: the model's longest input, so positions are less than it apart
    (a farther pair is read as that far); terms: the position terms, a subset of TERMS; scaled:
    divide by √(K·(1+#terms)) (False: the unscaled form the step-by-step figures draw).
    """

    span: int
    buckets: int
    max_position: int
    max_distance: int
    terms: tuple[str, ...]
    scaled: bool = True

    def rows(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """The table row c(δ_ij) of each (query, key) pair [L, M], int32 in [0, 2S)."""
        n = self.max_distance
        rel_LxM = q_pos[:, None].astype(jnp.int32) - k_pos[None, :].astype(jnp.int32)
        rel_LxM = jnp.clip(rel_LxM, 1 - n, n - 1)
        if self.buckets > 0:  # every bucket the model's inputs can reach, a constant
            table_X = log_bucket(np.arange(1 - n, n), self.buckets, self.max_position)
            rel_LxM = jnp.asarray(table_X)[rel_LxM + n - 1]
        return jnp.clip(rel_LxM + self.span, 0, 2 * self.span - 1)

    def __call__(
        self,
        params: dict[str, jax.Array],
        q_LxK: jax.Array,
        k_MxK: jax.Array,
        *,
        q_pos: jax.Array,
        k_pos: jax.Array,
    ) -> jax.Array:
        """s [L, M] in at least float32 (module docstring)."""
        f = jnp.result_type(q_LxK, k_MxK, jnp.float32)
        s_LxM = jnp.einsum("lk,mk->lm", q_LxK, k_MxK, preferred_element_type=f)
        rows_LxM = self.rows(q_pos, k_pos)
        # Each table is the dot's left operand: XLA:CPU in jax 0.7 (Colab's) cannot run a bfloat16
        # dot into float32 whose left operand carries a batch axis the right one lacks (vmap's
        # batch of sequences over the model's shared tables).
        if "c2p" in self.terms:
            pk_rxK = params["pos_key_rxK"]
            c2p_rxL = jnp.einsum("rk,lk->rl", pk_rxK, q_LxK, preferred_element_type=f)
            s_LxM = s_LxM + jnp.take_along_axis(c2p_rxL, rows_LxM.T, axis=0).T
        if "p2c" in self.terms:
            # k_j · Pq[c(δ_ij)]: transformers gathers row c(-δ_ji), the same row because the
            # buckets are odd (δ_ji = -δ_ij).
            pq_rxK = params["pos_query_rxK"]
            p2c_rxM = jnp.einsum("rk,mk->rm", pq_rxK, k_MxK, preferred_element_type=f)
            s_LxM = s_LxM + jnp.take_along_axis(p2c_rxM, rows_LxM, axis=0)
        if self.scaled:
            s_LxM = s_LxM / math.sqrt(q_LxK.shape[-1] * (1 + len(self.terms)))
        return s_LxM

    def init(
        self, key: jax.Array, d: int, *, hidden: int | None = None, dtype: Any = jnp.float32
    ) -> dict[str, jax.Array]:
        """Random tables [2S, d] ~ N(0, 1), one per position term, for using the score alone; a
        DeBERTa model passes its layer's projections of its position embeddings instead."""
        del hidden
        keys = jax.random.split(key, len(TERMS))
        return {
            _TABLES[t]: jax.random.normal(k, (2 * self.span, d), dtype)
            for t, k in zip(TERMS, keys, strict=True)
            if t in self.terms
        }


def score(
    span: int,
    buckets: int,
    max_position: int,
    max_distance: int,
    terms: tuple[str, ...],
    d_head: int,
) -> scores.Score:
    """The disentangled `Score` ("disentangled"), which says its unscaled form (content + the
    position terms) and its divisor √(d_head·(1+#terms)) for the step-by-step figures."""
    unknown = [t for t in terms if t not in TERMS]
    if unknown:
        raise ValueError(f"position terms must be among {TERMS}; got {unknown[0]!r}")
    terms = tuple(t for t in TERMS if t in terms)
    fn = Disentangled(span, buckets, max_position, max_distance, terms)
    raw = dataclasses.replace(fn, scaled=False)
    unscaled = scores.Score(" + ".join(("content", *terms)), raw, raw.init, True, True)
    divisor = f"√({d_head}·{1 + len(terms)})"
    return scores.Score("disentangled", fn, fn.init, True, True, unscaled, divisor)
