"""Pretrained word vectors: formats, matching, reserved ids, width, scale, malformed files."""

import gzip
import re

import jax
import numpy as np
import pytest
from conftest import assert_close32, tol32
from sklearn.decomposition import PCA

from attn import classifier, layers
from experiments.data import tokenizers, vectors
from experiments.data.tokenizers import CLS, PAD, RESERVED, UNK
from experiments.errors import UserError

WORDS = ["the", "film", "was", "great", "awful", "plot"]


def _vecs(n: int, d: int, seed: int = 0) -> np.ndarray:
    # Four decimals, as files store them, so the values read back are the values written.
    return np.round(np.random.default_rng(seed).normal(size=(n, d)), 4).astype(np.float32)


def _lines(words, vecs_NxW, fmt=".4f") -> list[str]:
    return [
        w + " " + " ".join(f"{x:{fmt}}" for x in v) for w, v in zip(words, vecs_NxW, strict=True)
    ]


def _write(tmp_path, name, lines, *, header=None, end="\n") -> str:
    head = [header] if header else []
    text = "".join(line + end for line in head + lines).encode("utf-8")
    p = tmp_path / name
    p.write_bytes(gzip.compress(text, mtime=0) if name.endswith(".gz") else text)
    return str(p)


def _expected(vecs_NxW: np.ndarray) -> np.ndarray:
    """Rows of width d_model as the loader should give them: centred, scaled to RMS 1."""
    x = vecs_NxW.astype(np.float64) - vecs_NxW.astype(np.float64).mean(0)
    return x / np.sqrt(np.mean(x**2))


# The loader centres, projects and scales in float64 and rounds to float32 once: the tables below
# are their reference to `conftest.tol32(1)` (20 where cosines are summed in float32).


def _load(path, vocab, d_model, *, seed=0, **kw) -> vectors.Loaded:
    return vectors.load(path, RESERVED + tuple(vocab), d_model, seed=seed, **kw)


def test_formats_read_the_same(tmp_path):
    vecs = _vecs(len(WORDS), 5)
    body = _lines(WORDS, vecs)
    fasttext = [line + " " for line in body]  # fastText ends each row with a space
    paths = [
        _write(tmp_path, "w2v.txt", body, header=f"{len(WORDS)} 5"),
        _write(tmp_path, "glove.txt", body),
        _write(tmp_path, "ft.vec", fasttext, header=f"{len(WORDS)} 5", end="\r\n"),
        _write(tmp_path, "glove.txt.gz", body),
        _write(tmp_path, "ft.vec.gz", fasttext, header=f"{len(WORDS)} 5"),
    ]
    vocab = ["great", "plot", "missing", "the"]
    want = _expected(vecs[[WORDS.index(w) for w in ("great", "plot", "the")]])
    for path in paths:
        got = _load(path, vocab, 5)
        assert (got.rows, got.dim, got.exact, got.folded, got.words) == (6, 5, 3, 0, 4), path
        assert got.found_V.tolist() == [False] * 3 + [True, True, False, True]
        assert got.table_VxD.dtype == np.float32 and got.table_VxD.shape == (7, 5)
        assert_close32(got.table_VxD[got.found_V], want, 1)
        assert got.projection == "none" and got.variance_kept == 1.0


def test_found_rows_scaled_to_the_model_init_rms():
    """The loader's target scale is the RMS of the model's own token table at init."""
    cfg = classifier.ModelConfig(vocab_size=4000, d_model=64)
    tokens = np.asarray(classifier.init(jax.random.key(0), cfg)["embed"]["tokens"])
    # 256,000 draws: their RMS is within 1/sqrt(2n) = 0.14% of the stddev (one standard error);
    # 1% is seven of them.
    assert np.sqrt(np.mean(tokens**2)) == pytest.approx(vectors.INIT_STDDEV, rel=0.01)


@pytest.mark.parametrize("dim, d_model", [(4, 4), (12, 4), (3, 8)])
def test_found_rows_have_the_init_rms_whatever_the_width(tmp_path, dim, d_model):
    scale = 37.0  # a file's scale has nothing to do with the model's
    words = [f"w{i}" for i in range(40)]
    path = _write(tmp_path, "v.txt", _lines(words, scale * _vecs(40, dim) + 5.0))
    got = _load(path, words, d_model)
    found = got.table_VxD[got.found_V].astype(np.float64)
    # Computed in float64, then rounded to float32 once.
    assert np.sqrt(np.mean(found**2)) == pytest.approx(vectors.INIT_STDDEV, rel=tol32(1))
    assert_close32(found.mean(0), 0.0, 1, scale=np.abs(found).max())  # centred


def test_missing_words_and_reserved_ids_are_the_model_init(tmp_path):
    # The file has rows for the reserved tokens' strings: they must not be used.
    vecs = _vecs(len(WORDS) + 3, 4)
    path = _write(tmp_path, "v.txt", _lines([*WORDS, *RESERVED], vecs))
    vocab = ["the", "film", *[f"oov{i}" for i in range(500)]]
    a, b, c = (_load(path, vocab, 4, seed=s) for s in (0, 0, 1))
    assert a.found_V.sum() == 2 and not a.found_V[[PAD, UNK, CLS]].any()
    init = np.asarray(layers.embed_init(jax.random.key(0), len(vocab) + 3, 4))
    np.testing.assert_array_equal(a.table_VxD[~a.found_V], init[~a.found_V])
    np.testing.assert_array_equal(a.table_VxD, b.table_VxD)  # deterministic per seed
    assert not np.isclose(a.table_VxD[~a.found_V], c.table_VxD[~c.found_V]).any()
    np.testing.assert_array_equal(a.table_VxD[a.found_V], c.table_VxD[c.found_V])


def test_case_folding_both_ways_and_exact_first(tmp_path):
    file_words = ["paris", "London", "berlin", "Berlin", "ROME", "Rome", "oslo", "Éclair"]
    vecs = _vecs(len(file_words), 3)
    path = _write(tmp_path, "v.txt", _lines(file_words, vecs))
    vocab = ["Paris", "london", "Berlin", "rome", "OSLO", "oslo", "éclair", "madrid"]
    got = _load(path, vocab, 3)
    # Paris <- paris, london <- London, Berlin exact (not the earlier berlin), rome <- ROME
    # (the first of its case variants), OSLO <- oslo, oslo exact, éclair <- Éclair; madrid has
    # no row.
    rows = ["paris", "London", "Berlin", "ROME", "oslo", "oslo", "Éclair"]
    assert (got.exact, got.folded, got.found) == (2, 5, 7)
    assert got.coverage == pytest.approx(7 / 8)
    want = _expected(vecs[[file_words.index(w) for w in rows]])
    assert_close32(got.table_VxD[3:10], want, 1)
    assert not got.found_V[-1]


def test_pca_matches_sklearn_on_the_found_rows(tmp_path):
    words = [f"w{i}" for i in range(60)]
    vecs = np.round(_vecs(60, 12, seed=3) * np.linspace(3, 0.2, 12), 4)  # distinct variances
    path = _write(tmp_path, "v.txt", _lines(words, vecs) + _lines(["other"], _vecs(1, 12) * 50))
    got = _load(path, words[:50], 4)  # "other" and w50..w59 are not in the vocabulary
    assert got.projection == "pca"
    x = vecs[:50].astype(np.float64)
    pca = PCA(n_components=4).fit(x)
    ref = pca.transform(x)
    ref /= np.sqrt(np.mean(ref**2))
    ours = got.table_VxD[3:].astype(np.float64)
    signs = np.sign((ours * ref).sum(0))  # a principal direction's sign is arbitrary
    assert_close32(ours * signs, ref, 1)
    assert got.variance_kept == pytest.approx(pca.explained_variance_ratio_.sum(), rel=1e-6)
    assert "12-d projected to 4 by PCA" in got.summary()


def _cosines(x_NxX: np.ndarray) -> np.ndarray:
    x = x_NxX / np.linalg.norm(x_NxX, axis=1, keepdims=True)
    return x @ x.T


@pytest.mark.parametrize(
    "dim, d_model, projection", [(10, 10, "none"), (10, 3, "pca"), (3, 10, "embed")]
)
def test_projection_keeps_the_found_rows_geometry(tmp_path, dim, d_model, projection):
    """Rows in a 3-d subspace keep every pairwise cosine (after centring) through any width."""
    rng = np.random.default_rng(1)
    basis_3xW = np.linalg.qr(rng.normal(size=(dim, 3)))[0].T
    vecs = rng.normal(size=(30, 3)) @ basis_3xW + 0.5
    words = [f"w{i}" for i in range(30)]
    got = _load(_write(tmp_path, "v.txt", _lines(words, vecs, ".9g")), words, d_model)
    centred = vecs.astype(np.float64) - vecs.astype(np.float64).mean(0)
    assert_close32(_cosines(got.table_VxD[3:]), _cosines(centred), 2 * 10)
    assert got.projection == projection
    assert got.variance_kept == pytest.approx(1.0, abs=1e-6)


def test_wider_model_embedding_is_seeded(tmp_path):
    words = [f"w{i}" for i in range(10)]
    path = _write(tmp_path, "v.txt", _lines(words, _vecs(10, 3)))
    a, b, c = (_load(path, words, 8, seed=s) for s in (0, 0, 1))
    np.testing.assert_array_equal(a.table_VxD, b.table_VxD)
    assert not np.allclose(a.table_VxD[3:], c.table_VxD[3:])
    assert "3-d embedded in 8 by a random rotation" in a.summary()


def test_token_coverage_and_summary(tmp_path):
    path = _write(tmp_path, "v.txt", _lines(["the", "Film"], _vecs(2, 4)))
    vocab = ["the", "film", "plot"]
    counts = [100, 7, 5, 50, 30, 20]  # PAD and CLS are not text; UNK (7) is text without a row
    got = _load(path, vocab, 4, token_counts=counts)
    assert got.token_coverage == pytest.approx(80 / 107)
    line = got.summary()
    assert "\n" not in line
    assert f"model.embeddings_from={path!r}: 2 of 3 words (66.7%) have a vector" in line
    assert "(1 exact, 1 case-folded), 74.8% of training tokens; 4-d as is" in line
    assert "training tokens" not in _load(path, vocab, 4).summary()
    for bad in (counts[:-1], [100, 0, 5, 0, 0, 0]):
        with pytest.raises(ValueError, match="token_counts"):
            _load(path, vocab, 4, token_counts=bad)


def test_char_vocabulary_of_chinese_characters(tmp_path):
    texts = ["这部电影很好看", "酒店服务太差了", "好"]
    tok = tokenizers.build_tokenizer("char", texts, lowercase=False, min_freq=1, max_vocab=0)
    chars = ["好", "差", "电", "影", "の"]
    vecs = _vecs(len(chars), 4)
    got = vectors.load(_write(tmp_path, "zh.vec", _lines(chars, vecs)), tok.vocab, 4, seed=0)
    assert got.exact == 4 and got.folded == 0
    ids = [tok.vocab.index(c) for c in chars[:4]]
    assert got.found_V[ids].all() and got.found_V.sum() == 4
    order = np.argsort(ids)  # the table's found rows are in id order
    assert_close32(got.table_VxD[np.sort(ids)], _expected(vecs[:4])[order], 1)


def test_duplicates_spaced_words_and_non_utf8_words(tmp_path):
    vecs = _vecs(6, 3)
    lines = _lines(["film", "a b", "plot", "film", "x", "FILM"], vecs)
    raw = ("\n".join(lines) + "\n").encode().replace(b"x ", b"\xff\xfe ", 1)
    path = tmp_path / "v.txt"
    path.write_bytes(raw)
    got = _load(str(path), ["film", "plot", "a b"], 3)
    assert (got.exact, got.duplicates, got.not_utf8, got.rows) == (3, 1, 1, 6)
    assert_close32(got.table_VxD[3:], _expected(vecs[[0, 2, 1]]), 1)
    line = got.summary()
    assert "1 repeated words (the first row kept)" in line
    assert "1 rows skipped, their word not UTF-8" in line


def test_numbers_are_parsed_only_on_rows_the_vocabulary_keeps(tmp_path):
    lines = _lines(WORDS, _vecs(len(WORDS), 3))
    lines[2] = "was 0.1 oops 0.3"
    path = _write(tmp_path, "v.txt", lines)
    assert _load(path, ["the", "plot"], 3).found == 2
    with pytest.raises(UserError, match=r"line 3: 'oops' is not a number"):
        _load(path, ["the", "was"], 3)


ROWS = _lines(["the", "film", "plot"], _vecs(3, 3))


MALFORMED = [
    ("empty.txt", b"", "is empty"),
    ("blank.txt", b"\n\n  \n", "is empty"),
    ("header.txt", b"3 3\n", "has a header but no vector rows"),
    ("zero.txt", b"3 0\n", r"the header \(line 1\) says 0 numbers a row"),
    (
        "wide.txt",
        ["3 300", *ROWS],
        r"line 2 has 3 numbers where the header \(line 1\) says 300",
    ),
    ("narrow.txt", ["3 2", *ROWS], r"line 2 has 3 numbers where the header \(line 1\) says 2"),
    ("count.txt", ["5 3", *ROWS], "the header says 5 rows but the file has 3 .cut short"),
    ("short.txt", [*ROWS, "awful 0.1 0.2"], "line 4 has 2 numbers where line 1 has 3"),
    (
        "short.vec",
        ["4 3", *ROWS, "plot 1"],
        r"line 5 has 1 numbers where the header \(line 1\)",
    ),
    ("word.txt", ["the", *ROWS], "line 1 has a word but no numbers"),
    ("nonfloat.txt", [*ROWS[:2], "plot 0.1 0,2 0.3"], r"line 3: '0,2' is not a number"),
    (
        "nan.txt",
        ["3 3", *ROWS[:2], "plot 0.1 nan 0.3"],
        "line 4 has a number that is not finite",
    ),
    ("none.txt", ["x 1 2 3", "y 3 4 5"], "none of the 3 vocabulary words has a row in its 2"),
    ("same.txt", ["the .1 .7 .3", "film .1 .7 .3", "plot .1 .7 .3"], "found are all equal"),
    ("vectors.bin", ["3 3", *ROWS], r"binary word2vec/fastText \(\.bin\) is not read"),
    ("renamed.txt", b"3 3\nthe \x00\x00\x80?\xcd\xcc\xcc=\n", "line 2 has NUL bytes: a binary"),
    ("cut.txt.gz", gzip.compress(b"the 1 2 3\n" * 100, mtime=0)[:-20], "unreadable"),
]


@pytest.mark.parametrize("name, content, message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_files_are_one_line_errors(tmp_path, name, content, message):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else ("\n".join(content) + "\n").encode())
    with pytest.raises(UserError, match=message) as e:
        _load(str(p), ["the", "film", "plot"], 3)
    assert str(e.value).startswith(f"model.embeddings_from={str(p)!r}") and "\n" not in str(e.value)


def test_missing_file_and_folder(tmp_path):
    for path, message in [(tmp_path / "nope.txt", "does not exist"), (tmp_path, "is a folder")]:
        with pytest.raises(UserError, match=re.escape(f"{vectors.FLAG}={str(path)!r} {message}")):
            _load(str(path), ["the"], 3)
