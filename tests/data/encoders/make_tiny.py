"""Tiny random-init reference checkpoints for eight Hugging Face encoder families, made by
transformers (PyTorch) itself, which attn never imports: run this file in a separate environment
that has it, from the repository root, e.g.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch "transformers==4.57.6" safetensors tokenizers \
        sentencepiece protobuf
    /tmp/refvenv/bin/python tests/data/encoders/make_tiny.py

For each model type bert, roberta, xlm-roberta, distilbert, electra, modernbert, deberta-v2 and
albert it writes, next to this file:

  tiny_<type>/             the base model (hidden 32, 4 heads, intermediate 48, 2 layers, 3 for
                           modernbert and albert) with EVERY parameter redrawn at random (weights
                           and biases normal(0, 0.3), LayerNorm weights 1 + normal(0, 0.3), so a
                           wrong key mapping or a dropped bias shows), saved by save_pretrained as
                           config.json + model.safetensors, and the family's tokenizer files in the
                           format its hub checkpoints ship, learned here from corpus() (BPE and
                           WordPiece merges by this file, ties broken alphabetically, SentencePiece
                           unigram models by the sentencepiece trainer);
  tiny_<type>_classifier/  its ...ForSequenceClassification (3 labels negative / neutral /
                           positive), every parameter drawn likewise (head included), same
                           tokenizer files;
  tiny_<type>_golden.npz   ids [3, L = 16] int32 right-padded with the family's pad id (12, 7
                           and 1 real tokens, every row padded), mask (int32 1/0), types (int32;
                           a second segment where type_vocab_size > 1), hidden = the base model's
                           last_hidden_state and logits = the classifier's (float32, eval mode,
                           eager attention, highest float32 matmul precision), hidden_float64 =
                           the base model's last_hidden_state in float64 (`forward_float64`),
                           texts (short
                           strings; ☃ is in no vocabulary, so [UNK] / <unk>, except that
                           byte-level BPE spells it in bytes) and text_ids / text_lengths
                           (int32, right-padded with the pad id) = what
                           AutoTokenizer.from_pretrained(tiny_<type>) gives for them, special
                           tokens included. The deberta-v2 goldens also store relative_pos
                           [L, L] int32: build_relative_position's i - j (log-bucketed where
                           position_buckets > 0), before attention clamps it to its span.

Every tiny_* directory also holds the same weights as pytorch_model.bin (save_pretrained with
safe_serialization=False) and, for the types transformers had Flax classes for (bert, roberta,
xlm-roberta, distilbert, electra, albert), as flax_model.msgpack (transformers' Flax model
converted from PyTorch); formats/ holds tiny_bert's weights written the other ways a checkpoint
comes: bfloat16 and float16 .bin, sharded .bin and msgpack with their index, torch's legacy
(pre-zip) format.

plus tiny_deberta-v2-variant/ and its golden (no classifier): the other DeBERTa-v2 code paths
(separate position projections, c2p only, absolute positions added, plain clipping of i - j, no
LayerNorm on the relative embeddings, token types). versions.json records the library versions.
Every draw has a fixed seed and every file is written byte for byte the same on a rerun with the
same versions on the same CPU, but formats/legacy's .bin (torch's legacy format keys each storage
by its memory address); on another CPU the checkpoints and tokenizer files still are, but
PyTorch's kernels round the goldens' outputs differently (by up to 3e-6 in float32 and 6e-7 in
modernbert's float64 on an AMD EPYC, against the files here), so keep the committed goldens of
families you did not change. Before writing a golden each directory is reloaded with
from_pretrained(output_loading_info=True): nothing may be missing, unexpected or mismatched, and
every tensor must equal the one drawn.
"""

import collections
import io
import itertools
import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable

import flax
import numpy as np
import safetensors
import sentencepiece as spm
import tokenizers
import torch
import transformers
from sentencepiece import sentencepiece_model_pb2
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

OUT = os.path.dirname(os.path.abspath(__file__))
HIDDEN, HEADS, INTERMEDIATE = 32, 4, 48
LENGTHS = (12, 7, 1)  # real tokens per golden row
L = 16  # golden length: every row padded
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = (
    "the film 12 was great and superb",
    "An AWFUL, boring movie... I hated it!",
    "质量很好，很满意",
    "best fun ☃ ever 7/10",
    "Wonderful café: 3 stars?",
)

POS = ("great", "superb", "moving", "good", "loved", "wonderful", "best", "fun")
NEG = ("awful", "boring", "dull", "bad", "hated", "terrible", "worst")
SUBJECTS = ("the film", "the movie", "this book", "the story", "the plot", "the acting", "it")
ZH = ("质量很好", "很满意", "书很好看", "看书很好", "质量好", "很好看，满意", "好书。")
REVIEWS = (
    "The film was great and the acting was superb.",
    "I loved this movie, it was moving and fun.",
    "A wonderful story with the best music of the year.",
    "The plot was dull and the ending was bad.",
    "I hated it: an awful, boring and terrible film.",
    "The worst movie I have ever seen, 1/10.",
    "It was good, not great; 7/10.",
    "This book is the best book I have read in 2024!",
    "What a fun ride (really).",
    "Not bad at all, but not good either.",
    "The cast is superb and the story is moving.",
    "Boring? Yes. Dull? Very. Terrible? No.",
    'She said: "a wonderful film" and he said it was awful.',
    "12 films, 3 stars each - the director's worst year.",
    "0 1 2 3 4 5 6 7 8 9 10 100 [ ] ( ) ' ! ?",
)


def corpus() -> list[str]:
    """A small fixed corpus: every word the texts and the tests use, the digits, basic
    punctuation and a few Chinese characters, enough times each that they become whole tokens."""
    lines = list(REVIEWS)
    for i, subject in enumerate(SUBJECTS):
        for j, (p, n) in enumerate(zip(POS, NEG + ("not",), strict=True)):
            lines.append(f"{subject} was {p} and {p}, i loved it {(i * 7 + j) % 10}/10.")
            lines.append(f"{subject} was {n}; {n} and not {p}! i hated it, {j} stars")
            lines.append(f"The {p.title()} film was {p}? {n.upper()} was the worst {j + i}")
    for i, text in enumerate(ZH):
        lines.append(f"{text} {ZH[(i + 3) % len(ZH)]}，{i}")
    return lines


# ---------------------------------------------------------------- tokenizers
# The `tokenizers` trainers break ties between equally frequent pairs by ids that follow Rust's
# randomly seeded HashMap order, so two runs can learn different vocabularies. The merges are
# learned here instead, ties going to the alphabetically first pair, on words split by the
# library's own normalizers and pre-tokenizers; the library's models then tokenize with them.


def words(normalizer, pre_tokenizer) -> collections.Counter:
    """How often each pre-tokenized word of the corpus occurs."""
    counts = collections.Counter()
    for line in corpus():
        text = normalizer.normalize_str(line) if normalizer else line
        counts.update(w for w, _ in pre_tokenizer.pre_tokenize_str(text))
    return counts


def learn_merges(
    counts: dict[tuple[str, ...], int], n: int, join: Callable[[str, str], str]
) -> list[tuple[str, str]]:
    """Up to n BPE merges over words given as symbol tuples: each time the most frequent adjacent
    pair seen at least twice (ties: the alphabetically first) becomes the symbol join(a, b)."""
    merges = []
    counts = dict(counts)
    for _ in range(n):
        pairs = collections.Counter()
        for w, c in counts.items():
            for pair in itertools.pairwise(w):
                pairs[pair] += c
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]), default=None)
        if best is None or best[1] < 2:
            break
        (a, b), _ = best
        merges.append((a, b))
        merged = {}
        for w, c in counts.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == (a, b):
                    out.append(join(a, b))
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        counts = merged
    return merges


def wordpiece(cls: type, directory: str) -> transformers.PreTrainedTokenizerBase:
    """BERT's lower-cased WordPiece (vocab.txt + tokenizer.json), specials laid out as BERT's are:
    [PAD] first, then unused slots, then [UNK] [CLS] [SEP] [MASK]; then every character, alone
    and as a ##continuation, then the learned pieces (as the WordPiece trainer builds them)."""
    counts = words(normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer())
    symbols = {tuple([w[0]] + [f"##{c}" for c in w[1:]]): c for w, c in counts.items()}
    specials = (
        ["[PAD]"] + [f"[unused{i}]" for i in range(4)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    alphabet = sorted({s for w in symbols for s in w})
    vocab = specials + alphabet
    for a, b in learn_merges(symbols, 240 - len(vocab), lambda a, b: a + b.removeprefix("##")):
        vocab.append(a + b.removeprefix("##"))
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{t}\n" for t in vocab))
    return cls(vocab_file=path, do_lower_case=True)


def byte_level_merges(n: int) -> tuple[list[str], list[tuple[str, str]]]:
    """GPT-2 byte-level BPE: the 256 byte symbols, then n merges at most."""
    counts = words(None, pre_tokenizers.ByteLevel(add_prefix_space=False))
    merges = learn_merges({tuple(w): c for w, c in counts.items()}, n, lambda a, b: a + b)
    return sorted(pre_tokenizers.ByteLevel.alphabet()) + [a + b for a, b in merges], merges


def byte_level_bpe(directory: str) -> transformers.PreTrainedTokenizerBase:
    """RoBERTa's byte-level BPE (vocab.json + merges.txt + tokenizer.json): <s> <pad> </s> <unk>
    at 0-3 and <mask> the last id, as roberta-base has them."""
    symbols, merges = byte_level_merges(160)
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + symbols + ["<mask>"]
    vocab_path = os.path.join(directory, "vocab.json")
    with open(vocab_path, "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(tokens)}, f, ensure_ascii=False)
    merges_path = os.path.join(directory, "merges.txt")
    with open(merges_path, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return transformers.RobertaTokenizerFast(vocab_file=vocab_path, merges_file=merges_path)


def modernbert_bpe(directory: str) -> transformers.PreTrainedTokenizerBase:
    """ModernBERT's byte-level BPE (tokenizer.json only): the specials [UNK] [CLS] [SEP] [PAD]
    [MASK] come after the whole BPE vocabulary, as in answerdotai/ModernBERT-base."""
    del directory
    symbols, merges = byte_level_merges(140)
    tok = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(symbols)}, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]"])
    tok.add_special_tokens([tokenizers.AddedToken("[MASK]", lstrip=True, special=True)])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )


# The hub models normalize with nmt_nfkc, whose character map alone is 240 KB; these four
# rules (full-width comma, ideographic full stop, full-width !, ideographic space) keep the
# same machinery (a precompiled character map in the model, Precompiled in tokenizer.json).
NORMALIZATION_RULES = "FF0C\t2C\n3002\t2E\nFF01\t21\n3000\t20\n"


def sentencepiece_model(path: str, lowercase: bool = False, **ids: object) -> None:
    """A SentencePiece unigram model trained on the corpus (lower-cased with `lowercase`; one
    thread, so the same every run), written to path + ".model" without the temporary paths
    training records in it."""
    rules = path + ".rules.tsv"
    with open(rules, "w", encoding="utf-8") as f:
        f.write(NORMALIZATION_RULES)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t.lower() for t in corpus()] if lowercase else corpus()),
        model_writer=model,
        model_type="unigram",
        vocab_size=300,  # an upper bound: the corpus gives fewer pieces
        hard_vocab_limit=False,
        normalization_rule_tsv=rules,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
        **ids,
    )
    os.remove(rules)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    proto.normalizer_spec.normalization_rule_tsv = ""
    proto.trainer_spec.ClearField("model_prefix")
    with open(path + ".model", "wb") as f:
        f.write(proto.SerializeToString())


def xlm_roberta_unigram(directory: str) -> transformers.PreTrainedTokenizerBase:
    """XLM-R's SentencePiece unigram (sentencepiece.bpe.model + tokenizer.json): spm's own ids are
    <unk> 0 <s> 1 </s> 2; the tokenizer shifts them by fairseq's offset (<s> 0 <pad> 1 </s> 2
    <unk> 3, piece i -> i + 1) and puts <mask> last."""
    prefix = os.path.join(directory, "sentencepiece.bpe")
    sentencepiece_model(prefix)
    return transformers.XLMRobertaTokenizerFast(vocab_file=prefix + ".model")


def deberta_spm(directory: str) -> transformers.PreTrainedTokenizerBase:
    """DeBERTa-v3's tokenizer as microsoft/deberta-v3-base ships it: spm.model alone (a unigram
    SentencePiece model with [PAD] 0 [CLS] 1 [SEP] 2 [UNK] 3), no tokenizer.json; [MASK] is an
    added token after the spm vocabulary."""
    prefix = os.path.join(directory, "spm")
    sentencepiece_model(
        prefix,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3,
        pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]",
    )  # fmt: skip
    return transformers.DebertaV2Tokenizer(vocab_file=prefix + ".model", do_lower_case=False)


def albert_spm(directory: str) -> transformers.PreTrainedTokenizerBase:
    """ALBERT's tokenizer as albert-base-v2 ships it: spiece.model (a SentencePiece unigram model
    of lower-cased text with <pad> 0 <unk> 1 [CLS] 2 [SEP] 3 [MASK] 4) and the tokenizer.json
    transformers converts it to (lower-casing, accents stripped)."""
    prefix = os.path.join(directory, "spiece")
    sentencepiece_model(
        prefix, lowercase=True,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="[CLS]", eos_piece="[SEP]",
        user_defined_symbols=["[MASK]"],
    )  # fmt: skip
    return transformers.AlbertTokenizerFast(vocab_file=prefix + ".model")


def save_tokenizer(tok: transformers.PreTrainedTokenizerBase, directory: str) -> None:
    """save_pretrained, except for DeBERTa-v2, whose hub checkpoints carry only spm.model, a
    two-key tokenizer_config.json and special_tokens_map.json (the tokenizer then adds [MASK]
    itself, after the spm vocabulary)."""
    if not isinstance(tok, transformers.DebertaV2Tokenizer):
        tok.save_pretrained(directory)
        return
    shutil.copy(tok.vocab_file, os.path.join(directory, "spm.model"))
    files = {
        "tokenizer_config.json": {"do_lower_case": False, "vocab_type": "spm"},
        "special_tokens_map.json": {
            "bos_token": "[CLS]",
            "eos_token": "[SEP]",
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        },
    }
    for name, content in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)
            f.write("\n")


# ---------------------------------------------------------------- families


def common(vocab: int, max_positions: int = 64, **kw: object) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        hidden_act="gelu",
        max_position_embeddings=max_positions,
        **kw,
    )


def round_up(n: int, to: int = 64) -> int:
    return -(-n // to) * to


def configs(name: str, tok: transformers.PreTrainedTokenizerBase) -> list[tuple]:
    """[(directory name, config class, config kwargs, base class, classifier class or None)]."""
    n, pad = len(tok), tok.pad_token_id
    t = transformers
    if name == "bert":
        kw = common(n, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=pad)
        return [("bert", t.BertConfig, kw, t.BertModel, t.BertForSequenceClassification)]
    if name in ("roberta", "xlm-roberta"):
        kw = common(
            n, 66, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=pad,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
        if name == "roberta":
            return [
                ("roberta", t.RobertaConfig, kw, t.RobertaModel, t.RobertaForSequenceClassification)
            ]
        classes = (t.XLMRobertaConfig, kw, t.XLMRobertaModel, t.XLMRobertaForSequenceClassification)
        return [(name, *classes)]
    if name == "distilbert":
        kw = dict(
            vocab_size=n, dim=HIDDEN, n_heads=HEADS, hidden_dim=INTERMEDIATE, n_layers=2,
            max_position_embeddings=64, sinusoidal_pos_embds=False, activation="gelu",
            pad_token_id=pad,
        )  # fmt: skip
        classes = (t.DistilBertConfig, kw, t.DistilBertModel, t.DistilBertForSequenceClassification)
        return [(name, *classes)]
    if name == "electra":
        kw = common(n, embedding_size=16, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=pad)
        return [
            ("electra", t.ElectraConfig, kw, t.ElectraModel, t.ElectraForSequenceClassification)
        ]
    if name == "modernbert":
        kw = dict(
            vocab_size=round_up(n), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
            num_hidden_layers=3, num_attention_heads=HEADS, max_position_embeddings=64,
            global_attn_every_n_layers=2, local_attention=4, global_rope_theta=160000.0,
            local_rope_theta=10000.0, pad_token_id=pad, bos_token_id=tok.cls_token_id,
            eos_token_id=tok.sep_token_id, cls_token_id=tok.cls_token_id,
            sep_token_id=tok.sep_token_id, classifier_pooling="mean",
        )  # fmt: skip
        classes = (t.ModernBertConfig, kw, t.ModernBertModel, t.ModernBertForSequenceClassification)
        return [(name, *classes)]
    if name == "albert":
        # One layer shared by all 3 depths, embeddings 16 wide projected to 32; GELU's tanh
        # form (gelu_new), as the released ALBERTs have it.
        kw = {
            **common(n, embedding_size=16, type_vocab_size=2, layer_norm_eps=1e-12),
            "num_hidden_layers": 3, "num_hidden_groups": 1, "inner_group_num": 1,
            "hidden_act": "gelu_new", "pad_token_id": pad, "bos_token_id": tok.cls_token_id,
            "eos_token_id": tok.sep_token_id,
        }  # fmt: skip
        classes = (t.AlbertConfig, kw, t.AlbertModel, t.AlbertForSequenceClassification)
        return [(name, *classes)]
    assert name == "deberta-v2"
    kw = common(
        round_up(n), type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=pad,
        relative_attention=True, position_buckets=8, max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"], share_att_key=True, position_biased_input=False,
        norm_rel_ebd="layer_norm", pooler_hidden_size=HIDDEN, pooler_hidden_act="gelu",
        pooler_dropout=0.0,
    )  # fmt: skip
    variant = {
        **kw,
        "type_vocab_size": 2,
        "share_att_key": False,
        "pos_att_type": ["c2p"],
        "position_biased_input": True,
        "position_buckets": -1,
        "max_relative_positions": 6,
        "norm_rel_ebd": "none",
    }
    classes = (t.DebertaV2Model, t.DebertaV2ForSequenceClassification)
    return [
        (name, t.DebertaV2Config, kw, *classes),
        ("deberta-v2-variant", t.DebertaV2Config, variant, t.DebertaV2Model, None),
    ]


TOKENIZERS = {
    "bert": lambda d: wordpiece(transformers.BertTokenizerFast, d),
    "roberta": byte_level_bpe,
    "xlm-roberta": xlm_roberta_unigram,
    "distilbert": lambda d: wordpiece(transformers.DistilBertTokenizerFast, d),
    "electra": lambda d: wordpiece(transformers.ElectraTokenizerFast, d),
    "modernbert": modernbert_bpe,
    "deberta-v2": deberta_spm,
    "albert": albert_spm,
}


# ---------------------------------------------------------------- parameters and checks


def redraw(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter drawn anew: weights and biases normal(0, 0.3), LayerNorm weights
    1 + normal(0, 0.3). Returns the drawn tensors under their state-dict names."""
    rng = np.random.default_rng(seed)
    norms = {
        f"{name}.weight" if name else "weight"
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.LayerNorm)
    }
    drawn = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            x = rng.normal(0.0, 0.3, tuple(p.shape)).astype(np.float32)
            if name in norms:
                x = (1.0 + x).astype(np.float32)
            p.copy_(torch.from_numpy(x))
            drawn[name] = p.detach().clone()
    return drawn


def reload(cls: type, directory: str, drawn: dict[str, torch.Tensor]) -> torch.nn.Module:
    """from_pretrained, eager attention, eval mode; refuses any missing / unexpected / mismatched
    key and any tensor that is not the one drawn."""
    model, info = cls.from_pretrained(
        directory, output_loading_info=True, attn_implementation="eager"
    )
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{directory}: loading info {bad}")
    state = dict(model.named_parameters())
    if set(state) != set(drawn):
        sys.exit(f"{directory}: parameters {sorted(set(state) ^ set(drawn))} differ")
    for k, v in drawn.items():
        if not torch.equal(state[k], v):
            sys.exit(f"{directory}: {k} is not the tensor drawn")
    if model.config._attn_implementation != "eager":
        sys.exit(f"{directory}: attention implementation {model.config._attn_implementation}")
    return model.eval()


def golden_inputs(
    config: transformers.PretrainedConfig, tok: transformers.PreTrainedTokenizerBase, seed: int
) -> dict[str, np.ndarray]:
    """Rows of LENGTHS real tokens: the family's [CLS] first, its [SEP] last, random ids other
    than the pad id between (any id of the embedding table); right-padded to L."""
    rng = np.random.default_rng(seed)
    pad = config.pad_token_id
    choices = np.array([i for i in range(config.vocab_size) if i != pad])
    ids = np.full((len(LENGTHS), L), pad, np.int32)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        ids[row, :n] = rng.choice(choices, n)
        ids[row, 0] = tok.cls_token_id
        if n > 1:
            ids[row, n - 1] = tok.sep_token_id
        mask[row, :n] = 1
        if getattr(config, "type_vocab_size", 0) > 1:
            types[row, n // 2 : n] = 1  # a second segment
    return {"ids": ids, "mask": mask, "types": types}


def forward(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    kw = {
        "input_ids": torch.from_numpy(inputs["ids"]).long(),
        "attention_mask": torch.from_numpy(inputs["mask"]).long(),
    }
    if getattr(model.config, "type_vocab_size", 0) > 0:
        kw["token_type_ids"] = torch.from_numpy(inputs["types"]).long()
    with torch.no_grad():
        out = model(**kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def forward_float64(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The base model's last_hidden_state in float64, each row alone at its real length (zeros at
    the padding): the exact values within float64 rounding, which the float32 output misses by
    its own rounding (about 1e-5 for modernbert). One row at a time because a padded batch gives
    NaN in float64 (modernbert: the padded rows' fully masked scores, which the next layer's
    values then carry into every row). Leaves the model in float64."""
    model.to(torch.float64)
    out = np.zeros(inputs["ids"].shape + (model.config.hidden_size,), np.float64)
    for row, n in enumerate(inputs["mask"].sum(axis=1)):
        one = {k: v[row : row + 1, :n] for k, v in inputs.items()}
        out[row, :n] = forward(model, one)[0].numpy()
    return out


def text_ids(directory: str, pad: int) -> dict[str, np.ndarray]:
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    rows = [tok(t, add_special_tokens=True)["input_ids"] for t in TEXTS]
    lengths = np.array([len(r) for r in rows], np.int32)
    ids = np.full((len(rows), lengths.max()), pad, np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return {"texts": np.array(TEXTS), "text_ids": ids, "text_lengths": lengths}


def save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """np.savez with a fixed timestamp, so a rerun writes the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[k]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, buf.getvalue())


def deberta_relative_pos(config: transformers.PretrainedConfig) -> np.ndarray:
    from transformers.models.deberta_v2 import modeling_deberta_v2 as m

    x = torch.zeros(1, L, config.hidden_size)
    max_pos = config.max_relative_positions
    max_pos = config.max_position_embeddings if max_pos < 1 else max_pos
    rel = m.build_relative_position(x, x, config.position_buckets, max_pos)
    return rel[0].numpy().astype(np.int32)


def write_family(name: str, seed: int) -> list[str]:
    with tempfile.TemporaryDirectory() as work:
        tok = TOKENIZERS[name](work)
        if not isinstance(tok, transformers.DebertaV2Tokenizer):
            tok.model_max_length = 64  # as many tokens as the positions hold
        written = []
        for k, (dname, cfg_cls, kw, base_cls, clf_cls) in enumerate(configs(name, tok)):
            config = cfg_cls(**kw)
            base_dir = os.path.join(OUT, f"tiny_{dname}")
            dirs = [(base_dir, base_cls, config)]
            if clf_cls is not None:
                clf_config = cfg_cls(**kw, num_labels=3, id2label=LABELS)
                clf_config.label2id = {label: i for i, label in LABELS.items()}
                dirs.append((base_dir + "_classifier", clf_cls, clf_config))
            outputs = {}
            for j, (directory, cls, cfg) in enumerate(dirs):
                shutil.rmtree(directory, ignore_errors=True)
                torch.manual_seed(seed)
                model = cls(cfg)
                drawn = redraw(model, seed * 100 + k * 10 + j)
                model.save_pretrained(directory, safe_serialization=True)
                save_tokenizer(tok, directory)
                model = reload(cls, directory, drawn)
                if j == 0:
                    inputs = golden_inputs(model.config, tok, seed * 100 + k * 10 + 9)
                out = forward(model, inputs).numpy().astype(np.float32)
                outputs["hidden" if j == 0 else "logits"] = out
                if j == 0:
                    outputs["hidden_float64"] = forward_float64(model, inputs)
                written.append(directory)
            golden = {**inputs, **outputs, **text_ids(base_dir, config.pad_token_id)}
            if clf_cls is not None:  # the classifier directory tokenizes the same
                again = text_ids(dirs[1][0], config.pad_token_id)["text_ids"]
                assert np.array_equal(again, golden["text_ids"]), dname
            if name == "deberta-v2":
                golden["relative_pos"] = deberta_relative_pos(config)
            path = os.path.join(OUT, f"tiny_{dname}_golden.npz")
            save_npz(path, golden)
            written.append(path)
            print(f"{dname}: vocab {config.vocab_size}, tokenizer {len(tok)}")
    return written


# The model types transformers had Flax classes for: their directories also get flax_model.msgpack.
FLAX = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert")


def bin_and_msgpack(directory: str, flax: bool) -> list[str]:
    """The same weights in the two other formats hub checkpoints ship, beside model.safetensors:
    pytorch_model.bin (save_pretrained(safe_serialization=False)) and, for a type with a Flax
    class, flax_model.msgpack (its Flax model converted from PyTorch by transformers)."""
    written = []
    clf = directory.endswith("_classifier")
    auto = transformers.AutoModelForSequenceClassification if clf else transformers.AutoModel
    with tempfile.TemporaryDirectory() as work:
        auto.from_pretrained(directory).save_pretrained(work, safe_serialization=False)
        shutil.copy(os.path.join(work, "pytorch_model.bin"), directory)
        written.append(os.path.join(directory, "pytorch_model.bin"))
    if flax:
        flax_auto = (
            transformers.FlaxAutoModelForSequenceClassification
            if clf
            else transformers.FlaxAutoModel
        )
        with tempfile.TemporaryDirectory() as work:
            flax_auto.from_pretrained(directory, from_pt=True).save_pretrained(work)
            shutil.copy(os.path.join(work, "flax_model.msgpack"), directory)
            written.append(os.path.join(directory, "flax_model.msgpack"))
    return written


def write_formats() -> list[str]:
    """Every tiny model's weights as .bin (and msgpack where a Flax class existed), and
    formats/ with tiny_bert's in the other ways a file can be written: bfloat16 and float16
    storages, sharded .bin and msgpack (with their index), and torch's legacy (pre-zip) format.
    Each has tiny_bert's config.json and nothing else."""
    written = []
    for name in sorted(os.listdir(OUT)):
        path = os.path.join(OUT, name)
        if name.startswith("tiny_") and os.path.isdir(path):
            model_type = json.load(open(os.path.join(path, "config.json")))["model_type"]
            written += bin_and_msgpack(path, model_type in FLAX)
    source = os.path.join(OUT, "tiny_bert")
    formats = os.path.join(OUT, "formats")
    shutil.rmtree(formats, ignore_errors=True)
    bert = lambda: transformers.BertModel.from_pretrained(source)  # noqa: E731 (fresh each time)
    flax_model = transformers.FlaxBertModel.from_pretrained(source)  # its flax_model.msgpack
    for name, save in (
        (
            "bfloat16",
            lambda d: bert().to(torch.bfloat16).save_pretrained(d, safe_serialization=False),
        ),
        (
            "float16",
            lambda d: bert().to(torch.float16).save_pretrained(d, safe_serialization=False),
        ),
        (
            "sharded_bin",
            lambda d: bert().save_pretrained(d, safe_serialization=False, max_shard_size="40KB"),
        ),
        ("sharded_msgpack", lambda d: flax_model.save_pretrained(d, max_shard_size="40KB")),
        (
            "legacy",
            lambda d: torch.save(
                bert().state_dict(),
                os.path.join(d, "pytorch_model.bin"),
                _use_new_zipfile_serialization=False,
            ),
        ),
    ):
        directory = os.path.join(formats, name)
        os.makedirs(directory)
        save(directory)
        shutil.copy(os.path.join(source, "config.json"), directory)
        written.append(directory)
    return written


def size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main() -> None:
    torch.set_num_threads(1)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    written = []
    for seed, name in enumerate(TOKENIZERS, start=1):
        written += write_family(name, seed)
    written += write_formats()
    total = 0
    for path in written:
        total += size(path)
        print(f"{size(path) / 1024:8.1f} KiB  {os.path.relpath(path, OUT)}")
    print(f"{total / 1024:8.1f} KiB  total")
    import google.protobuf

    record = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "sentencepiece": spm.__version__,
        "safetensors": safetensors.__version__,
        "flax": flax.__version__,
        "numpy": np.__version__,
        "protobuf": google.protobuf.__version__,
        "float32_matmul_precision": "highest",
        "attn_implementation": "eager",
    }
    with open(os.path.join(OUT, "versions.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
