"""Tokenizers: round trips, vocabulary rules, word splitting, save/load and corrupt files."""

import json

import numpy as np
import pytest

from experiments.data import tokenizers as T
from experiments.errors import UserError

TEXTS = [
    "",
    "Hello, world!",
    "这本书很好看。😀👍🏽",
    "mixed 文字 and ελληνικά, русский, العربية, 日本語のテキスト",
    "tabs\tand\nnewlines\r\nand \\ backslash \x00 nul",
    "x" * 100_000,
]


def _build(kind, texts=TEXTS, **kw):
    args = dict(lowercase=False, min_freq=1, max_vocab=0)
    args.update(kw)
    return T.build_tokenizer(kind, texts, **args)


@pytest.mark.parametrize("text", TEXTS)
def test_byte_round_trip(text):
    tok = _build("byte")
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and tok.vocab_size == 259
    assert ids.min(initial=3) >= 3 and ids.max(initial=3) < 259
    assert bytes((ids - 3).astype(np.uint8)).decode("utf-8") == text


@pytest.mark.parametrize("text", TEXTS)
def test_char_round_trip(text):
    tok = _build("char")
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and len(ids) == len(text)  # one id per code point
    assert T.UNK not in ids and (ids >= 3).all()
    assert "".join(tok.tokens(ids)) == text


def test_char_emoji_and_cjk_are_single_tokens_and_unknown_is_unk():
    tok = _build("char")
    assert len(tok.encode("😀")) == 1 and len(tok.encode("这本书")) == 3
    assert tok.encode("Z🙃").tolist() == [T.UNK, T.UNK]


def test_vocab_min_freq_max_vocab_order_and_lowercase():
    texts = ["aaaa", "bbb", "cc", "d", "AB"]
    tok = _build("char", texts, min_freq=2)
    assert tok.vocab == (*T.RESERVED, "a", "b", "c")  # counts: a 4, b 3, c 2; d, A, B once
    tok = _build("char", texts, min_freq=1, max_vocab=5)
    assert tok.vocab == (*T.RESERVED, "a", "b")
    low = _build("char", texts, lowercase=True, min_freq=1)
    assert low.vocab[3:5] == ("a", "b") and "A" not in low.vocab
    assert low.encode("AB").tolist() == low.encode("ab").tolist() != [T.UNK, T.UNK]


def test_word_split():
    assert T.split_words("Hello, world! 我喜欢这本书。It's 3.5 😀") == [
        "Hello", ",", "world", "!", "我", "喜", "欢", "这", "本", "书", "。",
        "It", "'", "s", "3", ".", "5", "😀",
    ]  # fmt: skip
    tok = _build("word", ["The film was GREAT, great!"], lowercase=True)
    assert tok.tokens(tok.encode("great film, awful")) == ["great", "film", ",", "<unk>"]


def test_byte_tokens_display():
    tok = _build("byte")
    assert tok.tokens([0, 1, 2] + (tok.encode("a é\n")).tolist()) == [
        "<pad>", "<unk>", "<cls>", "a", " ", "\\xc3", "\\xa9", "\\x0a",
    ]  # fmt: skip


@pytest.mark.parametrize("kind", T.KINDS)
def test_save_load_round_trip(kind, tmp_path):
    texts = TEXTS + ["\\u000041 literal escape-like text", " \u2028 \x85 \u3000 "]
    tok = _build(kind, texts, lowercase=True)
    tok.save(tmp_path)
    back = T.load_tokenizer(tmp_path)
    assert back == tok and back.kind == kind and back.vocab_size == tok.vocab_size
    for t in texts:
        np.testing.assert_array_equal(back.encode(t), tok.encode(t))
    # vocab.txt: one line per id, whitespace and backslash escaped.
    lines = (tmp_path / "vocab.txt").read_text("utf-8").split("\n")[:-1]
    assert len(lines) == tok.vocab_size and lines[:3] == list(T.RESERVED)
    assert all(line and not any(c.isspace() for c in line) for line in lines)


@pytest.mark.parametrize("s", ["\n", "\t", "\\", "\\u00000a", "a\\nb", "\r\n", "\u2028", " x "])
def test_escape_round_trip(s):
    assert "\n" not in T.escape(s) and T.unescape(T.escape(s)) == s


def _saved_char(tmp_path):
    _build("char", ["abc", "abd"]).save(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "corrupt, match",
    [
        (lambda d: (d / "vocab.txt").unlink(), "no vocab.txt"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
        (lambda d: (d / "tokenizer.json").write_text("{not json"), "corrupt"),
        (lambda d: (d / "tokenizer.json").write_text(json.dumps({"kind": "char"})), "corrupt"),
        (lambda d: (d / "vocab.txt").write_text("<pad>\n<unk>\n<cls>\na\n"), "vocab.txt has 4"),
        (
            lambda d: (d / "vocab.txt").write_bytes(b"<pad>\n<unk>\n<cls>\na\n\xff\nc\nd\n"),
            "corrupt",
        ),
        (lambda d: (d / "vocab.txt").write_text("<pad>\n<unk>\n<cls>\na\nb\nc\nc\n"), "duplicate"),
        (lambda d: (d / "vocab.txt").write_text("<pad>\n<unk>\n<cls>\na\nb\\q\nc\nd\n"), "escape"),
        (lambda d: (d / "vocab.txt").write_text("<pad>\n<unk>\n<cls>\na\nb\nc\nd"), "newline"),
        (lambda d: (d / "vocab.txt").write_text("a\n<unk>\n<cls>\n<pad>\nb\nc\nd\n"), "start"),
    ],
)
def test_corrupt_files_raise_user_error(tmp_path, corrupt, match):
    d = _saved_char(tmp_path)
    assert T.load_tokenizer(d).vocab_size == 7
    corrupt(d)
    with pytest.raises(UserError, match=match):
        T.load_tokenizer(d)


def test_missing_directory_and_bad_arguments(tmp_path):
    with pytest.raises(UserError, match="no tokenizer.json"):
        T.load_tokenizer(tmp_path / "nothing")
    with pytest.raises(UserError, match="data.tokenizer='bpe'"):
        _build("bpe")
    with pytest.raises(UserError, match="data.min_freq"):
        _build("char", min_freq=0)
    with pytest.raises(UserError, match="data.max_vocab"):
        _build("word", max_vocab=2)
