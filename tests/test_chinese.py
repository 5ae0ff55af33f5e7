"""What a Chinese user types, through predict, serving, visualize and the training data pipeline:
full-width punctuation, letters and digits, emoji, Chinese mixed with English, traditional
characters, a review longer than the model reads, --explain's word lists and the CJK font of the
figures. On attn's own model (the `trained` workdir: characters of the embedded Chinese reviews)
and on a fine-tuned BERT whose vocabulary is Chinese characters, as bert-base-chinese's is (one
token per character, do_lower_case false), written in the session's tmp dir."""

import dataclasses
import json
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, _built_once, run_here

from experiments import cli, predict, serving, train
from experiments.data import checkpoint_tokenizer, encoding, tokenizers
from experiments.explain import plots

TINY_BERT = ROOT / "tests" / "data" / "bert" / "tiny_bert"  # 99 ids, 40 positions
SPECIALS = ["[PAD]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# A vocabulary laid out as bert-base-chinese's: specials, punctuation (full-width and ASCII),
# a few lower-case English words and pieces, one emoji, then single Chinese characters, among
# them two traditional ones (這 個) but not 產 or 質, whose simplified forms it has.
LATIN = ["！", "，", "。", "？", "!", ",", ".", "1", "2", "3", "but", "i", "##phone", "👍"]
HAN = (
    "这个手机很好产品质量物流也快评的屏幕电池不行太差了推荐满意书看开头结尾這個"
    "我你他是在有一真非常喜欢失望退货服务态度价格便宜贵用小说内容包装速度"
)
POS = ["质量很好", "很满意", "非常喜欢", "物流也快", "推荐", "服务态度好", "价格便宜"]
NEG = ["质量太差了", "不推荐", "很失望", "退货", "电池不行", "服务态度差", "太贵了"]


def _vocab() -> list[str]:
    vocab = SPECIALS + LATIN + list(dict.fromkeys(HAN))
    fill = (chr(c) for c in range(0x4E00, 0x9FA6) if chr(c) not in vocab + ["產", "質"])
    return vocab + [next(fill) for _ in range(99 - len(vocab))]


def _chinese_bert(path: str) -> None:
    """tiny_bert's weights (random) under a Chinese vocabulary of as many ids, with the
    tokenizer_config.json bert-base-chinese ships (no lower-casing)."""
    d = Path(path)
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(TINY_BERT / name, d / name)
    (d / "vocab.txt").write_text("".join(t + "\n" for t in _vocab()), encoding="utf-8")
    config = {"do_lower_case": False, "tokenizer_class": "BertTokenizer"}
    (d / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def _reviews(path: Path) -> str:
    """160 short reviews, pos and neg alternating, every 10th made longer than the 32 tokens the
    tiny fine-tune reads."""
    r = random.Random(0)
    rows = []
    for i in range(160):
        label = i % 2
        words = r.sample(POS if label else NEG, 2)
        text = "，".join(words * (6 if i % 10 == 0 else 1)) + "。"
        rows.append(f"{text},{'pos' if label else 'neg'}")
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def bert_zh(tmp_path_factory) -> str:
    return _built_once(tmp_path_factory, "bert_zh", _chinese_bert)


@pytest.fixture(scope="module")
def finetuned_zh(tmp_path_factory, bert_zh) -> str:
    """A workdir of `experiments.train --config=configs/finetune.py:tiny` (6 steps, 32 tokens of
    which the last 8 are the text's tail) from `bert_zh` on `_reviews`. Read-only for tests."""

    def run(workdir: str) -> None:
        csv = _reviews(Path(workdir + ".csv"))
        flags = [
            "--config=configs/finetune.py:tiny",
            f"--config.model.pretrained={bert_zh}",
            f"--config.data.path={csv}",
            f"--workdir={workdir}",
        ]
        assert cli.run(train.define_flags, train.main, ["train", *flags]) == 0

    return _built_once(tmp_path_factory, "finetuned_zh", run)


@pytest.fixture(scope="module")
def own(trained) -> serving.Trained:
    return serving.load(trained)


@pytest.fixture(scope="module")
def zh(finetuned_zh) -> serving.Trained:
    return serving.load(finetuned_zh)


def _tokens(t: serving.Trained, text: str) -> list[str]:
    return t.tokenizer.tokens(serving.encode(t, text).tolist())


def _in_vocab(t: serving.Trained, chars: str) -> list[str]:
    """Each character as attn's char tokenizer reads it: itself, or <unk> outside the vocabulary."""
    vocab = set(t.tokenizer.vocab)
    return [c if c in vocab else tokenizers.RESERVED[tokenizers.UNK] for c in chars]


def _answers(t: serving.Trained, text: str) -> dict:
    p = predict.predict_one(t, text, top=5)
    assert p["label"] in t.label_names and 0.5 <= p["probability"] <= 1.0, p
    return p


FULL_WIDTH = "这个手机很好！！ＡＢＣ１２３"


def test_full_width_punctuation_letters_and_digits_are_read_as_typed(own, zh):
    """Neither tokenizer folds full-width forms into ASCII (no NFKC): attn's characters lower-case
    Ａ to the full-width ａ, each its own token; BERT's basic tokenizer keeps CJK punctuation
    apart but reads the run of full-width letters and digits as one word, one [UNK] when the
    vocabulary lacks it. Both answer with a probability."""
    assert own.tokenizer.split(FULL_WIDTH) == list("这个手机很好！！ａｂｃ１２３")
    assert _tokens(own, FULL_WIDTH) == _in_vocab(own, "这个手机很好！！ａｂｃ１２３")
    assert "！" in own.tokenizer.vocab  # the reviews' own punctuation, learned as typed
    p = _answers(own, FULL_WIDTH)
    unknown = _tokens(own, FULL_WIDTH).count("<unk>")
    assert (p["text_tokens"], p["known_tokens"]) == (len(FULL_WIDTH), len(FULL_WIDTH) - unknown)
    assert _tokens(zh, FULL_WIDTH) == ["[CLS]", *"这个手机很好！！", "[UNK]", "[SEP]"]
    p = _answers(zh, FULL_WIDTH)
    assert (p["text_tokens"], p["known_tokens"]) == (9, 8)
    assert {w for w, _ in p["top_tokens"]} <= set("这个手机很好！")


def test_emoji_are_read_without_a_crash_and_counted_as_unknown(own, zh, trained, capsys):
    """attn's characters read each emoji as one <unk>; BERT's pre-tokenizer keeps a run of emoji
    as one word, so 👍😊 is one [UNK] although 👍 alone is in its vocabulary. The counts of known
    tokens and the notes say so, in tokens."""
    assert "👍" not in own.tokenizer.vocab and "评" in own.tokenizer.vocab
    assert _tokens(own, "好评👍😊") == ["好", "评", "<unk>", "<unk>"]
    p = _answers(own, "好评👍😊")
    assert (p["text_tokens"], p["known_tokens"]) == (4, 2) and "note" not in p  # not mostly
    assert {w for w, _ in p["top_tokens"]} == {"好", "评"}
    proc = run_here(
        "experiments.predict", f"--workdir={trained}", "好👍😊🎉", "👍😊", capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "note: text 1: mostly unknown: 3 of 4 tokens read are outside the vocabulary, so the "
        "answer rests on the other 1"
    ) in proc.stderr
    assert proc.stdout.splitlines()[2] == f"unknown\t-\t{serving.NO_KNOWN_TOKENS}"

    assert _tokens(zh, "好评👍😊") == ["[CLS]", "好", "评", "[UNK]", "[SEP]"]
    assert _tokens(zh, "好评👍") == ["[CLS]", "好", "评", "👍", "[SEP]"]
    p = _answers(zh, "好评👍😊")
    assert (p["text_tokens"], p["known_tokens"]) == (3, 2)
    assert {w for w, _ in p["top_tokens"]} == {"好", "评"}
    p = _answers(zh, "好 😊 🎉 🙏")
    assert p["note"] == (
        "mostly unknown: 3 of 4 tokens read are outside the vocabulary, so the answer rests on "
        "the other 1"
    )


MIXED = "iPhone的屏幕很好but电池不行"


def test_chinese_mixed_with_english(own, zh, bert_zh):
    """attn's characters read English letter by letter, lower-cased. bert-base-chinese's
    tokenizer does not lower-case and its vocabulary is lower-case, so "iPhone" is [UNK] while
    "but" is read; data.lowercase=true (the checkpoint tokenizer lower-casing first) reads it as
    i ##phone, which predict lists as the one word "iphone"."""
    assert _tokens(own, MIXED) == _in_vocab(own, MIXED.lower())
    assert set("iphonebut") <= set(own.tokenizer.vocab)
    p = _answers(own, MIXED)
    assert p["known_tokens"] == p["text_tokens"] == len(MIXED)

    assert _tokens(zh, MIXED) == ["[CLS]", "[UNK]", *"的屏幕很好", "but", *"电池不行", "[SEP]"]
    assert _answers(zh, MIXED)["known_tokens"] == 10
    lower = dataclasses.replace(
        zh, tokenizer=checkpoint_tokenizer.CheckpointTokenizer(bert_zh, lowercase=True)
    )
    assert _tokens(lower, MIXED)[1:3] == ["i", "##phone"]
    p = predict.predict_one(lower, MIXED, top=20)
    assert p["known_tokens"] == 12  # i ##phone, but and 9 characters
    assert sorted(w for w, _ in p["top_tokens"]) == sorted(["iphone", "but", *"的屏幕很好电池不行"])


TRADITIONAL = "這個產品質量很好，物流也快"


def test_traditional_characters_are_their_own_tokens_or_one_unknown_each(own, zh):
    """A traditional character the vocabulary has is its own token; one it lacks is one unknown
    token, never its neighbours: each CJK character is a word of its own, in both tokenizers. The
    embedded reviews have 這 (64 times) but never 產; the Chinese BERT has 這 個, not 產 質."""
    assert "這" in own.tokenizer.vocab and "產" not in own.tokenizer.vocab
    tokens = _tokens(own, TRADITIONAL)
    assert tokens == _in_vocab(own, TRADITIONAL) and tokens[2] == "<unk>"
    p = _answers(own, TRADITIONAL)
    assert p["known_tokens"] == len(TRADITIONAL) - tokens.count("<unk>")
    assert "產" not in {w for w, _ in p["top_tokens"]}

    assert _tokens(zh, TRADITIONAL) == [
        "[CLS]", "這", "個", "[UNK]", "品", "[UNK]", *"量很好，物流也快", "[SEP]"
    ]  # fmt: skip
    p = _answers(zh, TRADITIONAL)
    assert (p["text_tokens"], p["known_tokens"]) == (13, 11)


def test_a_long_chinese_review_keeps_its_head_and_tail(own, zh):
    """`encoding.cut`'s head + tail on a Chinese text's ids, as serving and the training data
    pipeline encode it: attn's model (64 tokens, here with the last 8 kept) and the fine-tune
    (32 tokens: [CLS], the first 22, the last 8, [SEP])."""
    text = "".join(dict.fromkeys(HAN))  # distinct characters: a wrong cut shows
    assert len(text) > 64
    config = own.config.copy_and_resolve_references()
    config.data.tail_len = 8
    tail = dataclasses.replace(own, config=config)
    raw = own.tokenizer.encode(text)
    ids = serving.encode(tail, text)
    np.testing.assert_array_equal(ids, np.concatenate([raw[:56], raw[-8:]]))
    assert own.tokenizer.tokens(ids.tolist()) == _in_vocab(own, text[:56] + text[-8:])
    split = encoding.encode_split(own.tokenizer, [text], np.array([1]), config.data, add_cls=False)
    np.testing.assert_array_equal(split.ids[0], ids)
    note = serving.reading(tail, text, ids).notes
    assert note == [f"read the first 56 and last 8 of {len(text)} tokens"]

    assert (zh.config.data.max_len, zh.config.data.tail_len) == (32, 8)
    assert _tokens(zh, text) == ["[CLS]", *text[:22], *text[-8:], "[SEP]"]
    loaded = encoding.load(zh.config.data, ("train",), add_cls=False, tokenizer=zh.tokenizer)
    train_split = loaded.splits["train"]
    long = [(t, i) for t, i in zip(train_split.texts, train_split.ids, strict=True) if len(t) > 30]
    assert long  # _reviews' every 10th review
    for t, ids_L in long:
        assert zh.tokenizer.tokens(ids_L.tolist()) == ["[CLS]", *t[:22], *t[-8:], "[SEP]"]


@pytest.mark.parametrize("which", ["own", "zh"])
def test_explain_lists_single_characters_never_pieces_or_unknown(which, request, capsys):
    """predict --explain's most-attended words on Chinese are characters of the text: no ##
    piece, no [UNK] / <unk> (the unknown 產 and emoji are read but never listed), in the order of
    the explanation's attention ranking once unknown tokens are left out of it."""
    t = request.getfixturevalue(which)
    workdir = request.getfixturevalue("trained" if which == "own" else "finetuned_zh")
    texts = ["质量很好，很满意", TRADITIONAL, "好评👍😊"]
    proc = run_here(
        "experiments.predict", f"--workdir={workdir}", "--explain", "--json", *texts, capsys=capsys
    )
    assert proc.returncode == 0, proc.stderr
    unk = t.tokenizer.tokens([getattr(t.tokenizer, "unk_id", tokenizers.UNK)])[0]
    for text, line in zip(texts, proc.stdout.splitlines(), strict=True):
        p = json.loads(line)
        words = [w for w, _ in p["top_tokens"]]
        assert words and all(len(w) == 1 and w in text for w in words), (text, words)
        attended = [w for w, _ in p["explain"]["attention"] if w != unk]
        assert words[: len(attended)] == attended[: len(words)]
        for w, _ in p["explain"]["leave_one_out"]:
            assert not w.startswith("##") and (w == unk or (len(w) == 1 and w in text))


def _glyph_warnings(record: list) -> list[str]:
    return [str(w.message) for w in record if "missing from font" in str(w.message)]


def test_visualize_steps_draws_chinese_with_the_cjk_font(finetuned_zh, tmp_path, capsys):
    """visualize --steps on the Chinese fine-tune draws with Noto Sans CJK (mplfonts): matplotlib
    warns of no missing glyph, as it does for the same heatmap drawn without the font. The
    vocabulary's 👍, which no font of the figures has, is labelled U+1F44D, not an empty box."""
    family = plots.cjk_font_family()
    assert family is not None and family.startswith("Noto Sans CJK")
    assert plots.drawable("好👍[UNK]") == "好U+1F44D[UNK]"
    workdir = str(tmp_path / "run")
    shutil.copytree(finetuned_zh, workdir)
    text = "质量很好，很满意！👍"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        proc = run_here(
            "experiments.visualize",
            f"--workdir={workdir}",
            "--steps",
            "--layer=1",
            "--head=3",
            text,
            capsys=capsys,
        )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "visualize" / "text1_steps_layer1_head3.png").is_file()
    assert _glyph_warnings(record) == []
    tokens = _tokens(serving.load(workdir), text)
    assert "👍" in tokens
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mp.setattr(plots, "style", lambda: {})
        weights = np.full((len(tokens), len(tokens)), 1 / len(tokens))
        plots.plot_heatmap(weights, tokens, "no CJK font", str(tmp_path / "no_cjk.png"))
    missing = _glyph_warnings(record)  # the check sees boxes when there are some
    assert any("CJK UNIFIED IDEOGRAPH" in m for m in missing)
