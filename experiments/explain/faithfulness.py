"""Is the attention map an explanation? Erasure tests of five token rankings on a split, and their
summary, plot and table (the `faithfulness` command's work).

Every text of the split (N drawn at random with --limit) is explained five ways
(`attn.importance`): attention (what `visualize` shades and `predict` lists), attention rollout,
gradient × input, leave-one-out and random, the control. For each ranking: comprehensiveness,
the drop of the predicted class's probability when its top k% of the text's tokens are erased
(PAD, so the n-grams and the bag lose them too), and sufficiency, the drop when only they are
kept (DeYoung et al. 2020), at k = 1, 2, 5, 10, 20% (at least one token); AOPC, their mean over
k; and the Spearman and Kendall correlation of its token scores with leave-one-out's in each
text. Each is a mean over texts with a 95% bootstrap interval (1,000 resamples of the texts),
and AOPC differences between methods are bootstrapped in pairs. For a model with a bag of
n-grams, also how often each half of its logits (encoder, bag) alone gives the prediction.

Writes DIR/faithfulness.json and DIR/faithfulness.png (probability drop against k, one line per
method) and prints the table as markdown rows: the faithfulness table of benchmarks/REPORT.md.
Leave-one-out runs the model once per token, so the cost grows with the square of the length:
a few minutes for the embedded data's 1,726 test reviews (median 45 tokens) on 2 CPU cores,
but about 2 CPU seconds per 512-token text, hours for all of IMDB's test reviews: take a
--limit there.
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from attn import importance, models  # noqa: E402
from experiments import serving, workdirs  # noqa: E402
from experiments.data import batching, datasets  # noqa: E402
from experiments.data.tokenizers import PAD  # noqa: E402
from experiments.errors import UserError  # noqa: E402

FILE, PLOT = "faithfulness.json", "faithfulness.png"
PERCENTS = (1, 2, 5, 10, 20)
METHODS = ("attention", "rollout", "gradient", "leave_one_out", "random")
RESAMPLES, SEED = 1000, 0
# Tokens per forward pass. Small batches stay in cache: on the default model, 16,384 tokens per
# pass took 1.3x the CPU time of 4,096 (user + system, 80 texts), 65,536 1.5x.
TOKENS = 1 << 12


def available(cfg) -> dict[str, str]:
    """{method: why not} for the methods this model does not have."""
    missing = {}
    if not importance.has_attention(cfg):
        missing["attention"] = "the model has no attention layer (num_layers=0)"
    if models.layout(cfg).num_layers == 0:
        missing["rollout"] = "rollout needs an encoder layer (num_layers=0)"
    return missing


def sample(n: int, limit: int | None) -> np.ndarray:
    """Indices of the texts to explain, in split order: all, or `limit` of them drawn at random
    (the same ones every run). Not the first ones: a split may be ordered by label."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(SEED).choice(n, limit, replace=False))


def faithfulness(workdir: str, split: str = "test", limit: int | None = None) -> dict:
    """Runs the erasure tests on `split` of the workdir's best checkpoint; writes DIR/FILE and
    DIR/PLOT; returns what FILE holds."""
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    start = time.perf_counter()
    trained = serving.load(workdir)
    cfg, data = trained.cfg, trained.config.data
    texts, labels, label_names = datasets.load_splits(data, (split,))[split]
    if label_names != trained.label_names:
        raise UserError(
            f"labels of the {split} data {list(label_names)} differ from the checkpoint's "
            f"{list(trained.label_names)}"
        )
    chosen = sample(len(texts), limit)
    # Only the chosen texts are tokenized, each once, for its ids, its bag's and how they line up.
    cuts = [serving.cut(trained, trained.tokenizer.encode(texts[i])) for i in chosen]
    ids = [c.ids_L for c in cuts]
    bags = [c.bag_G for c in cuts] if data.bag_len else None
    sources = [c.source_G for c in cuts] if data.bag_len else None
    missing = available(cfg)
    methods = tuple(m for m in METHODS if m not in missing)
    framing = serving.framing_ids(trained)
    per_text = explain_all(trained.params, cfg, data, ids, bags, sources, methods, framing)
    result = summarise(per_text, methods, labels=np.asarray(labels)[chosen])
    result.update(
        workdir=workdir,
        split=split,
        limit=limit,
        checkpoint=trained.source,
        step=trained.step,
        unavailable=missing,
        seconds=time.perf_counter() - start,
    )
    plot(result, os.path.join(workdir, PLOT))
    workdirs.write_json(os.path.join(workdir, FILE), result)
    return result


@functools.partial(jax.jit, static_argnames=("cfg", "methods", "chunk"))
def _explain(params, tokens_BxL, candidates_BxL, bag, text_B, *, cfg, methods, chunk):
    """Predicted class and probability [B], each method's scores [B, L] and erasure drops
    (comprehensiveness, sufficiency) [B, Y], and with a bag the margin [B] by which each half of
    the logits alone favours the predicted class. text_B numbers the texts: each gets its own
    random ranking, whatever batch it falls in."""
    c_B, p_B = importance.predicted(params, tokens_BxL, cfg, bag)
    score = {
        "attention": lambda: importance.attention(params, tokens_BxL, cfg),
        "rollout": lambda: importance.rollout(params, tokens_BxL, cfg),
        "gradient": lambda: importance.gradient(params, tokens_BxL, cfg, bag),
        "leave_one_out": lambda: importance.leave_one_out(
            params, tokens_BxL, cfg, bag, chunk=chunk
        ),
        "random": lambda: jax.vmap(_random)(text_B, tokens_BxL),
    }
    scores = {m: score[m]() for m in methods}
    # Every method's erasures in one batch: one forward pass in the program, not one per method.
    tiled = len(methods)

    def tile(a_BxX: jax.Array) -> jax.Array:
        return jnp.tile(a_BxX, (tiled, 1))

    comp_XxY, suff_XxY = importance.erasure_drops(  # X = len(methods) * B
        params,
        tile(tokens_BxL),
        jnp.concatenate([scores[m] for m in methods]),
        tile(candidates_BxL),
        cfg,
        percents=PERCENTS,
        bag=None if bag is None else importance.Bag(*map(tile, bag)),
    )
    batch = tokens_BxL.shape[0]
    drops = {
        m: (comp_XxY[i * batch : (i + 1) * batch], suff_XxY[i * batch : (i + 1) * batch])
        for i, m in enumerate(methods)
    }
    margins = None
    if cfg.bag_buckets:
        margins = [_margin(h, c_B) for h in importance.logit_halves(params, tokens_BxL, cfg, bag)]
    return c_B, p_B, scores, drops, margins


def _margin(logits_BxC: jax.Array, c_B: jax.Array) -> jax.Array:
    """Class c's logit less the largest other one: > 0 where these logits alone predict c."""
    is_c_BxC = jnp.arange(logits_BxC.shape[1]) == c_B[:, None]
    own_B = jnp.where(is_c_BxC, logits_BxC, -jnp.inf).max(1)
    return own_B - jnp.where(is_c_BxC, -jnp.inf, logits_BxC).max(1)


def _random(text: jax.Array, tokens_L: jax.Array) -> jax.Array:
    return importance.random(jax.random.fold_in(jax.random.key(SEED), text), tokens_L[None])[0]


def explain_all(params, cfg, data, ids, bags, sources, methods, framing) -> list[dict]:
    """Per text: predicted class and probability, number of tokens (not counting `framing`'s ids:
    PAD and what frames a text), each method's scores over them and its erasure drops [2, K].
    Texts are batched by length bucket, B rows per batch sized so that each forward pass reads
    about TOKENS tokens; a short last batch is filled with empty rows (whose results are
    dropped)."""
    sizes = batching.bucket_sizes(data.buckets, data.max_len)
    bag_sizes = batching.bag_sizes(data.buckets, data.max_len, data.bag_len) if bags else None
    order = np.argsort([len(x) for x in ids], kind="stable")
    groups: dict[int, list[int]] = {}
    for i in order:
        groups.setdefault(next(s for s in sizes if s >= len(ids[i])), []).append(int(i))
    out: list[dict | None] = [None] * len(ids)
    with tqdm(total=len(ids), desc="faithfulness", unit="text", mininterval=1) as bar:
        for length, members in groups.items():
            rows = max(1, TOKENS // (2 * len(PERCENTS) * len(methods) * length))
            chunk = max(1, min(length, TOKENS // (rows * length)))
            for first in range(0, len(members), rows):
                idx = members[first : first + rows]
                tokens = _padded([ids[i] for i in idx], rows, length)
                candidates = ~np.isin(tokens, framing)
                bag = None
                if bags is not None:
                    m = next(s for s in bag_sizes if s >= max(len(bags[i]) for i in idx))
                    bag = importance.Bag(
                        jnp.asarray(_padded([bags[i] for i in idx], rows, m)),
                        jnp.asarray(_padded([sources[i] for i in idx], rows, m, fill=-1)),
                    )
                c_B, p_B, scores, drops, margins = jax.device_get(
                    _explain(
                        params,
                        jnp.asarray(tokens),
                        jnp.asarray(candidates),
                        bag,
                        jnp.asarray(np.resize(np.asarray(idx, np.int32), rows)),
                        cfg=cfg,
                        methods=methods,
                        chunk=chunk,
                    )
                )
                for row, i in enumerate(idx):
                    cand = candidates[row]
                    out[i] = {
                        "predicted": int(c_B[row]),
                        "probability": float(p_B[row]),
                        "num_tokens": int(cand.sum()),
                        "scores": {m: scores[m][row][cand] for m in methods},
                        "drops": {m: np.stack([d[row] for d in drops[m]]) for m in methods},
                        "margins": None if margins is None else [float(h[row]) for h in margins],
                    }
                bar.update(len(idx))
    return out


def _padded(rows_: list[np.ndarray], rows: int, length: int, fill: int = PAD) -> np.ndarray:
    out = np.full((rows, length), fill, np.int32)
    for r, x in enumerate(rows_):
        out[r, : len(x)] = x[:length]
    return out


def summarise(per_text: list[dict], methods: tuple[str, ...], labels: np.ndarray) -> dict:
    """Means with bootstrap intervals over the texts that have a token (see the module doc)."""
    kept = [i for i, t in enumerate(per_text) if t["num_tokens"] > 0]
    if not kept:
        raise UserError("no text has a token to rank: every one is empty once tokenized")
    texts = [per_text[i] for i in kept]
    rng = np.random.default_rng(SEED)
    resample = rng.integers(0, len(texts), (RESAMPLES, len(texts)))
    result = {
        "num_texts": len(texts),
        "num_without_tokens": len(per_text) - len(texts),
        "percents": list(PERCENTS),
        "accuracy": float(np.mean([per_text[i]["predicted"] == labels[i] for i in kept])),
        "mean_probability": float(np.mean([t["probability"] for t in texts])),
        "median_tokens": float(np.median([t["num_tokens"] for t in texts])),
        "bootstrap": {"resamples": RESAMPLES, "level": 0.95, "seed": SEED},
        "logit_halves": _halves(texts),
        "methods": {},
    }
    aopc = {}
    for m in methods:
        d_Nx2xY = np.stack([t["drops"][m] for t in texts])  # 2: comprehensiveness, sufficiency
        aopc[m] = d_Nx2xY.mean(-1)
        out = {
            "comprehensiveness": [
                _interval(d_Nx2xY[:, 0, k], resample) for k in range(len(PERCENTS))
            ],
            "sufficiency": [_interval(d_Nx2xY[:, 1, k], resample) for k in range(len(PERCENTS))],
            "aopc_comprehensiveness": _interval(aopc[m][:, 0], resample),
            "aopc_sufficiency": _interval(aopc[m][:, 1], resample),
        }
        if m != "leave_one_out" and "leave_one_out" in methods:
            pairs = [(t["scores"][m], t["scores"]["leave_one_out"]) for t in texts]
            for name, fn in (("spearman", spearman), ("kendall", kendall)):
                r = np.array([fn(a, b) for a, b in pairs])
                out[f"{name}_with_leave_one_out"] = _interval_valid(r, rng)
        result["methods"][m] = out
    result["aopc_comprehensiveness_differences"] = {
        f"{a} - {b}": _interval(aopc[a][:, 0] - aopc[b][:, 0], resample)
        for a in methods
        for b in ("random", "leave_one_out")
        if b in methods and a != b
    }
    return result


def _halves(texts: list[dict]) -> dict | None:
    """With a bag: for the encoder half and the bag half of the logits, the share of texts whose
    prediction it gives alone and its median margin for the predicted class."""
    if texts[0]["margins"] is None:
        return None
    m_Nx2 = np.array([t["margins"] for t in texts])
    return {
        half: {
            "agrees": float((m_Nx2[:, i] > 0).mean()),
            "median_margin": float(np.median(m_Nx2[:, i])),
        }
        for i, half in enumerate(("encoder", "bag"))
    }


def _interval(v_N: np.ndarray, resample_UxN: np.ndarray) -> dict:
    means_U = v_N[resample_UxN].mean(1)
    low, high = np.percentile(means_U, [2.5, 97.5])
    return {"mean": float(v_N.mean()), "low": float(low), "high": float(high)}


def _interval_valid(v_N: np.ndarray, rng: np.random.Generator) -> dict:
    """_interval over the finite values, and how many there are (a correlation needs two tokens
    and scores that are not all equal)."""
    v = v_N[np.isfinite(v_N)]
    if not len(v):
        return {"mean": None, "low": None, "high": None, "num_texts": 0}
    return {**_interval(v, rng.integers(0, len(v), (RESAMPLES, len(v)))), "num_texts": len(v)}


def _ranks(x_N: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    _, inverse, counts = np.unique(x_N, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[inverse]


def spearman(a_N: np.ndarray, b_N: np.ndarray) -> float:
    """Spearman's rho (Pearson's r of the ranks); nan when either side is constant."""
    ra, rb = _ranks(a_N) - (len(a_N) + 1) / 2, _ranks(b_N) - (len(b_N) + 1) / 2
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def kendall(a_N: np.ndarray, b_N: np.ndarray) -> float:
    """Kendall's tau-b (ties corrected); nan when either side is constant."""
    upper = np.triu(np.ones((len(a_N), len(a_N)), bool), 1)
    sa = np.sign(a_N[:, None] - a_N[None, :])[upper]
    sb = np.sign(b_N[:, None] - b_N[None, :])[upper]
    den = np.sqrt(np.count_nonzero(sa) * np.count_nonzero(sb))
    return float((sa * sb).sum() / den) if den > 0 else float("nan")


LABELS = {
    "attention": "attention",
    "rollout": "attention rollout",
    "gradient": "gradient × input",
    "leave_one_out": "leave-one-out",
    "random": "random",
}
# Attention is drawn large and rollout small and dotted: with one layer and mean pooling they rank
# alike, and one line would hide the other.
_STYLE = {
    "attention": {"marker": "o", "markersize": 9},
    "rollout": {"marker": "s", "markersize": 4, "linestyle": ":"},
    "gradient": {"marker": "^"},
    "leave_one_out": {"marker": "D"},
    "random": {"marker": "x", "linestyle": "--"},
}


def plot(result: dict, path: str) -> str:
    """Comprehensiveness and sufficiency against k, one line per method with its bootstrap band;
    written whole or not at all."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, which, better in (
        (axes[0], "comprehensiveness", "higher: the ranking found what the prediction rests on"),
        (axes[1], "sufficiency", "lower: its top tokens alone keep the prediction"),
    ):
        for m, r in result["methods"].items():
            pts = r[which]
            line = ax.plot(
                result["percents"], [p["mean"] for p in pts], label=LABELS[m], **_STYLE[m]
            )
            ax.fill_between(
                result["percents"],
                [p["low"] for p in pts],
                [p["high"] for p in pts],
                color=line[0].get_color(),
                alpha=0.15,
            )
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks(result["percents"], [f"{p}%" for p in result["percents"]])
        ax.minorticks_off()
        ax.set_xlabel("k: share of the text's tokens (top by each method)")
        ax.set_title(f"{which} ({better})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("drop of the predicted class's probability")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{os.path.basename(os.path.abspath(result['workdir']))}, {result['split']} split: "
        f"{result['num_texts']:,} texts, erased tokens become PAD (95% bootstrap bands)"
    )
    fig.tight_layout()
    tmp = path + ".tmp"
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def ci(x: dict, fmt: str = ".3f") -> str:
    if x["mean"] is None:
        return "n/a"
    return f"{x['mean']:{fmt}} ({x['low']:{fmt}} to {x['high']:{fmt}})"


def table(result: dict, name: str) -> str:
    """The result as markdown rows under a header: one row per method."""
    ks = " / ".join(f"{p}%" for p in result["percents"])
    lines = [
        f"| run | texts | method | comprehensiveness at {ks} | AOPC comprehensiveness (95% CI) "
        "| AOPC sufficiency (95% CI) | Spearman with leave-one-out | Kendall with leave-one-out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in result["methods"].items():
        comp = " / ".join(f"{p['mean']:.3f}" for p in r["comprehensiveness"])
        corr = [
            ci(r[k], ".2f") if k in r else "—"
            for k in ("spearman_with_leave_one_out", "kendall_with_leave_one_out")
        ]
        lines.append(
            f"| {name} | {result['num_texts']:,} | {LABELS[m]} | {comp} | "
            f"{ci(r['aopc_comprehensiveness'])} | {ci(r['aopc_sufficiency'])} | "
            f"{corr[0]} | {corr[1]} |"
        )
    for m, why in result["unavailable"].items():
        lines.append(f"| {name} | {result['num_texts']:,} | {LABELS[m]} | {why} | | | | |")
    return "\n".join(lines)
