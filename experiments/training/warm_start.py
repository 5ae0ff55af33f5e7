"""Where a run's parameters start, other than at random: the encoder of another workdir
(`model.init_from`: a pretraining run or any trained one) and word vectors
(`model.embeddings_from`).

The encoder is what the classifier has before pooling: the token, n-gram and position
embeddings, the encoder blocks and the final LayerNorm. A run started from a workdir takes its
tokenizer too (ids must mean what they meant there), and its encoder's shape: a model field that
differs is refused, naming each, and so is a tokenizer field or length that differs; fields left
to the data take the source's values. Pooling, the head and the bag start afresh.
"""

import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from attn import classifier, models
from experiments import fields, parallel
from experiments.data import tokenizers, vectors
from experiments.errors import UserError
from experiments.training import checkpoints, workdir_reader

ENCODER = ("embed", "final_ln")  # and every "layer_<i>"
TOKENS = ["embed", "tokens"]  # the path of the token embedding table
# The model fields that shape the encoder's parameters or decide what they compute.
ENCODER_FIELDS = (
    "vocab_size",
    "d_model",
    "num_heads",
    "num_layers",
    "d_ff",
    "max_len",
    "positions",
    "score",
    "ngram_buckets",
    "ngram_orders",
)
# config.data fields that make the tokenizer, and the length
_DATA_FIELDS = ("tokenizer", "lowercase", "min_freq", "max_vocab", "max_len")


def is_encoder(name: str) -> bool:
    return name in ENCODER or name.startswith("layer_")


def source(workdir: str) -> workdir_reader.Workdir:
    """The workdir `model.init_from` names; UserError when it is not a usable workdir."""
    named = f"model.init_from={workdir!r}"
    src = workdir_reader.read(workdir, named=named)
    if checkpoints.family_of(src.meta) != models.OWN:
        raise UserError(
            f"{named} fine-tuned a pretrained encoder; start from that checkpoint with "
            "model.pretrained instead"
        )
    return src


def adopt(
    config: ml_collections.ConfigDict, src: workdir_reader.Workdir
) -> ml_collections.ConfigDict:
    """`config` with the source's tokenizer fields and length where it leaves them to the data;
    UserError naming each that it sets otherwise."""
    out = ml_collections.ConfigDict(config.to_dict())
    d, s = out.data, src.config.data
    diff = []
    for field in _DATA_FIELDS:
        if d[field] == s[field]:
            continue
        if d[field] == fields.auto_mark(f"data.{field}"):
            d[field] = s[field]
            if field == "max_len":  # the buckets the data chose with it
                d.buckets = tuple(s.buckets)
        else:
            diff.append(f"data.{field}: {d[field]!r} vs {s[field]!r} there")
    if diff:
        raise UserError(
            f"model.init_from={src.workdir!r} was trained with another tokenizer or length "
            f"({'; '.join(diff)}); use its values or leave them to the data"
        )
    if config.model.get("embeddings_from"):
        raise UserError(
            "model.init_from and model.embeddings_from are both set; the encoder of "
            "init_from already has its embeddings: set one of them"
        )
    out.lock()
    return out


def check_encoder(cfg: classifier.ModelConfig, src: workdir_reader.Workdir) -> None:
    """UserError naming every encoder field of `cfg` that differs from the source's."""
    diff = [
        f"{f}: {getattr(cfg, f)!r} vs {getattr(src.cfg, f)!r} there"
        for f in ENCODER_FIELDS
        if getattr(cfg, f) != getattr(src.cfg, f)
    ]
    if diff:
        raise UserError(
            f"model.init_from={src.workdir!r} holds another encoder ({'; '.join(diff)}); "
            "use its model fields"
        )


def encoder_params(src: workdir_reader.Workdir, params: dict) -> dict:
    """`params` (a fresh classifier's) with the source's encoder in place of their own."""
    encoder = src.weights(is_encoder)
    print(f"encoder from {src.describe()}", file=sys.stderr)
    return {**params, **encoder}


def warm_mask(
    config: ml_collections.ConfigDict, src: workdir_reader.Workdir | None
) -> Callable[[Any], Any] | None:
    """params -> a tree of bools marking what the run starts from other than at random (the
    source's encoder, the word vectors' table), for `optim.make_optimizer`; None when
    nothing is."""
    vectors = bool(config.model.get("embeddings_from"))
    if src is None and not vectors:
        return None

    def marked(path: tuple, _) -> bool:
        names = [getattr(p, "key", None) for p in path]
        return (src is not None and is_encoder(names[0])) or (vectors and names[:2] == TOKENS)

    return lambda params: jax.tree_util.tree_map_with_path(marked, params)


def word_vectors(
    config: ml_collections.ConfigDict, tok: tokenizers.Tokenizer, ids: Sequence[np.ndarray]
) -> np.ndarray | None:
    """The token embedding table [V, D] from `model.embeddings_from`'s file (None when unset),
    its coverage printed: of the vocabulary and of the tokens of `ids`, the training texts."""
    path = config.model.get("embeddings_from")
    if not path:
        return None
    if not isinstance(tok, tokenizers.VocabTokenizer):
        raise UserError(
            f"model.embeddings_from needs a word or char tokenizer; data.tokenizer is {tok.kind!r}"
        )
    counts_V = np.bincount(np.concatenate([*ids, np.zeros(0, np.int32)]), minlength=tok.vocab_size)
    loaded = vectors.load(
        path,
        tok.vocab,
        config.model.d_model,
        seed=config.train.seed,
        token_counts=counts_V,
        progress=parallel.is_primary(),
    )
    if parallel.is_primary():
        print(loaded.summary(), file=sys.stderr)
    return loaded.table_VxD
