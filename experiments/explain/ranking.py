"""One text's attention checked by erasure, for `visualize` and `predict --explain`: its top tokens
by attention and by leave-one-out side by side, and the predicted class's probability once the
top tokens of each are erased (`attn.importance`; `experiments.faithfulness` does it for a split).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attn import importance, models
from experiments import serving
from experiments.data import batching
from experiments.data.tokenizers import PAD

REMOVED = 3  # how many top tokens the erasure test removes
# Leave-one-out erasures per forward pass: a 512-token text's [H, L, L] weights stay at 256 MiB.
CHUNK = 64
HEADER = (
    "\ttop tokens by leave-one-out (probability drop)"
    f"\tprobability without the {REMOVED} most-attended tokens"
    f"\tprobability without the {REMOVED} top leave-one-out tokens"
)


def bag_source(trained: serving.Trained, text: str) -> np.ndarray | None:
    """int32 [m]: the attention position of each token the bag reads of `text`, -1 for those only
    the bag reads; None when the bag reads what attention reads (`encoding.Cut.source_G`)."""
    return serving.cut(trained, trained.tokenizer.encode(serving.text_read(trained, text))).source_G


@functools.partial(jax.jit, static_argnames=("cfg",))
def _scores(params, tokens_1xL, bag, *, cfg: models.AnyConfig):
    c_1, p_1 = importance.predicted(params, tokens_1xL, cfg, bag)
    attention = (
        importance.attention(params, tokens_1xL, cfg) if importance.has_attention(cfg) else None
    )
    loo = importance.leave_one_out(params, tokens_1xL, cfg, bag, chunk=CHUNK)
    return c_1, p_1, attention, loo


@functools.partial(jax.jit, static_argnames=("cfg",))
def _probability_without(params, tokens_1xL, top_BxL, bag, c_1, *, cfg: models.AnyConfig):
    """[B]: the probability of class c_1 with each row's top tokens erased."""
    n = top_BxL.shape[0]
    tokens_BxL = jnp.repeat(tokens_1xL, n, axis=0)
    bag_n = None if bag is None else importance.Bag(*(jnp.repeat(a, n, axis=0) for a in bag))
    erased, erased_bag = importance.erase(tokens_BxL, ~top_BxL, bag_n, keep_outside=True)
    return importance.probabilities(params, erased, cfg, erased_bag)[:, c_1[0]]


def explain(trained: serving.Trained, text: str, top: int = 5) -> dict:
    """`explain_read` of `text`, read here."""
    return explain_read(trained, serving.read(trained, text), top)


def explain_read(trained: serving.Trained, r: serving.Read, top: int = 5) -> dict:
    """{"attention": [[token, weight], ...] (None for a model without attention),
    "leave_one_out": [[token, probability drop], ...], each its `top` tokens; "removed": the
    number of tokens erased (REMOVED, or all of a shorter text's); "probability": the predicted
    class's; "without_attended" (None without attention) and "without_leave_one_out": the
    probability with that many top tokens erased}, of one text read."""
    data = trained.config.data
    tokens = r.tokens_L
    # Padded to the batches' lengths, which changes no score: one compile per bucket, not per text.
    tokens_1xL = _padded(r.ids_L, batching.bucket_sizes(data.buckets, data.max_len), PAD)
    bag = None
    if r.bag_G is not None:
        sizes = batching.bag_sizes(data.buckets, data.max_len, data.bag_len)
        bag = importance.Bag(_padded(r.bag_G, sizes, PAD), _padded(r.source_G, sizes, -1))
    c_1, p_1, attention, loo = _scores(trained.params, tokens_1xL, bag, cfg=trained.cfg)
    candidates_1xL = ~jnp.isin(tokens_1xL, serving.framing_ids(trained))
    removed = min(REMOVED, int(candidates_1xL.sum()))
    rankings = (
        {"leave_one_out": loo}
        if attention is None
        else {"attention": attention, "leave_one_out": loo}
    )
    tops = {
        m: importance.top_k(s, candidates_1xL, jnp.array([removed]))[0] for m, s in rankings.items()
    }
    without = _probability_without(
        trained.params, tokens_1xL, jnp.stack(list(tops.values())), bag, c_1, cfg=trained.cfg
    )
    cand = np.flatnonzero(np.asarray(candidates_1xL[0]))

    def listed(s_1xL) -> list:
        s = np.asarray(s_1xL[0])
        order = cand[np.argsort(-s[cand], kind="stable")][:top]
        return [[tokens[i], float(s[i])] for i in order]

    probs = dict(zip(tops, np.asarray(without).tolist(), strict=True))
    return {
        "attention": None if attention is None else listed(attention),
        "leave_one_out": listed(loo),
        "removed": removed,
        "probability": float(p_1[0]),
        "without_attended": probs.get("attention"),
        "without_leave_one_out": probs["leave_one_out"],
    }


def _padded(x_G: np.ndarray, sizes: tuple[int, ...], fill: int) -> jax.Array:
    """int32 [1, X]: `batching.pad_one`'s, as the batch of one the scores take."""
    return jnp.asarray(batching.pad_one(x_G, sizes, fill)[None])


def columns(p: dict) -> str:
    """predict's extra tab-separated columns under HEADER; dashes for a text not classified."""
    e = p.get("explain")
    if e is None:
        return "\t-\t-\t-"
    loo = " ".join(f"{t}({d:+.2g})" for t, d in e["leave_one_out"])
    attended = "-" if e["without_attended"] is None else f"{e['without_attended']:.3f}"
    return f"\t{loo}\t{attended}\t{e['without_leave_one_out']:.3f}"
