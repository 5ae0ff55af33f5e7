"""The report: results.json as written, and REPORT.md, the reader's summary: the headline results
and their verdict, every target met or missed, the commands and the figures, then each section's
table. The hand-written reasoning, analysis.md, sits beside it and is linked, not appended.

`python -m benchmarks.report [--out=benchmarks]` rewrites REPORT.md, its plots and the results
regions of README.md and docs/*.md from the committed results.json, without running anything.
"""

import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import attention, distill, docs, finetune  # noqa: E402


def _met(t: dict) -> str:
    return "**met**" if t["met"] else "**missed**"


def _num(x, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


_STYLE = {"matrix": ("o", "-"), "chunked": ("s", "-"), "jax.nn": ("^", "--"), "flax": ("v", ":")}


def plot_attention(att: dict, out: str) -> list[str]:
    """Time and temp memory against L (log-log), one line per method, fwd and fwd+bwd panels."""

    d = min(r["D"] for r in att["rows"])
    rows = [r for r in att["rows"] if r["D"] == d]
    names = []
    for key, label in (("time_s", "time (s)"), ("temp_bytes", "XLA temp memory (MiB)")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, mode in zip(axes, ("fwd", "fwd_bwd"), strict=True):
            for method in _STYLE:  # the batched forms would overlay their twins
                pts = sorted(
                    (r["L"], r[key], "skipped" in r)
                    for r in rows
                    if r["method"] == method and r["mode"] == mode and key in r
                )
                if not pts:
                    continue
                marker, ls = _STYLE[method]
                scale = 1 if key == "time_s" else 2**-20
                xs, ys = [p[0] for p in pts], [p[1] * scale for p in pts]
                line = ax.plot(xs, ys, marker=marker, ls=ls, label=method, alpha=0.85)
                skipped = [p for p in pts if p[2]]
                if skipped:  # memory of compiled-but-not-run programs: hollow markers
                    ax.scatter(
                        [p[0] for p in skipped],
                        [p[1] * scale for p in skipped],
                        s=80,
                        facecolors="none",
                        edgecolors=line[0].get_color(),
                    )
            if key == "temp_bytes":
                ax.axhline(
                    attention.MAX_TEMP_BYTES / 2**20,
                    color="gray",
                    ls="--",
                    lw=1,
                    label="8 GiB skip threshold",
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length L")
            ax.set_title(f"{'forward' if mode == 'fwd' else 'forward + backward'}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(label)
        axes[1].legend()
        fig.suptitle(
            f"attention, float32, batch {att['batch']}, {att['heads']} heads, head dim {d}"
            + (" (hollow: compiled only, not run)" if key == "temp_bytes" else "")
        )
        fig.tight_layout()
        name = f"attention_{'time' if key == 'time_s' else 'memory'}.png"
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def _attention_md(att: dict, out: str) -> list[str]:
    t = att["targets"]
    # Runs before the batched forms and the compile column had neither.
    batched = (
        "; `batched` and `batched chunked` are `attn.dot_product_attention` (the same vmap, done "
        "for the caller) with the matrix and chunked implementations"
        if "batched" in att
        else ""
    )
    compiled = any("compile_s" in r for r in att["rows"])
    lines = [
        f"## {SECTIONS['attention'][0]}",
        "",
        f"float32, batch {att['batch']}, {att['heads']} heads; q, k, v [B, L, H, D]; no mask. "
        f"`matrix` and `chunked` are `attn.attention.attention` vmapped over batch and heads; "
        f"`jax.nn` is `jax.nn.dot_product_attention(implementation='xla')`; `flax` is "
        f"`flax.linen.dot_product_attention`{batched}. fwd+bwd = grad of the sum of outputs wrt "
        f"q, k, v. Time: median over interleaved repeats of the AOT-compiled program"
        + ("; compile: seconds to trace, lower and compile it (once each)" if compiled else "")
        + f"; memory: XLA "
        f"`temp_size_in_bytes`; est. peak adds the two [B, H, L, L] float32 scratch arrays that "
        f"XLA:CPU's fused kernels allocate outside it for every form but the chunked one "
        f"(measured with benchmarks/probes/rss.py); the 8 GiB skip rule uses est. peak. "
        f"FLOP/s use {att['flops_note']}, as a fraction of the "
        f"{att['matmul_n']}² float32 matmul measured in the same run: "
        f"**{att['matmul_gflops']:.1f} GFLOP/s**.",
        "",
        "| L | D | mode | method | time (ms) | × jax.nn | "
        + ("compile (s) | " if compiled else "")
        + "temp MiB | × matrix | est. peak MiB | GFLOP/s | of matmul | repeats | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if compiled else ""),
    ]
    for r in att["rows"]:
        lines.append(
            f"| {r['L']} | {r['D']} | {r['mode']} | {r['method']} | "
            f"{_num(r.get('time_s') and r['time_s'] * 1e3, '.1f')} | "
            f"{_num(r.get('time_ratio_vs_jax_nn'), '.2f')} | "
            + (f"{_num(r.get('compile_s'), '.2f')} | " if compiled else "")
            + f"{r['temp_bytes'] / 2**20:.1f} | "
            f"{r['memory_ratio_vs_matrix']:.3f} | {r['estimated_peak_bytes'] / 2**20:.0f} | "
            f"{_num(r.get('gflops'), '.1f')} | "
            f"{_num(r.get('fraction_of_matmul'), '.1%')} | {r.get('repeats', '')} | "
            f"{r.get('skipped', '')} |"
        )
    s, c, lg = t["matrix_speed"], t["chunked_memory"], t["chunked_long"]
    ratios = ", ".join(f"L={x['L']}/D={x['D']}: {x['ratio']:.3f}" for x in s["ratios"])
    lines += [
        "",
        "### Targets",
        "",
        f"- {s['target']}: {_met(s)}; worst ratio {_num(s['worst'], '.3f')} ({ratios}).",
        f"- {c['target']}: memory {_met({'met': c['memory_met']})} (chunked/matrix "
        f"{_num(c['memory_ratio'], '.5f')}); time "
        f"{_met({'met': c['time_met']})} (chunked/matrix {_num(c['time_ratio'], '.2f')}; "
        f"matrix at L={c['L']}: {c['matrix_skipped'] or 'ran'}; at L={c['largest_L_both_ran']}, "
        f"the largest L where both ran, chunked/matrix time = "
        f"{_num(c['time_ratio_at_largest_L_both_ran'], '.2f')}).",
        f"- {lg['target']}: {_met(lg)}; chunked {_num(lg['chunked_time_s'], '.1f')} s with "
        f"{lg['chunked_temp_bytes'] / 2**20:.0f} MiB temp; matrix would need "
        f"{lg['matrix_temp_bytes'] / attention.GIB:.1f} GiB.",
    ]
    if "batched" in att:
        bt = att["batched"]
        per_length = ", ".join(
            f"L={length}: {max(x['ratio'] for x in bt['ratios'] if x['L'] == length):.3f}"
            for length in bt["lengths"]
        )
        same = (
            "identical (optimised HLO without source locations and argument names), so any "
            "difference is timing noise"
            if bt["all_same_program"]
            else "**not** identical for "
            + ", ".join(
                f"{x['method']} {x['mode']} L={x['L']}" for x in bt["same_program"] if not x["same"]
            )
        )
        lines.append(
            f"- {bt['target']}: {_met(bt)}; worst ratio {_num(bt['worst'], '.3f')} (worst per L, "
            f"fwd and fwd+bwd, both implementations: {per_length}). The compiled programs of "
            f"each pair are {same}."
        )
    if "scaling" in att:
        lin = t["chunked_linear"]
        lines += [
            f"- {lin['target']}: {_met(lin)}; {lin['ratio']:.2f}x.",
            "",
            "Chunked fwd+bwd XLA temp memory on one head (d=64, 128x128 chunks), compiled only. "
            "Each query chunk is rematerialised in the backward pass, and `masks.causal` is a "
            "function of positions, so a causal mask costs no [L, L] array:",
            "",
            "| L | no mask (MiB) | causal (MiB) |",
            "|---|---|---|",
        ]
        by = {(r["L"], r["mask"]): r["temp_bytes"] / 2**20 for r in att["scaling"]}
        for length in sorted({r["L"] for r in att["scaling"]}):
            lines.append(
                f"| {length} | {by[(length, 'none')]:.1f} | {by[(length, 'causal')]:.1f} |"
            )
    lines.append("")
    for name in plot_attention(att, out):
        lines += [f"![{name}]({name})", ""]
    return lines


def _train_md(tr: dict) -> list[str]:
    p, t = tr["pipeline"], tr["targets"]["train_speed"]
    m = tr["model"]
    lines = [
        f"## {SECTIONS['train'][0]}",
        "",
        f"`experiments.training.classify.train_step` (jit) against `benchmarks.flax_twin` "
        f"(`nn.MultiHeadDotProductAttention`, same embedding, positions, pre-LN blocks, pooling "
        f"and head), same real batch, same optax optimizer, dropout on in both. Model: "
        f"d_model {m['d_model']}, {m['num_heads']} heads, {m['num_layers']} layer(s), d_ff "
        f"{m['d_ff']}, pooling {m['pooling']}, n-gram buckets {m['ngram_buckets']}, vocab "
        f"{m['vocab_size']}. Parameter counts: ours {tr['param_count']['ours']:,}, flax "
        f"{tr['param_count']['flax']:,} (asserted equal). Median of interleaved steps.",
        "",
        "| L | batch | ours ex/s | flax ex/s | ratio | ours tokens/s | flax tokens/s "
        "| ours real tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in tr["rows"]:
        o, f = r["ours"], r["flax"]
        lines.append(
            f"| {r['L']} | {r['batch']} | {o['examples_per_s']:.1f} | {f['examples_per_s']:.1f} | "
            f"{r['ratio']:.3f} | {o['tokens_per_s']:.0f} | {f['tokens_per_s']:.0f} | "
            f"{o['real_tokens_per_s']:.0f} |"
        )
    lines += [
        "",
        f"Input pipeline (`prefetch(train_batches(...))` over {p['steps']} real steps of an "
        f"epoch, all bucket shapes compiled beforehand): **{p['wait_fraction']:.2%}** of the "
        f"loop time is spent in `next()` ({p['wait_seconds']:.3f} s of {p['seconds']:.2f} s); "
        f"end to end {p['examples_per_s']:.1f} examples/s.",
        "",
        "### Target",
        "",
        f"- {t['target']}: {_met(t)}; worst ratio {t['worst']:.3f}.",
        "",
    ]
    return lines


def _accuracy_md(acc: dict) -> list[str]:
    b, bs, t = acc["tfidf_logreg"], acc["tfidf_sublinear_logreg"], acc["targets"]
    seeds = sorted(acc["seeds"], key=int)
    lines = [
        f"## {SECTIONS['accuracy'][0]}",
        "",
        f"`experiments.train.train_and_evaluate(configs/{acc['config']}, tmp)` once per seed "
        f"({', '.join(seeds)}); wall time includes data loading, tokenizer, compiles, training, "
        "validation and test evaluation. *No attention* is the same config with "
        "`model.num_layers=0`: the encoder block (self-attention and its feed-forward layer) "
        "removed, everything else (embeddings, hashed n-grams, pooling, bag, loss) kept. "
        f"Baseline: character 1-3-gram TF-IDF + logistic regression (scikit-learn, lbfgs), fit "
        f"on train ({b['num_train']:,} texts), C chosen on validation from "
        f"{sorted(float(c) for c in b['validation_accuracy'])}, test on the same "
        f"{b['num_test']:,} examples; with and without sublinear tf (1 + log tf). Short "
        "reviews: 20 obvious reviews of 2-12 characters written for this check "
        "(`benchmarks/accuracy.py`, `SHORT_REVIEWS`). Command: `python -m benchmarks accuracy`.",
        "",
        "| model | seed | test accuracy | macro-F1 | best validation | validation after "
        "epoch 1 | short reviews | wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, name in (("seeds", "default"), ("no_attention", "no attention")):
        runs = [acc[key][s] for s in seeds if s in acc[key]]
        for seed, r in zip(seeds, runs, strict=False):
            short = r.get("short_reviews")
            lines.append(
                f"| {name} | {seed} | {r['test_accuracy']:.4f} | {r['test_macro_f1']:.4f} | "
                f"{r['best_validation_accuracy']:.4f} | "
                f"{_num(r['first_epoch_validation_accuracy'], '.4f')} | "
                f"{_short(short)} | {r['wall_s']:.0f} |"
            )
        accs = [r["test_accuracy"] for r in runs]
        if len(accs) > 1:
            lines.append(
                f"| {name} | mean ± std | {np.mean(accs):.4f} ± {np.std(accs):.4f} | | | | | |"
            )
    r = acc["structured"]
    lines += [
        f"| structured pooling | {seeds[0]} | {r['test_accuracy']:.4f} | "
        f"{r['test_macro_f1']:.4f} | {r['best_validation_accuracy']:.4f} | | | "
        f"{r['wall_s']:.0f} |",
        f"| TF-IDF + logreg | | {b['test_accuracy']:.4f} | | "
        f"{b['validation_accuracy'][str(b['best_C'])]:.4f} | | | {b['wall_s']:.0f} |",
        f"| TF-IDF (sublinear tf) + logreg | | {bs['test_accuracy']:.4f} | | "
        f"{bs['validation_accuracy'][str(bs['best_C'])]:.4f} | | | {bs['wall_s']:.0f} |",
    ]
    wrong = sorted({w["text"] for s in seeds for w in acc["seeds"][s]["short_reviews"]["wrong"]})
    lines += ["", "### Targets", ""]
    lines += [f"- {x['target']}: {_met(x)}; {_target_numbers(x)}." for x in t.values()]
    if wrong:
        lines.append(f"- Short reviews some seed gets wrong: {', '.join(wrong)}.")
    lines.append("")
    return lines


def _short(short: dict | None) -> str:
    if not short:
        return ""
    return f"{round(short['accuracy'] * short['num_examples'])}/{short['num_examples']}"


def _target_numbers(t: dict) -> str:
    """The numbers of one accuracy target, in the order a reader checks them."""
    if "mean" in t:
        return f"mean {t['mean']:.4f} ± {t['std']:.4f} vs {t['baseline']:.4f} + 0.0100"
    accs = ", ".join(_num(a, ".4f") for a in t["accuracies"])
    if "baseline" in t:
        walls = ", ".join(f"{w:.0f}" for w in t["wall_s"])
        return f"{accs} vs {t['baseline']:.4f}; {walls} s"
    return accs


def _imdb_source(sec: dict) -> str:
    tfds = sec["path"] == "TFDS imdb_reviews"
    return "TFDS `imdb_reviews`" if tfds else "a local aclImdb folder (`--imdb_path`)"


def _imdb_md(sec: dict) -> list[str]:
    b, t = sec["tfidf_word12_sublinear_logreg"], sec["targets"]["beats_baseline"]
    m = sec["targets"]["mean_beats_baseline"]
    runs = [sec["seeds"][s] for s in t["seeds"]]
    lines = [
        f"## {SECTIONS['imdb'][0]}",
        "",
        f"`configs/{sec['config']}` on {_imdb_source(sec)}: the official train/test split, "
        "validation a hash-selected 10% of train; the checkpoint with the best validation "
        f"accuracy is tested once. Test set: {b['num_test']:,} reviews, train "
        f"{b['num_train']:,}. Command: "
        "`python -m benchmarks imdb --imdb_path=DIR/aclImdb --seeds=0,1,2`.",
        "",
        "| model | test accuracy | best validation | wall (s) | train examples/s | note |",
        "|---|---|---|---|---|---|",
    ]
    for seed, r in zip(t["seeds"], runs, strict=True):
        lines.append(
            f"| seed {seed} | {r['test_accuracy']:.4f} | {r['best_validation_accuracy']:.4f} | "
            f"{r['wall_s']:.0f} | {_num(r['examples_per_sec'], '.0f')} | best step "
            f"{r['best_step']} |"
        )
    if runs:
        accs = [r["test_accuracy"] for r in runs]
        lines.append(
            f"| mean of {len(accs)} | {sum(accs) / len(accs):.4f} | | | | spread "
            f"{min(accs):.4f}-{max(accs):.4f} |"
        )
    lines.append(
        f"| {b['features']} TF-IDF (sublinear tf) + logreg | {b['test_accuracy']:.4f} | "
        f"{b['validation_accuracy'][str(b['best_C'])]:.4f} | {b['wall_s']:.0f} | | "
        f"C={b['best_C']} |"
    )
    lines += [
        f"| {name} (published) | {acc:.4f} | | | | not run here |"
        for name, acc in sec["anchors"].items()
    ]
    lines += [
        "",
        "### Targets",
        "",
        f"- {m['target']}: {_met(m)}; {_num(m['mean'], '.4f')} vs {m['baseline']:.4f}.",
        f"- {t['target']}: {_met(t)}; "
        + ", ".join(f"{a:.4f}" for a in t["accuracies"])
        + f" vs {t['baseline']:.4f}.",
        "",
    ]
    return lines


def _lra_md(sec: dict) -> list[str]:
    names = list(sec["rows"][0]["hours_on"]) if sec["rows"] else []
    lines = [
        f"## {SECTIONS['lra'][0]}",
        "",
        "`configs/lra_text.py` (UTF-8 bytes, 4 layers, d=256) at its longest bucket: one train "
        "step measured here (one step after compiling, random bytes), and the whole run "
        "(10 epochs of 22,500 reviews) estimated from it. The accelerator columns divide the "
        f"step's matmul FLOPs by {sec['utilisation']:.0%} of each chip's dense bf16 peak: "
        "estimates, not measurements. Command: `python -m benchmarks lra`.",
        "",
        "| variant | L | attention | s/step here | GFLOP/step | GFLOP/s here | steps | hours here "
        + "".join(f"| hours, {n} " for n in names)
        + "|",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(names),
    ]
    for r in sec["rows"]:
        lines.append(
            f"| {r['variant']} | {r['max_len']} | {r['implementation']} | {r['step_s']:.2f} | "
            f"{r['step_gflop']:.0f} | {r['cpu_gflops']:.1f} | {r['total_steps']} | "
            f"{r['hours_here']:.1f} | "
            + " | ".join(f"{r['hours_on'][n]:.2f}" for n in names)
            + " |"
        )
    return [*lines, ""]


def _multihost_md(mh: dict) -> list[str]:
    t = mh["median_step_s"]
    return [
        f"## {SECTIONS['multihost'][0]}",
        "",
        f"`configs/{mh['config']}` train step on {mh['devices']} CPU devices: one process, or "
        f"two processes of {mh['devices'] // 2} devices each joined by jax.distributed (gloo "
        f"collectives over local TCP). Same global batches, same program; median of "
        f"{mh['steps_timed']} timed steps each (`python -m benchmarks multihost`).",
        "",
        "| job | median step |",
        "| --- | --- |",
        f"| one process, {mh['devices']} devices | {t['one_process'] * 1e3:.1f} ms |",
        f"| two processes, {mh['devices'] // 2} devices each | {t['two_processes'] * 1e3:.1f} ms |",
        "",
        f"Two processes take **{mh['ratio']:.2f}x** the step time of one: the price of "
        "exchanging gradients between processes. On 2 shared cores there is no speed-up to gain; "
        "on a pod each process brings its own accelerators.",
        "",
    ]


def _bert_md(sec: dict) -> list[str]:
    m = sec["model"]
    lines = [
        f"## {SECTIONS['bert'][0]}",
        "",
        f"Encoder ({m['num_layers']} layers, d={m['d_model']}, "
        f"{m['num_heads']} heads, FF {m['d_ff']}, vocabulary {m['vocab_size']:,}; "
        f"{sec['param_count']:,} parameters, random; all-MiniLM-L6-v2's shape in the full run), "
        "float32. One step: forward, backward of "
        "the mean-pooled cross-entropy, optax AdamW over every parameter; hidden dropout on, "
        "attention dropout off. `attn` runs `attn.attention` (matrix) in every head, `jax.nn` "
        "the same encoder with `jax.nn.dot_product_attention` in its place; `attn chunked` is "
        "compiled only, for its memory. Interleaved, median; speed ratio = jax.nn time / attn "
        f"time. GFLOP/s: matmul FLOPs (3x forward) per second, against the {sec['matmul_n']}² "
        f"float32 matmul measured in the same run: **{sec['matmul_flops'] / 1e9:.1f} GFLOP/s**. "
        f"Command: `{SECTIONS['bert'][1]}`.",
        "",
        "| L | batch | attn s/step | jax.nn s/step | speed ratio | attn tokens/s | attn GFLOP/s "
        "| of matmul | temp MiB attn / jax.nn / attn chunked | repeats |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sec["rows"]:
        a, j = r["attn"], r["jax.nn"]
        mem = " / ".join(
            f"{r[k]['temp_bytes'] / 2**20:.0f}" for k in ("attn", "jax.nn", "attn chunked")
        )
        lines.append(
            f"| {r['L']} | {r['batch']} | {a['step_s']:.3f} | {j['step_s']:.3f} | "
            f"{r['ratio']:.3f} | {a['tokens_per_s']:.0f} | {a['gflops']:.1f} | "
            f"{a['fraction_of_matmul']:.0%} | {mem} | {r['repeats']} |"
        )
    t = sec["targets"]["step_speed"]
    lines += ["", f"Target: {t['target']}: {_met(t)} (worst {t['worst']:.3f}).", ""]
    n = sec["numerics"]
    if "skipped" in n:
        lines += [f"Numerics: not measured ({n['skipped']}).", ""]
        return lines
    lines += [
        f"Numerics on {n['model']} ({n['param_count']:,} parameters loaded, the file's "
        f"{n['file_float_values']:,} float values): last hidden states of {n['real_tokens']} "
        f"real tokens of real sentences (ids {n['shape']}, largest |value| "
        f"{n['largest_abs_value']:.2f}), max abs difference:",
        "",
        "| attn.bert compute | vs transformers FlaxBertModel (float32) | vs float64 numpy |",
        "|---|---|---|",
    ]
    for dtype in ("float32", "bfloat16"):
        d = n[dtype]
        lines.append(f"| {dtype} | {d['vs_flax']:.2e} | {d['vs_float64_numpy']:.2e} |")
    lines += [
        "",
        f"The float64 numpy forward is {n['oracle_vs_flax']:.2e} from FlaxBertModel. Reference "
        "file: `benchmarks/bert_reference.py --model DIR` in a separate environment with "
        "transformers 4.57 (tests/data/bert/versions.json).",
        "",
    ]
    return lines


def _finetune_md(sec: dict) -> list[str]:
    lines = [
        f"## {SECTIONS['finetune'][0]}",
        "",
        f"`{os.path.basename(sec['data_path'])}` split 80/10/10 by text hash; checkpoint "
        f"`{os.path.basename(sec['bert_dir'].rstrip('/'))}`. Every row is a run of the train "
        "command's code (what each row changes: `benchmarks/finetune.py`), read on test once; "
        "wall time per run on 2 shared CPU cores, from reading the data to the test accuracy. "
        f"Command: `{SECTIONS['finetune'][1]}`.",
        "",
        docs.finetune_table(sec),
        "",
    ]
    for key, t in sec.get("targets", {}).items():
        if key == finetune.IMDB_TARGET:  # said under its own heading, by docs.finetune_imdb
            continue
        if t["finetuned_mean"] is not None and t["bar"] is not None:
            per_seed = " / ".join(f"{g * 100:+.2f}" for g in t["seed_gaps"])
            gap = f" ({(t['finetuned_mean'] - t['bar']) * 100:+.2f} points; per seed {per_seed})"
        else:
            gap = ""
        lines.append(f"- {t['target']}: {_met(t)}{gap}.")
    anchors = "; ".join(f"{k} {v:.1%}" for k, v in sec["anchors"].items())
    lines += ["", f"Published on these sentences (10-fold cross-validation): {anchors}.", ""]
    if "imdb" in sec:
        lines += [
            "### IMDB",
            "",
            f"`configs/{finetune.IMDB_CPU}` on IMDB's official split, read on test once: the "
            "encoder reads 128 tokens (the first 32 and last 96) for one epoch, the bag of "
            "n-grams beside it up to 1,024. Command: `python -m benchmarks finetune "
            "--bert_dir=DIR/all-MiniLM-L6-v2 --rows=imdb --imdb_path=DIR/aclImdb --seeds=0`.",
            "",
            docs.finetune_imdb(sec),
            "",
        ]
    return lines


def _distill_md(sec: dict) -> list[str]:
    lines = [
        f"## {SECTIONS['distill'][0]}",
        "",
        "attn's own model (`configs/distill.py`: the student of `configs/default.py` on the "
        "embedded reviews, of `configs/csv.py` on a file) trained on its teacher's logits over "
        "the transfer set (the training texts and augmented copies of each: units masked, "
        "n-grams cut), beside its TF-IDF, the same student alone (sections 3 and 8), the same "
        "student on the copies without the teacher, and the teacher. Every row is a run of the "
        "train command's code (what each row sets: `benchmarks/distill.py`); the distilled row "
        "kept is chosen on validation, and test is read once per row and seed. Wall time per "
        "run on 2 shared CPU cores, teacher outputs read back where a run shares texts with an "
        "earlier one. Serving: the chosen student (seed 0) and the teacher each as predict "
        "serves it, compiled first, then interleaved repeats, medians. Command: "
        f"`{SECTIONS['distill'][1]}`.",
        "",
    ]
    for key, part in sec.get("data", {}).items():
        where = "the embedded Chinese reviews" if key == distill.CHINESE else f"`{key}`"
        lines += [f"### {where}", "", docs.distill_table(part), "", docs.distill_speed(part), ""]
        for t in (v for k, v in sec.get("targets", {}).items() if k.startswith(f"{key}:")):
            if "seed_gaps" in t:
                gaps = " / ".join(f"{g * 100:+.2f}" for _, g in sorted(t["seed_gaps"].items()))
                lines.append(f"- {t['target']}: {_met(t)} (over TF-IDF, per seed: {gaps}).")
            else:
                ups = " and ".join(f"{x:.1f}x" for x in t["speedups"])
                lines.append(f"- {t['target']}: {_met(t)} ({ups}).")
        lines.append("")
    return lines


def _families_md(sec: dict) -> list[str]:
    lines = [
        f"## {SECTIONS['families'][0]}",
        "",
        "Each family at the size of the hub model named (its config's defaults, random weights), "
        f"batch {sec['batch']} x {sec['L']} tokens (half the rows padded from 3/4 of L), a "
        "fine-tuning step (forward, backward of the mean-pooled cross-entropy, AdamW over every "
        "parameter; hidden dropout on, attention dropout off) with attn's matrix attention "
        "against the same step with `jax.nn.dot_product_attention` (`implementation='xla'`: the "
        "family's own mask and rotary q, k go through), interleaved, medians. Where jax.nn "
        "cannot compute the family's score, the reference is BERT's step at the same size, "
        "which prices the score. Ratio attn / reference (**< 1: attn faster**). Command: "
        f"`{SECTIONS['families'][1]}`.",
        "",
        "| family | hub model | parameters | attn step | reference | its step | attn / reference |"
        " XLA temp memory, attn / reference |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in sec["rows"].items():
        a, ref = r["attn"], r["reference_step"]
        lines.append(
            f"| {name} | `{r['hub_id']}` | {r['param_count'] / 1e6:.1f}M | {a['step_s']:.2f} s | "
            f"{r['reference']} | {ref['step_s']:.2f} s | {r['ratio']:.3f} | "
            f"{a['temp_bytes'] / 2**20:.0f} / {ref['temp_bytes'] / 2**20:.0f} MiB |"
        )
    why = {r["no_jax_nn"] for r in sec["rows"].values() if r["no_jax_nn"]}
    lines += ["", *(f"No jax.nn reference: {w}." for w in sorted(why)), ""]
    return lines + _depth_md(sec["depth"]) if "depth" in sec else lines


def _depth_md(d: dict) -> list[str]:
    """The families section's depth line: one family's attn step at two depths."""
    (shallow, deep), (t_shallow, t_deep) = d["layers"], d["step_s"]
    return [
        f"Depth: {d['family']}'s attn step, the same batch, at {shallow} and {deep} layers: "
        f"{t_shallow:.2f} s and {t_deep:.2f} s, {deep} / {shallow} layers **{d['ratio']:.2f}** "
        f"(linear in depth: {deep / shallow:g}, less for the embeddings and head, which depth "
        "leaves alone).",
        "",
    ]


def _chinese_md(sec: dict) -> list[str]:
    name = os.path.basename(sec["pretrained"].rstrip("/"))
    return [
        f"## {SECTIONS['chinese'][0]}",
        "",
        f"`configs/finetune.py` on the embedded Chinese reviews with `{name}`, each "
        "row once per seed on the dataset's fixed split, read on test once; the learning rate is "
        "chosen on validation (best mean validation accuracy over the seeds every rate ran). "
        "Beside it the run's own char TF-IDF baseline (case kept, as the fine-tune's) and "
        "configs/default.py from scratch (section 3). Command: "
        f"`{SECTIONS['chinese'][1]}`.",
        "",
        docs.chinese_table(sec),
        "",
    ]


def _audit_md(sec: dict) -> list[str]:
    return [
        f"## {SECTIONS['audit'][0]}",
        "",
        docs.audit_summary(sec) + f" Command: `{SECTIONS['audit'][1]}`.",
        "",
        docs.audit_table(sec),
        "",
    ]


def _traditional_md(sec: dict) -> list[str]:
    return [
        f"## {SECTIONS['traditional'][0]}",
        "",
        "The embedded test split made traditional with OpenCC's s2t, given to the models of "
        "section 13 (trained on the simplified reviews) as it is, and read with "
        "`--convert=t2s`, which converts it back before the model reads it. "
        + docs.traditional_summary(sec)
        + f" Command: `{SECTIONS['traditional'][1]}`.",
        "",
        docs.traditional_table(sec),
        "",
    ]


def _export_md(sec: dict) -> list[str]:
    v = sec["versions"]
    lines = [
        f"## {SECTIONS['export'][0]}",
        "",
        "Each tiny checkpoint of tests/data/encoders fine-tuned 8 steps (`configs/finetune.py:tiny`"
        "), and all-MiniLM-L6-v2 30 steps (`configs/finetune.py`), in both poolings, exported "
        "(`python -m experiments.export`) and loaded by transformers "
        f"{v['transformers']} (torch {v['torch']}) with AutoTokenizer and "
        "AutoModelForSequenceClassification: the largest |probability - predict's| over 5 texts, "
        "and whether AutoTokenizer gives attn's ids on 8 texts (Chinese, accents, an emoji and a "
        "text longer than the encoder reads among them, nothing cut)"
        + (
            '; and `pipeline("text-classification", model=DIR)` (trust_remote_code for a '
            "mean-pooled export), the first thing a transformers user types: the error lines it "
            "logs and its scores' largest difference from predict's"
            if any("pipeline_errors" in r for r in sec["rows"].values())
            else ""
        )
        + f". Commands: `{SECTIONS['export'][1]}`.",
        "",
        "| run | transformers class | tokenizer | ids | max abs prob. difference | loads cleanly |"
        " pipeline |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in sec["rows"].items():
        if "pipeline_errors" not in r:
            pipe = "not run"
        elif r["pipeline_errors"]:
            pipe = f"**logs an error**: {r['pipeline_errors'][0][:60]}..."
        else:
            pipe = f"no error, {r['pipeline_max_probability_gap']:.1e}"
        lines.append(
            f"| {name} | {r['class']} | {r['tokenizer']} | "
            f"{'same' if r['ids_match'] else 'DIFFER'} | {r['max_probability_gap']:.1e} | "
            f"{'yes' if not r['load_faults'] else r['load_faults']} | {pipe} |"
        )
    return [*lines, ""]


def _peers_md(sec: dict) -> list[str]:
    r, e = sec["recipe"], sec["encoder"]
    load = sec["load_average"]
    lines = [
        f"## {SECTIONS['peers'][0]}",
        "",
        f"`{sec['model']}` ({e['num_layers']} layers, d={e['d_model']}, {e['num_heads']} heads, "
        f"FF {e['d_ff']}), float32, loaded by every side from the same directory; the same "
        "token batches (random ids, real lengths L/2 to L, padded). attn runs "
        "`classify.train_step` with `optim.make_optimizer` as `setup.train` builds them "
        "(configs/finetune.py: AdamW at "
        f"{r['learning_rate']:g}, weight decay {r['weight_decay']:g} on matrices, linear warmup "
        f"{r['warmup_steps']} steps and decay over {r['total_steps']}, clipping at "
        f"{r['clip_norm']:g}, weight average {r['ema_decay']:g}, non-finite updates skipped; "
        f"dropout {e['dropout']:g} hidden, {e['attention_dropout']:g} attention, "
        f"{r['dropout']:g} pooled) and `classify.eval_step` for serving; each peer the same "
        "classifier (mean pooling, dropout, linear head from attn's starting weights) and "
        "recipe as its users write it. Each cell: the median over "
        f"{sec['train'][0]['rounds'] if sec['train'] else 0} interleaved rounds of attn's time "
        "over the peer's (**< 1: attn faster**), [its quartiles], and the peer's median time. Cold "
        "start: a new Python process that loads the checkpoint and encodes the serving batch, "
        f"its whole wall time, median of {sec['cold_start']['rounds']}. Load average "
        f"{load['before'][0]:.1f} before and {load['after'][0]:.1f} after, on {sec['threads']} "
        f"cores. Command: `{SECTIONS['peers'][1]}`, in a venv with requirements-peers.txt "
        "(docs/benchmarks.md).",
        "",
        docs.peers_table(sec),
        "",
        "First call (compiling, then one step or forward), seconds:",
        "",
        "| task | batch × L | " + " | ".join(sec["sides"]) + " |",
        "| --- | --- |" + " --- |" * len(sec["sides"]),
    ]
    for task, row in [("fine-tuning step", x) for x in sec["train"]] + [("serving", sec["serve"])]:
        cells = [_num(row[n]["first_call_s"], ".1f") if n in row else "n/a" for n in sec["sides"]]
        lines.append(f"| {task} | {row['batch']} × {row['L']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Numerics, in evaluation on the serving batch: max |peer - attn| over real tokens' last "
        "hidden states and over logits, against the float32 tolerance "
        "(`benchmarks.peers.tolerance`); a peer beyond it is not timed.",
        "",
        "| peer | hidden states (tolerance) | logits (tolerance) | agrees |",
        "| --- | --- | --- | --- |",
    ]
    for name, n in sec["numerics"].items():
        lines.append(
            f"| {name} | {n['max_abs_hidden']:.1e} ({n['tolerance_hidden']:.1e}) | "
            f"{n['max_abs_logits']:.1e} ({n['tolerance_logits']:.1e}) | "
            f"{'yes' if n['agrees'] else '**no**'} |"
        )
    lines += ["", "| side | version | threads | how it runs |", "| --- | --- | --- | --- |"]
    for name, s in sec["sides"].items():
        lines.append(f"| {name} | {s['version']} | {s['threads']} | {s['note']} |")
    lines += [f"| {name} | skipped: {why} | | |" for name, why in sec["skipped"].items()]
    return [*lines, ""]


# section key -> (heading, command); the heading's anchor is where the summary links.
SECTIONS = {
    "attention": ("1. Attention kernels", "python -m benchmarks attention"),
    "train": ("2. Train step: ours vs a flax.linen twin", "python -m benchmarks train"),
    "accuracy": ("3. Accuracy", "python -m benchmarks accuracy --seeds=0,1,2"),
    "imdb": ("4. IMDB", "python -m benchmarks imdb --imdb_path=DIR/aclImdb --seeds=0,1,2"),
    "lra": ("5. Long Range Arena text: cost", "python -m benchmarks lra"),
    "multihost": (
        "6. Several processes: two processes against one",
        "python -m benchmarks multihost",
    ),
    "bert": (
        "7. A pretrained-size encoder (attn.bert): fine-tuning step and numerics",
        "python -m benchmarks bert --bert_dir=DIR/all-MiniLM-L6-v2",
    ),
    "finetune": (
        "8. What attention earns pretrained: fine-tuning against its ablations",
        "python -m benchmarks finetune --bert_dir=DIR/all-MiniLM-L6-v2 --data_path=FILE",
    ),
    "peers": (
        "9. Against its peers: PyTorch, torch.compile, ONNX Runtime and Flax on one checkpoint",
        "python -m benchmarks peers --bert_dir=DIR/all-MiniLM-L6-v2",
    ),
    "families": (
        "10. Every encoder family: its fine-tuning step against jax.nn's attention",
        "python -m benchmarks families",
    ),
    "chinese": (
        "12. A pretrained Chinese encoder fine-tuned on the embedded reviews",
        "python -m benchmarks chinese --pretrained=DIR/m3e-small --workdirs=RUNS",
    ),
    "audit": (
        "13. The embedded reviews' label noise, and the accuracy it allows",
        "python -m benchmarks audit --workdirs=RUNS",
    ),
    "export": (
        "11. Exported classifiers loaded by transformers",
        "python benchmarks/probes/export_runs.py OUT --minilm=DIR/all-MiniLM-L6-v2; "
        "REFVENV/bin/python benchmarks/transformers_check.py OUT/expected.json OUT/checked.json; "
        "python -m benchmarks.report --export=OUT/checked.json",
    ),
    "distill": (
        "14. Distillation: attn's own model taught by a fine-tuned encoder",
        "python -m benchmarks distill --teacher=WORKDIR [--data_path=FILE] --workdirs=DIR",
    ),
    "traditional": (
        "15. Traditional Chinese, as it is and converted to simplified",
        "python -m benchmarks traditional --workdirs=RUNS",
    ),
}


def anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _targets(results: dict) -> list[tuple[str, str, bool]]:
    """(section key, target, met) for every target of every section present, in report order."""
    out = []
    for key in SECTIONS:
        sec = results.get(key, {})
        for t in sec.get("targets", {}).values():
            out.append((key, t["target"], t["met"]))
        if "batched" in sec:
            out.append((key, sec["batched"]["target"], sec["batched"]["met"]))
    return out


def _summary_md(results: dict) -> list[str]:
    lines = []
    if "accuracy" in results and "imdb" in results:
        lines += [
            "## In short",
            "",
            docs.headline(results),
            "",
            docs.verdict(results),
            "",
        ]
    if all(k in results for k in ("attention", "train", "multihost")):
        lines += [docs.speed(results), ""]
    targets = _targets(results)
    if targets:
        met = sum(m for _, _, m in targets)
        lines += [
            f"## Targets: {met} of {len(targets)} met",
            "",
            "| section | target | verdict |",
            "| --- | --- | --- |",
        ]
        for key, target, m in targets:
            title = SECTIONS[key][0]
            lines.append(
                f"| [{title.split(':')[0]}](#{anchor(title)}) | {target} | {_met({'met': m})} |"
            )
        lines.append("")
    lines += [
        "## Commands",
        "",
        "| section | command | wall time of the run below |",
        "| --- | --- | --- |",
    ]
    for key, (title, command) in SECTIONS.items():
        if key in results:
            wall = _wall(results[key])
            lines.append(
                f"| [{title.split(':')[0]}](#{anchor(title)}) | `{command}` | {wall / 60:.0f} min |"
            )
    lines += [
        "",
        "`python -m benchmarks all` runs the first three; `python -m benchmarks device` is for a "
        "GPU or TPU (it writes `device.json`, not a section here); `python -m benchmarks.report` "
        "rewrites this page and the results in README.md and docs/ from results.json alone.",
        "",
        "Figures: [attention time](attention_time.png) and [memory](attention_memory.png) "
        "against L (section 1); [the default's faithfulness](faithfulness_default.png) "
        "(analysis.md).",
        "",
        "Why each number is what it is, what was tried and did not help, short reviews, the "
        "priors, the data the recipe was not tuned on, and the faithfulness of attention maps: "
        "[analysis.md](analysis.md), hand-written.",
        "",
    ]
    return lines


def write(results: dict, out: str) -> None:
    """results.json, and REPORT.md (+ PNGs) for every section present."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks "
        "[attention|train|accuracy|imdb|lra|multihost|bert|finetune|peers|families|chinese|audit|"
        "distill|traditional|all]` on 2 "
        "CPU cores shared with other jobs (timings are noisy; ratios come from interleaved runs "
        "in one process). "
        "Every number is copied from `results.json`; a section that was not re-run keeps the "
        "numbers of the run that produced it.",
        "",
        *_summary_md(results),
    ]
    sections = (
        ("attention", None),
        ("train", _train_md),
        ("accuracy", _accuracy_md),
        ("imdb", _imdb_md),
        ("lra", _lra_md),
        ("multihost", _multihost_md),
        ("bert", _bert_md),
        ("finetune", _finetune_md),
        ("peers", _peers_md),
        ("families", _families_md),
        ("export", _export_md),
        ("chinese", _chinese_md),
        ("audit", _audit_md),
        ("distill", _distill_md),
        ("traditional", _traditional_md),
    )
    for name, fn in sections:
        if name not in results:
            continue
        sec = results[name]
        lines += _attention_md(sec, out) if fn is None else fn(sec)
        if name == "export":  # a check of files, timed by no one
            continue
        rss = f"; process peak RSS so far {_peak(sec) / 2**30:.2f} GiB" if _peak(sec) else ""
        quick = "; --quick" if sec.get("quick") else ""
        lines += [f"_Section wall time {_wall(sec):.0f} s{rss}{quick}._", ""]
    with open(os.path.join(out, "REPORT.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def _wall(sec: dict) -> float:
    """A section's wall time: its runs' sum where it gathers them over several calls."""
    if "data" in sec:  # distill: its runs, on each data
        parts = sec["data"].values()
        return sum(
            x["wall_s"] for p in parts for row in p["runs"].values() for x in row["seeds"].values()
        )
    if "runs" in sec:
        imdb = sec.get("imdb", {}).get("seeds", {}).values()
        runs = [x for row in sec["runs"] for x in finetune.runs(sec, row)]
        return sum(x.get("wall_s", 0) for x in [*runs, *imdb])
    return sec.get("wall_s", 0)


def _peak(sec: dict) -> int:
    if "peak_rss_bytes" in sec:
        return sec["peak_rss_bytes"]
    return max((r["peak_rss_bytes"] for r in sec.get("rows", [])), default=0)


def main(argv: list[str]) -> None:
    """REPORT.md and the docs' results regions from the committed results.json; runs nothing.
    --export=CHECKED.json (benchmarks/transformers_check.py's) is stored first as its section."""
    out = next((a.split("=", 1)[1] for a in argv if a.startswith("--out=")), "benchmarks")
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    checked = next((a.split("=", 1)[1] for a in argv if a.startswith("--export=")), None)
    if checked:
        with open(checked, encoding="utf-8") as f:
            results["export"] = json.load(f)
    write(results, out)
    changed = docs.write(results)
    print(
        f"wrote {os.path.join(out, 'REPORT.md')}; results regions changed in: {changed or 'none'}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
