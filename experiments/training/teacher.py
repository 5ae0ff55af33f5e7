"""A distillation run's teacher (`distill.teacher`): a trained workdir (a fine-tuned encoder, or any
classifier this project trained) or a transformers sequence classifier (a directory or hub id,
what `predict --pretrained` serves), read as serving reads it; and its logits over a transfer set,
computed once and kept in the student's workdir.

`load` refuses, each in one line: a teacher that does not exist or is no classifier, one whose
labels are not the data's (naming what each has that the other lacks; the same labels in another
order are reordered), one whose tokenizer cannot read the data (most of its tokens unknown: an
English-only vocabulary on Chinese), and one that cannot pair with the student (the student's own
workdir, or a workdir trained on other data, whose training texts may be the student's
validation and test texts).

`outputs` gives the teacher's logits over texts: its served batched forward (predict --path's,
at its own batch size, with a progress bar), each text read as the teacher was trained to read
it. A served classifier gives probabilities; their logs are the logits less a constant per text,
which the distillation losses ignore. They are kept in WORKDIR/OUTPUTS with what they were
computed from: the teacher's path and a hash of its files (config, tokenizer, served
checkpoint), its labels, and a hash of each text. A rerun (a resumed run) reads them back; a text
the file lacks is computed and one it has no longer is dropped, and a changed teacher
recomputes them all.
"""

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import ml_collections
import numpy as np

from attn import encoders
from experiments import parallel, serving
from experiments.data import encoding, tokenizers
from experiments.data.transfer import MASK
from experiments.errors import UserError
from experiments.training import checkpoints, classify, workdir_reader

OUTPUTS = "teacher_outputs.npz"
MAX_UNKNOWN = 0.1  # share of the training texts' tokens a teacher may read as unknown
_SAMPLE = 2000  # training texts whose tokens are counted for that
_MASKS = ("[MASK]", "<mask>")  # the families' mask tokens
_TINY = np.finfo(np.float32).tiny  # a probability that underflowed to 0: its log stays finite


@dataclasses.dataclass(frozen=True)
class Teacher:
    path: str  # as distill.teacher names it
    trained: serving.Trained
    fingerprint: str  # sha256 of the files that decide its outputs
    order_C: np.ndarray  # int [C]: the teacher's class of each of the data's classes
    mask: str  # what a masked unit (`transfer.MASK`) is written as for its tokenizer

    def describe(self) -> str:
        return f"teacher: {self.trained.source}"


def load(
    path: str,
    *,
    workdir: str,
    data: ml_collections.ConfigDict,
    label_names: Sequence[str],
    train_texts: Sequence[str],
) -> Teacher:
    """The teacher `path` for a student trained in `workdir` on config.data `data` (labels
    `label_names`, training texts `train_texts`); UserError in one line for each refusal in the
    module docstring."""
    named = f"distill.teacher={path!r}"
    if os.path.realpath(path) == os.path.realpath(workdir):
        raise UserError(f"{named} is the student's own workdir; a teacher is another, trained run")
    if _is_workdir(path):
        held = workdir_reader.read(path, named=named)
        if held.objective == checkpoints.MASKED_LM:
            raise UserError(
                f"{named} is a pretraining workdir: it predicts hidden tokens, not labels; a "
                "teacher is a classifier (a fine-tuned or trained workdir)"
            )
        _check_same_data(named, held.config.data, data)
        trained = serving.load(path)
        files = _workdir_files(held)
    else:
        try:
            trained = serving.load_pretrained(path)
            directory = encoders.open_checkpoint(path).directory
        except (UserError, encoders.CheckpointError) as e:
            why = str(e).removeprefix("--pretrained: ")
            if not os.path.exists(path):  # a directory that is not there, or a hub id
                raise UserError(f"{named} does not exist ({why})") from None
            raise UserError(
                f"{named} is neither a trained workdir nor a sequence classifier: {why}"
            ) from None
        files = sorted(p for p in directory.iterdir() if p.is_file())
    order = _order(named, trained.label_names, tuple(label_names))
    _check_reads(named, trained.tokenizer, train_texts)
    return Teacher(path, trained, _hash_files(files), order, _mask_text(trained.tokenizer))


def _is_workdir(path: str) -> bool:
    """Whether `path` is a training workdir (it holds checkpoints), not a model directory."""
    return any(os.path.isdir(os.path.join(path, d)) for d in (checkpoints.LAST, checkpoints.BEST))


def _check_same_data(
    named: str, theirs: ml_collections.ConfigDict, ours: ml_collections.ConfigDict
):
    """A workdir teacher must have been trained on the student's data: the splits are the same
    only then, and a teacher trained on the student's validation or test texts would pass its
    knowledge of them on."""

    def source(d: ml_collections.ConfigDict) -> str:
        path = d.get("path") or ""
        return f"{d.dataset} {os.path.realpath(path)}" if path else d.dataset

    if source(theirs) != source(ours):
        where = lambda d: (
            f"data.path={d.path!r}" if d.get("path") else f"data.dataset={d.dataset!r}"
        )
        raise UserError(
            f"{named} was trained on {where(theirs)}, the student on {where(ours)}: the teacher "
            "may have learnt the student's validation and test texts; use a teacher trained on "
            "the student's data"
        )


def _order(named: str, teacher: tuple[str, ...], data: tuple[str, ...]) -> np.ndarray:
    """The teacher's class index of each of the data's labels; UserError when the two label sets
    differ, naming what each lacks."""
    if set(teacher) != set(data):
        only_t = [n for n in teacher if n not in data]
        only_d = [n for n in data if n not in teacher]
        raise UserError(
            f"{named} has labels {list(teacher)} and the data {list(data)}: the teacher has "
            f"{only_t or 'none'} the data lacks, the data has {only_d or 'none'} the teacher "
            "lacks; a teacher must be trained on the data's labels"
        )
    return np.array([teacher.index(n) for n in data])


def unknown_share(tok: tokenizers.Tokenizer, texts: Sequence[str]) -> float:
    """The share of the tokens of `texts` that `tok` reads as unknown (0 with no tokens)."""
    unk = tok.specials.unk
    ids = [tok.encode(t) for t in texts]
    total = sum(len(x) for x in ids)
    return sum(int(np.sum(x == unk)) for x in ids) / max(total, 1)


def _check_reads(named: str, tok: tokenizers.Tokenizer, texts: Sequence[str]) -> None:
    share = unknown_share(tok, list(texts[:: max(1, len(texts) // _SAMPLE)]))
    if share > MAX_UNKNOWN:
        raise UserError(
            f"{named} cannot read the data: its tokenizer reads {share:.0%} of the training "
            f"texts' tokens as unknown (at most {MAX_UNKNOWN:.0%} may be), a vocabulary of "
            "another language or script; use a teacher trained on text like the data's"
        )


def _mask_text(tok: tokenizers.Tokenizer) -> str:
    """How the teacher's tokenizer is given a masked unit: its mask token where it reads one as a
    single token, else the unknown token's text, else MASK itself (a vocabulary of its own
    reads it as unknown)."""
    if tok.specials.frame is None:  # attn's own tokenizer
        return MASK
    unknown = tok.tokens([tok.specials.unk])
    for text in (*_MASKS, *unknown):
        if len(tok.encode(text)) == 1:
            return text
    return MASK


def _workdir_files(held: workdir_reader.Workdir) -> list[Path]:
    """What decides a workdir's served outputs: its config, its tokenizer's files and the
    checkpoint it serves."""
    root = Path(held.workdir)
    served = root / held.which / str(held.step)
    tok = [root / n for n in ("tokenizer.json", "vocab.txt")]
    tok += sorted(p for p in root.glob("checkpoint_tokenizer/*") if p.is_file())
    kept = sorted(p for p in served.rglob("*") if p.is_file())
    return [root / "config.json", *(p for p in tok if p.is_file()), *kept]


def _hash_files(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def text_keys(texts: Sequence[str]) -> np.ndarray:
    """bytes [N]: each text's sha1, hex: what the outputs file keys a text by."""
    return np.array(
        [hashlib.sha1(t.encode("utf-8", "surrogatepass")).hexdigest() for t in texts], "S40"
    )


def logits(teacher: Teacher, texts: Sequence[str]) -> np.ndarray:
    """float32 [N, C]: the teacher's logits (log-probabilities) over `texts`, in the data's
    class order; masked units written as its tokenizer reads them, texts converted as its run
    converted its own (data.convert)."""
    t = teacher.trained
    tok, data, add_cls = t.tokenizer, t.config.data, t.cfg.pooling == "cls"
    texts = serving.converted(t, list(texts))[0]
    raw = [tok.encode(text.replace(MASK, teacher.mask)) for text in texts]
    frame = tok.specials.frame
    ids = encoding.cut(
        raw, max_len=t.cfg.max_len, add_cls=add_cls, tail_len=data.tail_len, frame=frame
    )
    dp = parallel.data_parallel(data)
    probs_NxC, _ = classify.probabilities(
        parallel.replicate(t.params, dp),
        t.cfg,
        ids,
        np.zeros(len(ids), np.int32),
        data=data,
        dp=dp,
        bag_ids=encoding.bag_cut(raw, data, add_cls, frame),
        desc="teacher",
    )
    return np.log(np.maximum(probs_NxC[:, teacher.order_C], _TINY)).astype(np.float32)


def outputs(teacher: Teacher, texts: Sequence[str], workdir: str) -> np.ndarray:
    """float32 [N, C]: the teacher's `logits` over `texts`, read back from WORKDIR/OUTPUTS where
    they were computed by this teacher, computed for the rest; the file is rewritten (whole or
    not at all) when it changed."""
    keys = text_keys(texts)
    path = os.path.join(workdir, OUTPUTS)
    about = {
        "teacher": teacher.path,
        "fingerprint": teacher.fingerprint,
        "label_names": [teacher.trained.label_names[i] for i in teacher.order_C],
    }
    known = _read(path, about)
    found = np.array([k in known for k in keys], bool)
    out = np.zeros((len(texts), len(teacher.order_C)), np.float32)
    if found.any():
        out[found] = np.stack([known[k] for k in keys[found]])
    todo = np.flatnonzero(~found)
    if parallel.is_primary():
        said = f"teacher outputs: {int(found.sum()):,} of {len(texts):,} texts read from {path}"
        print(f"{said}, {len(todo):,} to compute ({teacher.describe()})", file=sys.stderr)
    if len(todo):
        out[todo] = logits(teacher, [texts[i] for i in todo])
    if (len(todo) or len(known) != len(set(keys.tolist()))) and parallel.is_primary():
        _write(path, about, keys, out)
    return out


def _read(path: str, about: dict) -> dict[bytes, np.ndarray]:
    """key -> logits [C] of the outputs file, when it was computed from `about`; {} else."""
    if not os.path.exists(path):
        return {}
    try:
        with np.load(path, allow_pickle=False) as f:
            saved = json.loads(str(f["about"]))
            keys, values = f["keys"], f["logits"]
    except (OSError, ValueError, KeyError) as e:
        print(f"teacher outputs: {path} is unreadable ({e}); computing them again", file=sys.stderr)
        return {}
    if saved != about:
        print(
            f"teacher outputs: {path} is of another teacher; computing them again", file=sys.stderr
        )
        return {}
    return dict(zip(keys.tolist(), values, strict=True))


def _write(path: str, about: dict, keys: np.ndarray, values: np.ndarray) -> None:
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, about=np.array(json.dumps(about)), keys=keys, logits=values)
    os.replace(tmp, path)
