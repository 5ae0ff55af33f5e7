"""Section 9: attn's pretrained path against what its users would pick instead, on one
checkpoint (--bert_dir): PyTorch eager and torch.compile (transformers' BertModel), ONNX Runtime
(an export of the same PyTorch classifier, forward only) and transformers' FlaxBertModel.

attn's side is the fine-tuning step users run: `classify.train_step` with
`optim.make_optimizer`, jitted with the state donated as `setup.train` builds it, on
configs/finetune.py's recipe (AdamW, linear warmup and decay, weight decay on matrices only,
global-norm clipping, the weight average, non-finite updates skipped); and evaluation's and
predict's forward, `classify.eval_step`. Every peer is the same classifier (the encoder, mean
pooling over real tokens, dropout, a linear head with attn's starting head weights) trained by
the same recipe as its own users write it (AdamW with the same hyperparameters and decay mask,
the same schedule, clipping and weight average; no skipping of non-finite updates), fed the same
token batches. PyTorch and ONNX Runtime get as many threads as the process has cores; XLA sizes
its own pool to the cores.

First the numerics: each peer's last hidden states (real tokens) and logits in evaluation
against attn's, within float32's error (`tolerance`); a peer that disagrees is reported and not
timed. Then the timing: every side called once to compile (its first-call time recorded) and
once more, then `rounds` rounds in which each side runs once, in turn; per side the median
seconds, per peer the median of the per-round ratios attn / peer (< 1: attn faster). Cold
start: load the checkpoint and encode the serving batch in a new Python process, the process's
whole wall time, interleaved the same way.

The peers are optional (requirements-peers.txt, in a venv of its own; docs/benchmarks.md): one
that is not installed, or that fails to build, is skipped with the reason.
"""

import dataclasses
import functools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn import bert, encoder_classifier, encoders
from benchmarks import config_file, timing
from experiments.data import chosen
from experiments.errors import UserError
from experiments.training import classify, finetune, optim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_CLASSES = 2
# The schedule's length: a nominal run, long enough that the learning rate never reaches 0 while
# timing (the step's cost does not depend on it).
TOTAL_STEPS = 1000
TRAIN_SHAPES = ((32, 64), (16, 128), (16, 256))  # (batch, length)
SERVE_SHAPE = (64, 128)  # configs/finetune.py's evaluation batch
ROUNDS = 15
COLD_ROUNDS = 3
QUICK = {"train": ((4, 16), (2, 32)), "serve": (8, 32), "rounds": 2, "cold_rounds": 1}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The fine-tuning recipe every side follows: configs/finetune.py's, its data-chosen fields
    filled for a run of total_steps as `chosen.choose` fills them."""

    learning_rate: float
    weight_decay: float
    warmup_steps: int
    total_steps: int
    clip_norm: float
    ema_decay: float
    dropout: float  # on the pooled vector; the encoder's own come from its config.json

    def lr_factor(self, step: int) -> float:
        """The learning rate's factor at `step`: linear warmup from 0, linear decay to 0."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        return max(0.0, (self.total_steps - step) / (self.total_steps - self.warmup_steps))


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every peer starts from: the checkpoint, its encoder as attn reads it (the dropout
    rates the peers take), the recipe, attn's starting head."""

    bert_dir: str
    encoder: bert.Config
    recipe: Recipe
    head_w_DxC: np.ndarray
    head_b_C: np.ndarray
    threads: int  # cores this process may use


@dataclasses.dataclass
class Side:
    """One framework's classifier, ready to run."""

    version: str
    threads: str  # how many threads it computes with, in words
    # ids [B, L], mask [B, L] -> (last hidden states [B, L, D], logits [B, C]), in evaluation
    forward: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    # batch -> a call computing the class probabilities [B, C] (evaluation, no gradient)
    serve: Callable[[dict], Callable[[], Any]]
    # batch -> a call running one fine-tuning step; None: a forward-only runtime
    train: Callable[[dict], Callable[[], Any]] | None = None
    # Python run in a new process with argv [checkpoint dir, ids.npy]: load and encode once
    cold_start: str | None = None
    note: str = ""  # what else a reader should know about how it runs


def recipe_config(bert_dir: str, max_len: int):
    """configs/finetune.py for `bert_dir`, with the fields it leaves to the data filled."""
    config = config_file("finetune.py")
    config.model.pretrained = bert_dir
    config.data.max_len = max_len
    config.optim.warmup_steps = round(0.075 * TOTAL_STEPS)  # chosen.choose's rule
    config.optim.ema_decay = chosen.ema_decay(TOTAL_STEPS)
    config.optim.learning_rate = chosen.learning_rate(
        encoders.open_checkpoint(bert_dir).config.d_model
    )
    return config


def make_batch(vocab_size: int, batch: int, length: int, seed: int = 0) -> dict:
    """Token ids of real lengths between L/2 and L (a length bucket's mix), padded with 0, in
    the train loop's batch layout."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, (batch, length), dtype=np.int32)
    real = rng.integers(length // 2, length + 1, batch)
    tokens[np.arange(length)[None, :] >= real[:, None]] = encoder_classifier.PAD
    return {
        "tokens": tokens,
        "mask": tokens != encoder_classifier.PAD,
        "label": np.arange(batch, dtype=np.int32) % NUM_CLASSES,
        "weight": np.ones(batch, np.float32),
    }


ATTN_COLD = """
import sys
import jax
import numpy as np
from attn import bert
params, cfg = bert.load(sys.argv[1])
ids = np.load(sys.argv[2])
jax.block_until_ready(jax.jit(bert.encode, static_argnums=1)(params, cfg, ids, ids != 0))
"""


def attn_fine_tuning(bert_dir: str, max_len: int):
    """(config, model config, jitted train step, fresh state) for `bert_dir` as the train command
    builds them: configs/finetune.py (`recipe_config`), `setup.train`'s optimizer, frozen mask
    and donated jitted step over `classify.train_step`, the checkpoint's encoder in the state."""
    config = recipe_config(bert_dir, max_len)
    o = config.optim
    pre = finetune.load(config)
    cfg = finetune.model_config(config, pre.encoder, NUM_CLASSES)
    tx = optim.make_optimizer(
        o, TOTAL_STEPS, finetune.warm, finetune.layer_scales(pre.encoder.num_layers, o.layer_decay)
    )
    frozen = optim.frozen_mask(o, finetune.warm)
    step = jax.jit(
        functools.partial(
            classify.train_step, **classify.loss_options(o), cfg=cfg, tx=tx, frozen=frozen
        ),
        donate_argnums=0,
    )
    make_params = finetune.init_params(pre, cfg)
    state = optim.init_state(
        jax.random.PRNGKey(config.train.seed),
        cfg,
        tx,
        ema=o.ema_decay > 0,
        params_from=lambda k: make_params(k, True),
    )
    return config, cfg, step, state


def attn_side(bert_dir: str, max_len: int) -> tuple[Side, Setup]:
    """attn's classifier (`attn_fine_tuning`'s step; `classify.eval_step` serving) and the Setup
    the peers copy."""
    config, cfg, step, state = attn_fine_tuning(bert_dir, max_len)
    o = config.optim
    # The train step donates the state: evaluation gets params of its own.
    params = jax.tree.map(jnp.copy, optim.eval_params(state))
    holder = {"state": state}

    def train(batch: dict) -> Callable[[], Any]:
        b = jax.device_put(batch)

        def run():
            holder["state"], _ = step(holder["state"], b)
            return holder["state"]

        return run

    def serve(batch: dict) -> Callable[[], Any]:
        b = jax.device_put(batch)
        return lambda: classify.eval_step(params, b, cfg=cfg)[1]

    encode = jax.jit(bert.encode, static_argnums=1)
    logits = jax.jit(lambda p, ids: encoder_classifier.apply(p, ids, cfg)[0])

    def forward(ids, mask):
        return np.asarray(encode(params["encoder"], cfg.encoder, ids, mask)), np.asarray(
            logits(params, ids)
        )

    recipe = Recipe(
        learning_rate=o.learning_rate,
        weight_decay=o.weight_decay,
        warmup_steps=o.warmup_steps,
        total_steps=TOTAL_STEPS,
        clip_norm=o.clip_norm,
        ema_decay=o.ema_decay,
        dropout=cfg.dropout,
    )
    setup = Setup(
        bert_dir=bert_dir,
        encoder=cfg.encoder,
        recipe=recipe,
        head_w_DxC=np.array(params["head"]["w"]),  # writable: torch.from_numpy wants it
        head_b_C=np.array(params["head"]["b"]),
        threads=len(os.sched_getaffinity(0)),
    )
    side = Side(
        version=f"jax {jax.__version__}",
        threads=f"XLA:CPU's own pool, sized to the machine's {os.cpu_count()} cores",
        forward=forward,
        serve=serve,
        train=train,
        cold_start=ATTN_COLD,
        note=f"attention {cfg.implementation}, dropout {cfg.encoder.dropout} (hidden) / "
        f"{cfg.encoder.attention_dropout} (attention) / {cfg.dropout} (pooled)",
    )
    return side, setup


def _torch_classifier(setup: Setup):
    """The classifier in PyTorch: BertModel without its pooler, mean pooling, dropout, head."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # the unused pooler weights are expected

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel.from_pretrained(
                setup.bert_dir,
                add_pooling_layer=False,
                hidden_dropout_prob=setup.encoder.dropout,
                attention_probs_dropout_prob=setup.encoder.attention_dropout,
            )
            self.dropout = torch.nn.Dropout(setup.recipe.dropout)
            d, c = setup.head_w_DxC.shape
            self.head = torch.nn.Linear(d, c)
            with torch.no_grad():
                self.head.weight.copy_(torch.from_numpy(setup.head_w_DxC.T.copy()))
                self.head.bias.copy_(torch.from_numpy(setup.head_b_C))

        def forward(self, ids, mask):
            h = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
            return h, self.head(self.dropout(pooled))

    return Classifier()


def _torch_inputs(batch: dict):
    import torch

    ids = torch.from_numpy(batch["tokens"].astype(np.int64))
    return ids, (ids != encoder_classifier.PAD).long()


TORCH_COLD = """
import sys
import numpy as np
import torch
import transformers
torch.set_num_threads({threads})
model = transformers.BertModel.from_pretrained(sys.argv[1], add_pooling_layer=False).eval()
ids = torch.from_numpy(np.load(sys.argv[2]).astype(np.int64))
with torch.inference_mode():
    model(input_ids=ids, attention_mask=(ids != 0).long())
"""


def _pytorch(setup: Setup, compiled: bool) -> Side:
    import torch
    import transformers

    torch.set_num_threads(setup.threads)
    torch.manual_seed(0)
    model = _torch_classifier(setup)
    # dynamic=False: one program per shape, as XLA compiles one per shape.
    fwd = torch.compile(model, dynamic=False) if compiled else model
    r = setup.recipe
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": r.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=r.learning_rate,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, r.lr_factor)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(r.ema_decay)
    )
    params = list(model.parameters())

    def train(batch: dict) -> Callable[[], Any]:
        ids, mask = _torch_inputs(batch)
        labels = torch.from_numpy(batch["label"].astype(np.int64))

        def step():
            model.train()
            opt.zero_grad(set_to_none=True)
            _, logits = fwd(ids, mask)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, r.clip_norm)
            opt.step()
            schedule.step()
            ema.update_parameters(model)
            return loss.detach()

        return step

    def serve(batch: dict) -> Callable[[], Any]:
        ids, mask = _torch_inputs(batch)

        def run():
            model.eval()
            with torch.inference_mode():
                return torch.softmax(fwd(ids, mask)[1], -1)

        return run

    def forward(ids, mask):
        model.eval()
        with torch.inference_mode():
            h, logits = fwd(*_torch_inputs({"tokens": ids}))
        del mask  # the mask is ids != PAD, as attn's
        return h.numpy(), logits.numpy()

    return Side(
        version=f"torch {torch.__version__}, transformers {transformers.__version__}",
        threads=f"torch.set_num_threads({torch.get_num_threads()}), "
        f"{torch.get_num_interop_threads()} inter-op",
        forward=forward,
        serve=serve,
        train=train,
        cold_start=None if compiled else TORCH_COLD.format(threads=setup.threads),
        note=f"BertModel attention {model.bert.config._attn_implementation!r}; torch.optim.AdamW "
        "(CPU default: a loop over tensors), LambdaLR, clip_grad_norm_, swa_utils.AveragedModel"
        + ("; torch.compile(model, dynamic=False), optimizer eager" if compiled else ""),
    )


def _onnxruntime(setup: Setup) -> Side:
    import onnxruntime as ort
    import torch

    model = _torch_classifier(setup).eval()
    enc = setup.encoder
    batch_dim = torch.export.Dim("batch")
    length = torch.export.Dim("length", max=enc.max_positions - enc.position_offset)
    example = _torch_inputs(make_batch(enc.vocab_size, 2, 16))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "classifier.onnx")
        torch.onnx.export(
            model,
            example,
            path,
            dynamo=True,
            input_names=["ids", "mask"],
            output_names=["hidden", "logits"],
            dynamic_shapes=({0: batch_dim, 1: length}, {0: batch_dim, 1: length}),
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = setup.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def feeds(ids):
        ids = np.asarray(ids).astype(np.int64)
        return {"ids": ids, "mask": (ids != encoder_classifier.PAD).astype(np.int64)}

    def serve(batch: dict) -> Callable[[], Any]:
        f = feeds(batch["tokens"])

        def run():
            (logits,) = session.run(["logits"], f)
            e = np.exp(logits - logits.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        return run

    def forward(ids, mask):
        del mask  # ids != PAD
        hidden, logits = session.run(["hidden", "logits"], feeds(ids))
        return hidden, logits

    return Side(
        version=f"onnxruntime {ort.__version__}, torch {torch.__version__}",
        threads=f"intra_op_num_threads={setup.threads}, inter_op_num_threads=1",
        forward=forward,
        serve=serve,
        note="torch.onnx.export(dynamo=True), dynamic batch and length; CPUExecutionProvider, "
        "default graph optimisations",
    )


FLAX_COLD = """
import sys
import jax
import numpy as np
import transformers
transformers.logging.set_verbosity_error()
model = transformers.FlaxBertModel.from_pretrained(sys.argv[1], add_pooling_layer=False)
ids = np.load(sys.argv[2])
jax.block_until_ready(jax.jit(lambda i: model(i, i != 0)[0])(ids))
"""


def _flax(setup: Setup) -> Side:
    import optax
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.FlaxBertModel.from_pretrained(
        setup.bert_dir,
        add_pooling_layer=False,
        hidden_dropout_prob=setup.encoder.dropout,
        attention_probs_dropout_prob=setup.encoder.attention_dropout,
    )
    r = setup.recipe
    params = {
        "bert": model.params,
        "head": {"w": jnp.asarray(setup.head_w_DxC), "b": jnp.asarray(setup.head_b_C)},
    }

    def apply(p, ids, train: bool, rng):
        mask = ids != encoder_classifier.PAD
        r_bert, r_pool = jax.random.split(rng) if train else (None, None)
        h = model(ids, mask, params=p["bert"], dropout_rng=r_bert, train=train)[0]
        m = mask[..., None].astype(h.dtype)
        pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
        if train:
            keep = jax.random.bernoulli(r_pool, 1.0 - r.dropout, pooled.shape)
            pooled = jnp.where(keep, pooled / (1.0 - r.dropout), 0.0)
        return h, pooled @ p["head"]["w"] + p["head"]["b"]

    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, r.learning_rate, r.warmup_steps),
            optax.linear_schedule(r.learning_rate, 0.0, r.total_steps - r.warmup_steps),
        ],
        [r.warmup_steps],
    )
    tx = optax.chain(
        optax.clip_by_global_norm(r.clip_norm),
        optax.adamw(
            schedule,
            weight_decay=r.weight_decay,
            mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
        ),
    )

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state, ids, labels):
        rng = jax.random.fold_in(state["rng"], state["step"])

        def loss_fn(p):
            logits = apply(p, ids, True, rng)[1]
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt = tx.update(grads, state["opt"], state["params"])
        new = optax.apply_updates(state["params"], updates)
        # The bias-corrected running average, as attn's.
        d = jnp.float32(r.ema_decay)
        w = (1 - d) / (1 - d ** (state["step"] + 1).astype(jnp.float32))
        ema = jax.tree.map(lambda e, x: e + w * (x - e), state["ema"], new)
        return {
            "params": new,
            "opt": opt,
            "ema": ema,
            "step": state["step"] + 1,
            "rng": state["rng"],
        }, loss

    holder = {
        "state": {
            "params": jax.tree.map(jnp.copy, params),
            "opt": tx.init(params),
            "ema": jax.tree.map(jnp.copy, params),
            "step": jnp.zeros([], jnp.int32),
            "rng": jax.random.PRNGKey(0),
        }
    }
    evaluate = jax.jit(lambda p, ids: apply(p, ids, False, None))
    probabilities = jax.jit(lambda p, ids: jax.nn.softmax(apply(p, ids, False, None)[1]))

    def train(batch: dict) -> Callable[[], Any]:
        ids, labels = jax.device_put((batch["tokens"], batch["label"]))

        def run():
            holder["state"], _ = step(holder["state"], ids, labels)
            return holder["state"]

        return run

    def serve(batch: dict) -> Callable[[], Any]:
        ids = jax.device_put(batch["tokens"])
        return lambda: probabilities(params, ids)

    def forward(ids, mask):
        del mask  # ids != PAD
        h, logits = evaluate(params, ids)
        return np.asarray(h), np.asarray(logits)

    return Side(
        version=f"transformers {transformers.__version__} FlaxBertModel, jax {jax.__version__}",
        threads=f"XLA:CPU's own pool, sized to the machine's {os.cpu_count()} cores",
        forward=forward,
        serve=serve,
        train=train,
        cold_start=FLAX_COLD,
        note="optax clip_by_global_norm + adamw (decay mask), jitted step with the state "
        "donated, as the transformers Flax examples write it",
    )


# name -> (Setup -> Side); each imports what it needs when called.
PEERS: dict[str, Callable[[Setup], Side]] = {
    "pytorch": functools.partial(_pytorch, compiled=False),
    "torch.compile": functools.partial(_pytorch, compiled=True),
    "onnxruntime": _onnxruntime,
    "flax": _flax,
}


def tolerance(enc: bert.Config, largest: float) -> float:
    """The largest difference two correct float32 forwards may show on values up to `largest`:
    a dot product of K terms rounds to about sqrt(K) eps relative, K <= d_ff here, once per
    layer and once in the embeddings, and 4x that for other summation orders and kernels. Far
    below what a wrong mask costs, and below what a tanh GELU or a LayerNorm eps of 1e-5 for
    1e-12 does (benchmarks/analysis.md, section 9)."""
    eps = float(np.finfo(np.float32).eps)
    return 4 * eps * math.sqrt(enc.d_ff) * (enc.num_layers + 1) * largest


def check(
    ours: tuple[np.ndarray, np.ndarray],
    theirs: tuple[np.ndarray, np.ndarray],
    mask_BxL: np.ndarray,
    head_w_DxC: np.ndarray,
    enc: bert.Config,
) -> dict:
    """Max differences of hidden states (real tokens) and logits against their tolerances.
    The logits' bound carries the hidden states' through mean pooling (which cannot grow it)
    and the head (at most the sum of |w| over D per class)."""
    (h_ours, l_ours), (h_theirs, l_theirs) = ours, theirs
    real = np.asarray(mask_BxL, bool)
    largest = float(np.abs(h_ours[real]).max())
    d_hidden = float(np.abs(h_ours - h_theirs)[real].max())
    d_logits = float(np.abs(np.asarray(l_ours) - np.asarray(l_theirs)).max())
    tol_hidden = tolerance(enc, largest)
    tol_logits = tol_hidden * float(np.abs(head_w_DxC).sum(0).max())
    return {
        "max_abs_hidden": d_hidden,
        "tolerance_hidden": tol_hidden,
        "largest_abs_hidden": largest,
        "max_abs_logits": d_logits,
        "tolerance_logits": tol_logits,
        # NaN compares False: a peer that yields NaN disagrees.
        "agrees": bool(d_hidden <= tol_hidden and d_logits <= tol_logits),
    }


def compare(calls: dict[str, Callable[[], Any]], rounds: int) -> dict:
    """Each call's first-call seconds (compiling), then `rounds` interleaved rounds after one
    more untimed call each: per side the per-round seconds and their median, per peer the
    median and quartiles of the per-round ratios attn / peer."""
    first = {name: t[0] for name, t in timing.time_interleaved(calls, 1).items()}
    timing.time_interleaved(calls, 1)  # lazily made state (optimizer moments) in place
    times = timing.time_interleaved(calls, rounds)
    out = {"rounds": rounds}
    for name, ts in times.items():
        out[name] = {"median_s": statistics.median(ts), "first_call_s": first[name], "times_s": ts}
        if name != "attn":
            ratios = [a / p for a, p in zip(times["attn"], ts, strict=True)]
            out[name]["ratio"] = statistics.median(ratios)
            out[name]["ratio_quartiles"] = _quartiles(ratios)
    return out


def _quartiles(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [xs[0], xs[0]]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return [q[0], q[2]]


def cold_starts(codes: dict[str, str], bert_dir: str, ids: np.ndarray, rounds: int) -> dict:
    """Wall seconds of a new Python process that loads the checkpoint and encodes `ids`, per
    side (the interpreter, imports, loading, compiling and the encode), interleaved."""
    times: dict[str, list[float]] = {name: [] for name in codes}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ids.npy")
        np.save(path, ids)
        for _ in range(rounds):
            for name, code in codes.items():
                if name in failed:
                    continue
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", code, bert_dir, path],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                if done.returncode:
                    lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
                    failed[name] = lines[-1]
                    continue
                times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {"rounds": rounds, "shape": list(ids.shape)}
    for name, ts in times.items():
        if name in failed:
            out[name] = {"skipped": f"failed: {failed[name]}"}
            continue
        out[name] = {"median_s": statistics.median(ts), "times_s": ts}
    if "attn" in failed:
        return out
    for name in times:
        if name != "attn" and "times_s" in out[name]:
            ratios = [a / p for a, p in zip(times["attn"], times[name], strict=True)]
            out[name]["ratio"] = statistics.median(ratios)
            out[name]["ratio_quartiles"] = _quartiles(ratios)
    return out


def build_peers(setup: Setup, names) -> tuple[dict[str, Side], dict[str, str]]:
    """The peers that build, and for the others the reason."""
    sides, skipped = {}, {}
    for name in names:
        try:
            sides[name] = PEERS[name](setup)
        except ImportError as e:
            skipped[name] = f"not installed ({e.name or e}): pip install -r requirements-peers.txt"
        except Exception as e:  # an optional framework's own failure is reported, not fatal
            traceback.print_exc()
            skipped[name] = f"failed to build: {type(e).__name__}: {str(e).splitlines()[0]}"
        if name in skipped:
            print(f"peers: {name} skipped: {skipped[name]}", file=sys.stderr)
    return sides, skipped


def run(quick: bool, bert_dir: str) -> dict:
    """The peers section of results.json."""
    if not bert_dir:
        raise UserError("peers needs --bert_dir=DIR (a BERT model directory every side loads)")
    shapes = QUICK["train"] if quick else TRAIN_SHAPES
    serve_shape = QUICK["serve"] if quick else SERVE_SHAPE
    rounds = QUICK["rounds"] if quick else ROUNDS
    cold_rounds = QUICK["cold_rounds"] if quick else COLD_ROUNDS
    load_before = os.getloadavg()
    max_len = max(length for _, length in (*shapes, serve_shape))
    ours, setup = attn_side(bert_dir, max_len)
    enc = setup.encoder
    peers, skipped = build_peers(setup, list(PEERS))
    serve_batch = make_batch(enc.vocab_size, *serve_shape, seed=1)
    ids, mask = serve_batch["tokens"], serve_batch["mask"]
    reference = ours.forward(ids, mask)
    numerics = {}
    for name, side in list(peers.items()):
        numerics[name] = check(reference, side.forward(ids, mask), mask, setup.head_w_DxC, enc)
        n = numerics[name]
        print(
            f"peers: {name} vs attn: hidden {n['max_abs_hidden']:.2e} (tolerance "
            f"{n['tolerance_hidden']:.2e}), logits {n['max_abs_logits']:.2e} (tolerance "
            f"{n['tolerance_logits']:.2e})" + ("" if n["agrees"] else ": DISAGREES, not timed")
        )
        if not n["agrees"]:
            del peers[name]
    sides = {"attn": ours, **peers}
    train_rows = []
    for i, (batch_size, length) in enumerate(shapes):
        batch = make_batch(enc.vocab_size, batch_size, length, seed=10 + i)
        calls = {name: s.train(batch) for name, s in sides.items() if s.train is not None}
        row = {"batch": batch_size, "L": length, **compare(calls, rounds)}
        train_rows.append(row)
        _print_row("train", row)
    serve = {
        "batch": serve_shape[0],
        "L": serve_shape[1],
        **compare({name: s.serve(serve_batch) for name, s in sides.items()}, rounds),
    }
    _print_row("serve", serve)
    codes = {name: s.cold_start for name, s in sides.items() if s.cold_start}
    cold = cold_starts(codes, bert_dir, ids, cold_rounds)
    return {
        "bert_dir": bert_dir,
        "model": os.path.basename(os.path.normpath(bert_dir)),
        "encoder": dataclasses.asdict(enc),
        "recipe": dataclasses.asdict(setup.recipe),
        "threads": setup.threads,
        "sides": {
            name: {"version": s.version, "threads": s.threads, "note": s.note}
            for name, s in sides.items()
        },
        "skipped": skipped,
        "numerics": numerics,
        "train": train_rows,
        "serve": serve,
        "cold_start": cold,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "peak_rss_bytes": timing.peak_rss_bytes(),
    }


def _print_row(kind: str, row: dict) -> None:
    parts = [f"attn {row['attn']['median_s']:.3f} s"]
    for name, r in row.items():
        if isinstance(r, dict) and "ratio" in r:
            parts.append(f"{name} {r['median_s']:.3f} s (attn/{name} {r['ratio']:.2f})")
    print(f"peers {kind} {row['batch']}x{row['L']}: " + ", ".join(parts))
