"""A fine-tuned workdir's model, exported (`hub_dir.write`): its served weights (the weight average
when the run kept one; never the optimizer state), label names, tokenizer files, the pretrained
checkpoint's config.json and the test accuracy its run measured. A workdir of attn's own model
(trained from scratch, or distilled) is written by `jax_dir.write` instead.

The checkpoint's config.json is kept in the workdir beside its tokenizer files
(checkpoint_tokenizer/config.json); a workdir trained before that reads it from model.pretrained
while that directory still holds it.
"""

import os
import pathlib

from attn import encoders, models
from experiments import workdirs
from experiments.data import checkpoint_tokenizer
from experiments.errors import UserError
from experiments.exporting import hub_dir, jax_dir, onnx_file
from experiments.training import checkpoints, workdir_reader


def _base_config(held: workdir_reader.Workdir) -> dict:
    """The pretrained checkpoint's config.json: the workdir's copy, else model.pretrained's when
    it is the same model type; UserError in one line saying how to give it otherwise."""
    saved = pathlib.Path(held.workdir, checkpoint_tokenizer.SUBDIR, checkpoint_tokenizer.CONFIG)
    if saved.is_file():
        return workdirs.read_json(str(saved))
    pretrained = held.config.model.get("pretrained") or ""
    source = pathlib.Path(pretrained, "config.json")
    if pretrained and source.is_file():
        base = workdirs.read_json(str(source))
        family = encoders.family(held.cfg.encoder)
        if base.get("model_type") in family.model_types:
            return base
    raise UserError(
        f"{held.workdir!r} keeps no copy of its pretrained checkpoint's config.json (a workdir "
        f"trained before export existed), and model.pretrained={pretrained!r} no longer holds "
        f"it: copy that checkpoint's config.json to {saved}"
    )


def _test_result(workdir: str) -> dict | None:
    path = os.path.join(workdir, "eval_test.json")
    return workdirs.read_json(path) if os.path.exists(path) else None


def export(workdir: str, out: str | os.PathLike, *, onnx: bool = False) -> pathlib.Path:
    """Writes the workdir's best checkpoint (its last before any evaluation) at `out` (with
    model.onnx beside the weights when `onnx`, `onnx_file`); returns it. UserError in one line
    for a pretraining workdir, a run that converted its texts (data.convert), an `out` that
    holds files, --onnx without what it needs or for attn's own model, and what `hub_dir.write`
    refuses."""
    out = pathlib.Path(out)
    hub_dir.check_out(out)
    if onnx:
        onnx_file.check_available()
    held = workdir_reader.read(workdir)
    if held.objective == checkpoints.MASKED_LM:
        raise UserError(
            f"{workdir!r} is a pretraining workdir: it predicts hidden tokens, not labels; "
            f"fine-tune it first (experiments.train --config.model.init_from={workdir})"
        )
    if held.config.data.convert:  # an exported model reads what it is given, unconverted
        raise UserError(
            f"{workdir!r} converted every text with OpenCC (data.convert="
            f"{held.config.data.convert!r}) before its model read it, which an exported model "
            "cannot do: it would read texts unconverted"
        )
    if models.family(held.cfg) == models.OWN:
        if onnx:
            raise UserError(
                f"--onnx: {workdir!r} holds attn's own model, which export writes with "
                "jax.export only; export without --onnx"
            )
        card = jax_dir.model_card(held, _test_result(workdir), str(out))
        return jax_dir.write(held, out, card)
    base = _base_config(held)
    tokenizer = hub_dir.Tokenizer(
        pathlib.Path(workdir, checkpoint_tokenizer.SUBDIR), held.tokenizer.lowercase
    )
    model = hub_dir.Model(held.weights(), held.cfg, held.label_names)
    served = "its weight average" if held.served == "ema" else "its weights"
    card = hub_dir.Card(
        base=str(held.config.model.pretrained),
        model_type=str(base.get("model_type")),
        trained=f"{held.describe()}, {served}",
        test=_test_result(workdir),
        tail_len=int(held.config.data.tail_len),
        where=str(out),
    )
    then = onnx_file.write if onnx else None
    return hub_dir.write(out, model, base, tokenizer, hub_dir.model_card(model, card), then=then)
