"""A pretrained checkpoint's own tokenizer (data.tokenizer="pretrained"), read with Hugging Face's
`tokenizers` library: the directory's tokenizer.json; else its WordPiece vocab.txt (lowercased
unless its tokenizer_config.json says do_lower_case false); else its SentencePiece spm.model, the
only tokenizer file DeBERTa-v3 checkpoints ship (`sentencepiece_model`: built as transformers
builds it, its special tokens those special_tokens_map.json names).

`encode` gives a text's ids without special tokens; its `specials.frame` is what `encoding.cut`
puts around them, [CLS] ... [SEP], so a cut text keeps both. Ids are attn's: the checkpoint's own
with its padding id and 0 exchanged (`attn.encoder_classifier.to_checkpoint` undoes it inside the
model), so 0 pads whatever the checkpoint pads with (RoBERTa's <pad> is 1, its <s> 0). The shipped
tokenizer.json of many checkpoints pads and truncates to a fixed length by itself; both are
switched off here (truncation is `encoding.cut`'s head + tail, padding the batches').

Saved into a workdir as a copy of the files it was read from (in checkpoint_tokenizer/) beside
attn's tokenizer.json, whose kind "pretrained" tells `tokenizers.load_tokenizer` to read them back.
The checkpoint's config.json is copied with them (CONFIG): transformers' AutoTokenizer picks a
tokenizer class by its model_type, and export writes the fine-tuned model's config from it.
"""

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from attn.encoders import hub
from experiments.data import sentencepiece_model, tokenizers
from experiments.errors import UserError

KIND = "pretrained"
SUBDIR = "checkpoint_tokenizer"  # in a workdir: the copied files
# Every tokenizer file a saved tokenizer may hold, as a hub download fetches them: one tokenizer
# (`_READERS`, tried in order) and, where present, the files that say how to read it.
FILES = hub.TOKENIZER_FILES
CONFIG = "config.json"  # the checkpoint's, saved beside them
# (cls, sep, pad, unk) token names of the families attn.encoders loads, when the files name none.
_NAMES = (("[CLS]", "[SEP]", "[PAD]", "[UNK]"), ("<s>", "</s>", "<pad>", "<unk>"))
BATCH_PAD = 0  # the id attn's batches pad with


class CheckpointTokenizer:
    """A checkpoint's tokenizer, a `tokenizers.Tokenizer`, plus `frame`, `decode` and the special
    ids (attn's ids; `pad_id` is the checkpoint's own)."""

    kind = KIND

    def __init__(self, directory: str | Path, lowercase: bool = False):
        self.directory = Path(directory)
        self.lowercase = bool(lowercase)
        self._hf, self._files = _read(self.directory)
        names = _special_names(self.directory)
        ids = {}
        for role, candidates in names.items():
            found = [self._hf.token_to_id(n) for n in candidates]
            found = [i for i in found if i is not None]
            if not found:
                raise UserError(
                    f"the tokenizer in {str(self.directory)!r} has no {role} token "
                    f"({' or '.join(candidates)})"
                )
            ids[role] = found[0]
        self.pad_id = ids["pad"]
        self.cls_id, self.sep_id, self.unk_id = (
            int(self._exchange(np.array([ids[r]]))[0]) for r in ("cls", "sep", "unk")
        )
        self.specials = tokenizers.Specials(((self.cls_id,), (self.sep_id,)), self.unk_id)

    def _exchange(self, ids: np.ndarray) -> np.ndarray:
        """The checkpoint's ids <-> attn's: its padding id and 0 exchanged (an involution)."""
        if self.pad_id == BATCH_PAD:
            return ids
        return np.where(ids == BATCH_PAD, self.pad_id, np.where(ids == self.pad_id, BATCH_PAD, ids))

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def frame(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(ids before, ids after) a text: ([CLS], [SEP])."""
        return self.specials.frame

    @property
    def special_ids(self) -> frozenset[int]:
        return self.specials.silent

    def encode(self, text: str) -> np.ndarray:
        return self._ids(self._encoded(text)[1])

    def encode_words(self, text: str) -> tokenizers.Pieces:
        """`encode`'s ids and the tokenizer's own words, as the text writes them ("toaster" for
        "toast" "##er"; BERT's split punctuation off), lowercased when the tokenizer is."""
        text, enc = self._encoded(text)
        spans: dict[int, tuple[int, int]] = {}
        for w, (start, end) in zip(enc.word_ids, enc.offsets, strict=True):
            s, e = spans.get(w, (start, end))
            spans[w] = (min(s, start), max(e, end))
        number = {w: n for n, w in enumerate(spans)}  # in the order the words come
        word_n = np.array([number[w] for w in enc.word_ids], np.int32)
        return tokenizers.Pieces(
            self._ids(enc), word_n, tuple(text[slice(*s)] for s in spans.values())
        )

    def _encoded(self, text: str) -> tuple[str, Any]:
        """`text` as the tokenizer reads it (lowercased when it lowercases) and the library's
        encoding of it."""
        text = text.lower() if self.lowercase else text
        return text, self._hf.encode(text, add_special_tokens=False)

    def _ids(self, enc: Any) -> np.ndarray:
        return self._exchange(np.array(enc.ids, np.int32))

    def tokens(self, ids: Iterable[int]) -> list[str]:
        own = self._exchange(np.array(list(ids), np.int64))
        unk = self._hf.id_to_token(int(self._exchange(np.array([self.unk_id]))[0]))  # its own
        return [self._hf.id_to_token(int(i)) or unk for i in own]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens left out (the library's own decoding)."""
        own = self._exchange(np.array(list(ids), np.int64))
        return self._hf.decode([int(i) for i in own], skip_special_tokens=True)

    def save(self, directory: str | Path) -> None:
        """Copies the files it was read from (and the checkpoint's config.json) into
        DIRECTORY/checkpoint_tokenizer/ and writes DIRECTORY/tokenizer.json saying so."""
        d = Path(directory)
        sub = d / SUBDIR
        sub.mkdir(parents=True, exist_ok=True)
        for name in self._files:
            shutil.copyfile(self.directory / name, sub / name)
        if (self.directory / CONFIG).is_file():
            shutil.copyfile(self.directory / CONFIG, sub / CONFIG)
        meta = {
            "format": 1,
            "kind": KIND,
            "lowercase": self.lowercase,
            "vocab_size": self.vocab_size,
            "directory": SUBDIR,
            "special_ids": {  # attn's ids; the checkpoint's own padding id
                "cls": self.cls_id,
                "sep": self.sep_id,
                "pad": self.pad_id,
                "unk": self.unk_id,
            },
        }
        (d / "tokenizer.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def for_config(config: Any) -> CheckpointTokenizer:
    """model.pretrained's tokenizer (a directory, or a hub id downloaded as `attn.encoders.load`
    downloads one), lowercasing first as data.lowercase asks."""
    directory = config.model.get("pretrained")
    if not directory:
        raise UserError(
            "data.tokenizer=pretrained reads the tokenizer of model.pretrained, which is empty: "
            "set --config.model.pretrained=DIR"
        )
    try:
        local = hub.local_dir(directory)
    except hub.CheckpointError as e:
        raise UserError(f"model.pretrained: {e}") from None
    if not (local / "config.json").is_file():
        raise UserError(
            f"model.pretrained={directory!r} has no config.json: not a Hugging Face model directory"
        )
    return CheckpointTokenizer(local, config.data.lowercase)


def load_saved(directory: str | Path, meta: dict) -> CheckpointTokenizer:
    """What `CheckpointTokenizer.save` wrote into `directory` (meta: its tokenizer.json)."""
    tok = CheckpointTokenizer(Path(directory) / meta["directory"], meta.get("lowercase", False))
    if tok.vocab_size != meta["vocab_size"]:
        raise UserError(
            f"the tokenizer in {str(directory)!r} has {tok.vocab_size} ids, its tokenizer.json "
            f"says {meta['vocab_size']}"
        )
    return tok


def _read(directory: Path):
    """(the library's tokenizer, padding and truncation off; the files it came from)."""
    try:
        import tokenizers as hf
    except ImportError:
        raise UserError(
            "a checkpoint's tokenizer needs Hugging Face's tokenizers: pip install tokenizers"
        ) from None
    name = next((n for n in _READERS if (directory / n).is_file()), None)
    if name is None:
        raise UserError(
            f"{str(directory)!r} has no tokenizer.json, vocab.txt or spm.model: the checkpoint's "
            "tokenizer is needed to fine-tune it"
        )
    tok = _READERS[name](hf, directory)
    tok.no_padding()
    tok.no_truncation()
    return tok, [name, *(n for n in _EXTRA if (directory / n).is_file())]


def _from_json(hf: Any, directory: Path) -> Any:
    try:
        return hf.Tokenizer.from_file(str(directory / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 (the library raises its own types)
        raise UserError(f"cannot read {directory / 'tokenizer.json'}: {e}") from None


def _from_wordpiece(hf: Any, directory: Path) -> Any:
    lower = _config(directory).get("do_lower_case", True)
    return hf.implementations.BertWordPieceTokenizer(
        str(directory / "vocab.txt"), lowercase=bool(lower)
    )


def _from_sentencepiece(hf: Any, directory: Path) -> Any:
    config = _config(directory)
    return sentencepiece_model.tokenizer(
        directory / "spm.model",
        _named_specials(directory),
        lowercase=bool(config.get("do_lower_case", False)),
        split_by_punct=bool(config.get("split_by_punct", False)),
    )


# The tokenizer files, in the order they are tried; the other FILES say how to read them and are
# copied beside the one read.
_READERS = {
    "tokenizer.json": _from_json,
    "vocab.txt": _from_wordpiece,
    "spm.model": _from_sentencepiece,
}
_EXTRA = tuple(n for n in FILES if n not in _READERS)


def _config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    return obj if isinstance(obj, dict) else {}


def _named(directory: Path) -> dict:
    """tokenizer_config.json updated by special_tokens_map.json (each {} when absent)."""
    named = _config(directory)
    path = directory / "special_tokens_map.json"
    if path.is_file():
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read {path}: {e}") from None
        named = {**named, **found} if isinstance(found, dict) else named
    return named


def _token_name(given: Any) -> str | None:
    if isinstance(given, dict):  # {"content": "[CLS]", ...}
        given = given.get("content")
    return given if isinstance(given, str) else None


# The special tokens transformers registers, in the order it adds those a vocabulary lacks, and
# DeBERTa-v2's names for them (its tokenizer's defaults) when the files name none.
_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_DEBERTA = ("[CLS]", "[SEP]", "[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]")


def _named_specials(directory: Path) -> list[str]:
    """The special tokens a SentencePiece checkpoint's files name (DeBERTa's when they name
    none), in the order transformers adds them, additional_special_tokens last."""
    named = _named(directory)
    out = [_token_name(named.get(f"{r}_token")) or d for r, d in zip(_ROLES, _DEBERTA, strict=True)]
    extra = named.get("additional_special_tokens")
    out += [n for n in map(_token_name, extra if isinstance(extra, list) else []) if n]
    return out


def _special_names(directory: Path) -> dict[str, tuple[str, ...]]:
    """role -> token names to look up: the one the files name first, then the families'."""
    named = _named(directory)
    out = {}
    for n, role in enumerate(("cls", "sep", "pad", "unk")):
        given = _token_name(named.get(f"{role}_token"))
        out[role] = tuple(dict.fromkeys([given] if isinstance(given, str) else []).keys()) + tuple(
            names[n] for names in _NAMES if names[n] != given
        )
    return out
