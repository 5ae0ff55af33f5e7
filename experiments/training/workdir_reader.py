"""A trained workdir read back: its config, the checkpoint it offers (which, step, meta), the model
config and tokenizer that checkpoint was trained with, its label names, the scripts of its training
texts, and its served weights restored on demand. The one reader of a workdir, for serving
(evaluate, predict, visualize, faithfulness), warm start (`model.init_from`) and export; what each
makes of it (a pretraining run refused by serving, a fine-tuned one by warm start) is theirs.
"""

import dataclasses
import os
from collections.abc import Callable

import jax
import ml_collections

from attn import models
from experiments import workdirs
from experiments.data import scripts, tokenizers
from experiments.errors import UserError
from experiments.training import checkpoints

# Shapes only: init runs under jax.eval_shape. Not a key made at import, which would start JAX's
# backend before a process of several can join the others.
KEY = jax.ShapeDtypeStruct((2,), jax.numpy.uint32)


@dataclasses.dataclass(frozen=True)
class Workdir:
    """What a trained workdir holds; `weights` reads the served weights of its checkpoint."""

    workdir: str
    config: ml_collections.ConfigDict  # config.json, fields it predates as its run used them
    meta: dict  # the checkpoint's (`checkpoints.new_meta`): objective, family, model, ema, ...
    cfg: models.AnyConfig  # the model config the meta records, of its family
    tokenizer: tokenizers.Tokenizer
    which: str  # checkpoints.BEST, or LAST for a run stopped before its first evaluation
    step: int
    scripts: dict | None  # `scripts.script_shares` of its training texts; None: older workdirs

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(self.meta["label_names"])

    @property
    def objective(self) -> str:
        return self.meta.get("objective", checkpoints.CLASSIFIER)

    @property
    def served(self) -> str:
        """The state entry that is served: "ema" when the run kept a weight average, else
        "params"."""
        return "ema" if self.meta.get("ema", False) else "params"

    def describe(self) -> str:
        """E.g. "the best checkpoint (step 60) of runs/x"."""
        kind = "best" if self.which == checkpoints.BEST else "last"
        return f"the {kind} checkpoint (step {self.step}) of {self.workdir}"

    def weights(self, keep: Callable[[str], bool] | None = None) -> dict:
        """The served weights (the model's params, or their average), restored alone: no optimizer
        state is read or built. `keep(name)` picks the top-level entries to read (all: None); a
        pretraining checkpoint's head, which no model config describes, is never read."""
        init = models.module(self.cfg).init
        shapes = jax.eval_shape(lambda key: init(key, self.cfg), KEY)
        target = {k: v for k, v in shapes.items() if keep is None or keep(k)}
        with checkpoints.reader(self.workdir, self.which) as mngr:
            state, _ = checkpoints.restore(mngr, self.step, {self.served: target}, partial=True)
        return state[self.served]


def read(workdir: str, which: str = checkpoints.BEST, *, named: str | None = None) -> Workdir:
    """The workdir's `which` checkpoint (BEST falls back to LAST before any evaluation) and what
    it was trained with; UserError in one line, naming the workdir as `named` (default "workdir
    'DIR'"), when it is missing, has no config.json or checkpoint, or is inconsistent."""
    named = named or f"workdir {workdir!r}"
    if not os.path.isdir(workdir):
        raise UserError(f"{named} does not exist; train first with experiments.train")
    config_path = os.path.join(workdir, "config.json")
    if not os.path.exists(config_path):
        raise UserError(f"{named} has no config.json; is it a training workdir?")
    config = workdirs.read_config(config_path)
    which, step = checkpoints.kept(workdir, which)
    if step is None:
        raise UserError(f"{named} holds no checkpoint yet; train (or resume) first")
    with checkpoints.reader(workdir, which) as mngr:
        meta = checkpoints.read_meta(mngr, step)
    cfg = model_config(meta, f"checkpoint {step} of {named}")
    tok = tokenizers.load_tokenizer(workdir)
    rows = models.vocab_rows(cfg)
    if tok.vocab_size > rows or (tok.vocab_size != rows and models.exact_vocabulary(cfg)):
        raise UserError(
            f"the vocabulary in {named} has {tok.vocab_size} ids but the checkpoint expects "
            f"{rows}; the workdir is inconsistent"
        )
    scripts_path = os.path.join(workdir, scripts.SCRIPTS_FILE)
    shares = workdirs.read_json(scripts_path) if os.path.exists(scripts_path) else None
    return Workdir(workdir, config, meta, cfg, tok, which, step, shares)


def model_config(meta: dict, where: str) -> models.AnyConfig:
    """The model config a checkpoint's meta records (of its family); UserError (naming `where`)
    if unusable."""
    try:
        return models.config(checkpoints.family_of(meta), meta["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{where} has an unusable model config: {e}") from None
