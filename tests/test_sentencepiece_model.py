"""A checkpoint whose only tokenizer file is a SentencePiece spm.model (DeBERTa-v3's layout):
experiments/data/sentencepiece_model.py reads it without the sentencepiece package and gives
transformers' ids, and the checkpoint's tokenizer saved into a workdir reads back the same. The
golden texts' ids are checked for every family in test_encoders.py; the ids here are what
transformers 4.57.6's AutoTokenizer (DebertaV2TokenizerFast) gives for texts that reach the
corners: added tokens inside the text, runs of whitespace, full-width and unknown characters,
lowercasing and punctuation splitting."""

import json
import shutil

import numpy as np
import pytest
from conftest import ROOT

from experiments.data import checkpoint_tokenizer, sentencepiece_model, tokenizers
from experiments.errors import UserError

TINY = ROOT / "tests" / "data" / "encoders" / "tiny_deberta-v2"


def test_the_model_files_pieces_and_settings_are_read():
    m = sentencepiece_model.read(TINY / "spm.model")
    assert m.model_type == "unigram" and m.unk_id == 3 and len(m.pieces) == 173
    # [PAD] [CLS] [SEP] are control pieces (type 3), [UNK] the unknown one (type 2), scored 0.
    assert [p[::2] for p in m.pieces[:4]] == [
        ("[PAD]", 3),
        ("[CLS]", 3),
        ("[SEP]", 3),
        ("[UNK]", 2),
    ]
    assert [p[1] for p in m.pieces[:4]] == [0.0] * 4
    scores = [s for _, s, kind in m.pieces if kind == 1]
    assert all(s < 0 for s in scores)  # unigram log-probabilities
    assert m.charsmap  # the model's own normalization rules (full-width comma, ...)


TRANSFORMERS_IDS = {  # AutoTokenizer(tiny_deberta-v2)(text, add_special_tokens=False)
    "  two  spaces ": [6, 41, 172, 30, 6, 38, 57, 140, 13, 38],
    "x [MASK] y": [6, 3, 173, 6, 103],
    "a [UNK] b": [20, 6, 3, 107],
    "[CLS] hi": [1, 6, 142, 39],
    "ＡＢＣ，full width。": [6, 3, 8, 145, 146, 4, 39, 14, 41, 142, 15],
    "new\nline\ttab": [6, 134, 13, 172, 3, 170, 39, 134, 13, 3, 41, 132, 168],
    "The FILM, was GREAT!": [28, 13, 6, 70, 164, 43, 95, 8, 4, 5, 74, 91, 87, 66, 67, 23],
}
# With tokenizer_config.json {"do_lower_case": true, "split_by_punct": true}.
LOWERCASED_IDS = {
    "The FILM, was GREAT!": [6, 9, 12, 6, 8, 4, 5, 33, 6, 23],
    "I hated it: awful.": [10, 19, 7, 6, 121, 60, 6, 15],
}


def test_ids_are_transformers_ids():
    tok = checkpoint_tokenizer.CheckpointTokenizer(TINY)
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.unk_id, tok.vocab_size) == (0, 1, 2, 3, 174)
    for text, want in TRANSFORMERS_IDS.items():
        assert tok.encode(text).tolist() == want, text
    assert tok.tokens([1, 173, 20]) == ["[CLS]", "[MASK]", "▁a"]


def test_do_lower_case_and_split_by_punct_are_read_from_tokenizer_config(tmp_path):
    d = tmp_path / "lower"
    shutil.copytree(TINY, d)
    config = {"do_lower_case": True, "split_by_punct": True, "vocab_type": "spm"}
    (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = checkpoint_tokenizer.CheckpointTokenizer(d)
    for text, want in LOWERCASED_IDS.items():
        assert tok.encode(text).tolist() == want, text


def test_the_tokenizer_round_trips_through_the_workdir(tmp_path):
    tok = checkpoint_tokenizer.CheckpointTokenizer(TINY)
    workdir = tmp_path / "workdir"
    tok.save(workdir)
    copied = sorted(p.name for p in (workdir / checkpoint_tokenizer.SUBDIR).iterdir())
    # config.json too: AutoTokenizer picks its class by model_type, and export writes from it.
    assert copied == [
        "config.json",
        "special_tokens_map.json",
        "spm.model",
        "tokenizer_config.json",
    ]
    back = tokenizers.load_tokenizer(workdir)
    assert isinstance(back, checkpoint_tokenizer.CheckpointTokenizer)
    text = "The film was great, 7/10!"
    ids = tok.encode(text)
    np.testing.assert_array_equal(back.encode(text), ids)
    assert back.tokens(ids) == tok.tokens(ids) and back.vocab_size == 174
    assert back.decode(ids) == text


def _varint(n: int) -> bytes:
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_a_bpe_model_and_a_broken_file_are_refused_in_one_line(tmp_path):
    d = tmp_path / "bpe"
    shutil.copytree(TINY, d)
    piece = _field(1, b"[UNK]") + _field(3, 2)
    (d / "spm.model").write_bytes(_field(1, piece) + _field(2, _field(3, 2)))  # model_type BPE
    with pytest.raises(UserError, match="is a bpe SentencePiece model; attn reads unigram") as e:
        checkpoint_tokenizer.CheckpointTokenizer(d)
    assert "\n" not in str(e.value)
    (d / "spm.model").write_bytes((TINY / "spm.model").read_bytes()[:-7])  # cut mid-field
    with pytest.raises(UserError, match="is not a SentencePiece model: .* runs past the end") as e:
        checkpoint_tokenizer.CheckpointTokenizer(d)
    assert "\n" not in str(e.value)
    (d / "spm.model").unlink()
    with pytest.raises(UserError, match="has no tokenizer.json, vocab.txt or spm.model"):
        checkpoint_tokenizer.CheckpointTokenizer(d)
