"""User data: CSV/TSV/JSONL/folder parsing, malformed-row reports, thresholds, file-level errors."""

import json
import re

import numpy as np
import pytest
from conftest import assert_one_line_error, run_here

from experiments.data import splits, user_files
from experiments.errors import UserError

GOOD = [f"review number {i},{'neg' if i % 3 else 'pos'}" for i in range(100)]


def _csv(tmp_path, lines, name="d.csv", sep="\n") -> str:
    p = tmp_path / name
    p.write_bytes(sep.join(lines).encode("utf-8") + b"\n" if lines else b"")
    return str(p)


def _load(path, **kw):
    return user_files.load(path, **kw)


def test_csv_labels_splits_and_quoting(tmp_path):
    lines = ["text,label", '"a, quoted ""review""\nover two lines",pos', *GOOD]
    out = _load(_csv(tmp_path, lines))
    assert sum(len(t) for t, _, _ in out.values()) == 101
    for split, (texts, labels, names) in out.items():
        assert names == ("neg", "pos") and labels.dtype == np.int32
        assert all(splits.split_of(t) == split for t in texts)
        for t, y in zip(texts, labels, strict=True):
            if t.startswith("review"):
                assert names[y] == ("neg" if int(t.split()[-1]) % 3 else "pos")
    all_texts = [t for texts, _, _ in out.values() for t in texts]
    assert 'a, quoted "review"\nover two lines' in all_texts


def test_numeric_labels_stay_strings_and_sort_as_strings(tmp_path):
    lines = ["label,text"] + [f"{[10, 2, 0][i % 3]},text {i}" for i in range(100)]
    texts, labels, names = user_files.load_splits(_csv(tmp_path, lines), ("train",))["train"]
    assert names == ("0", "10", "2")
    assert all(
        names[y] == str([10, 2, 0][int(t.split()[1]) % 3])
        for t, y in zip(texts, labels, strict=True)
    )


def test_mixed_line_endings_and_line_numbers(tmp_path):
    p = tmp_path / "d.csv"
    body = "text,label\r\n" + "\n".join(GOOD[:50]) + "\r" + "\r\n".join(GOOD[50:]) + "\r\n"
    p.write_bytes((body + ",pos\r\n").encode())  # line 102: empty text
    with pytest.raises(UserError, match=r"1 of 101 rows malformed: line 102: empty text"):
        _load(str(p), max_bad_fraction=0.0)
    assert sum(len(t) for t, _, _ in _load(str(p)).values()) == 100


BAD_CASES = [
    (b"only text no comma", "missing label field"),
    (b"   ,pos", "empty text"),
    (b"fine text,maybe", "unknown label 'maybe'"),
    (b"bad \xff\xfe bytes,pos", "undecodable bytes"),
    (b"nul \x00 inside,pos", "NUL byte"),
    (b"fine text,  ", "empty label"),
]


@pytest.mark.parametrize("row, reason", BAD_CASES)
def test_each_malformed_row_is_reported_with_its_line(tmp_path, capsys, row, reason):
    p = tmp_path / "d.csv"
    good = "\n".join(GOOD[:60]).encode()
    p.write_bytes(b"text,label\n" + good + b"\n" + row + b"\n" + "\n".join(GOOD[60:]).encode())
    out = _load(str(p), max_bad_fraction=0.05, label_names=("neg", "pos"))
    assert sum(len(t) for t, _, _ in out.values()) == 100
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and f"1 of 101 rows malformed: line 62: {reason}" in err
    with pytest.raises(UserError, match=f"line 62: {reason}.*data.max_bad_fraction=0.005"):
        _load(str(p), max_bad_fraction=0.005, label_names=("neg", "pos"))


def test_a_file_read_twice_warns_once(tmp_path, capsys):
    # A run reads its file for the defaults and again for the splits: one warning, not two.
    path = _csv(tmp_path, ["text,label", *GOOD, ",pos"])
    _load(path, max_bad_fraction=0.05)
    _load(path, max_bad_fraction=0.05)
    assert capsys.readouterr().err.count("1 of 101 rows malformed") == 1


def test_threshold_and_first_few_listed(tmp_path, capsys):
    lines = ["text,label", *GOOD[:90]] + [f",pos{i}" for i in range(10)]  # 10 of 100 bad
    path = _csv(tmp_path, lines)
    _load(path, max_bad_fraction=0.1)  # exactly at the threshold: a warning
    err = capsys.readouterr().err
    assert "10 of 100 rows malformed: line 92: empty text; line 93: empty text" in err
    assert "(and 5 more)" in err
    with pytest.raises(UserError, match="10 of 100 rows malformed.*more than"):
        _load(path, max_bad_fraction=0.09)


def test_tsv_keeps_quotes_as_text(tmp_path):
    lines = ["id\ttext\tlabel"] + [f'{i}\tsaid "hi {i}\tx{i % 2}' for i in range(100)]
    out = _load(_csv(tmp_path, lines, name="d.tsv"))
    texts = [t for ts, _, _ in out.values() for t in ts]
    assert sorted(texts) == sorted(f'said "hi {i}' for i in range(100))


def test_jsonl(tmp_path, capsys):
    rows = [json.dumps({"review": f"text {i} 😀", "stars": i % 5}) for i in range(100)]
    rows[10] = "{broken"
    rows[20] = "[1, 2]"
    rows[30] = json.dumps({"review": 5, "stars": 1})
    p = tmp_path / "d.jsonl"
    p.write_bytes(("\r\n".join(rows[:50]) + "\n\n" + "\n".join(rows[50:])).encode())
    out = _load(str(p), text_field="review", label_field="stars", max_bad_fraction=0.05)
    assert out["train"][2] == ("0", "1", "2", "3", "4")
    err = capsys.readouterr().err
    assert "3 of 100 rows malformed: line 11: invalid JSON" in err
    assert "line 21: not a JSON object; line 31: text is a int, not a string" in err
    assert sum(len(t) for t, _, _ in out.values()) == 97


def test_jsonl_labels_true_and_false_are_classes_and_a_file_of_no_objects_says_why(tmp_path):
    rows = [json.dumps({"text": f"text {i}", "label": i % 3 == 0}) for i in range(60)]
    out = _load(_csv(tmp_path, rows, name="b.jsonl"))
    assert out["train"][2] == ("false", "true")
    texts, labels, _ = out["train"]
    assert all((int(t.split()[1]) % 3 == 0) == bool(y) for t, y in zip(texts, labels, strict=True))
    # Not one JSON object: the rows' own faults are named, not a missing field.
    with pytest.raises(UserError, match=r"2 of 2 rows malformed: line 1: invalid JSON"):
        _load(_csv(tmp_path, ["{broken", "[1]"], name="c.jsonl"))


def test_folder_with_split_subfolders(tmp_path):
    for split, n in (("train", 60), ("test", 20)):
        for label in ("pos", "neg", "unsup"):
            d = tmp_path / split / label
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"{i}_7.txt").write_text(f"{split} {label} review {i}\r\n")
    out = _load(str(tmp_path))
    assert out["train"][2] == ("neg", "pos")
    assert len(out["test"][0]) == 40 and len(out["train"][0]) + len(out["validation"][0]) == 120
    assert all(t.startswith("test ") for t in out["test"][0])
    assert all(splits.held_out(t) for t in out["validation"][0])
    assert not any(splits.held_out(t) for t in out["train"][0])
    for texts, labels, names in out.values():
        assert all(t.split()[1] == names[y] for t, y in zip(texts, labels, strict=True))


def test_flat_folder_and_bad_file_named(tmp_path, capsys):
    for label in ("good", "bad"):
        (tmp_path / label).mkdir()
        for i in range(50):
            (tmp_path / label / f"{i}.txt").write_text(f"{label} {i}")
    (tmp_path / "bad" / "empty.txt").write_text("  \n")
    out = _load(str(tmp_path), max_bad_fraction=0.02)
    assert sum(len(t) for t, _, _ in out.values()) == 100 and out["test"][2] == ("bad", "good")
    assert "bad/empty.txt: empty text" in capsys.readouterr().err


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: str(d / "nope.csv"), "does not exist"),
        (lambda d: _csv(d, []), "is empty"),
        (lambda d: _csv(d, ["", "  "]), "is empty"),
        (lambda d: _csv(d, ["text,label"]), "header but no data rows"),
        (lambda d: _csv(d, ["review,label", "a,b"]), r"no column 'text' \(data.text_field\)"),
        (lambda d: _csv(d, ["text,stars", "a,b"]), r"no column 'label' \(data.label_field\)"),
        (lambda d: _csv(d, ["text;label", "a;b"]), r"separated by ';': a .csv needs commas"),
        (lambda d: _csv(d, ["text\tlabel", "a\tb"]), r"separated by '\\t': a .csv needs"),
        (lambda d: _csv(d, ['{"x": 1}'], name="d.jsonl"), "no row has the field 'text'"),
        (lambda d: _csv(d, ["a,b"], name="d.xlsx"), "unknown file type '.xlsx'"),
        (lambda d: _csv(d, ["text,label", "a,pos", "b,pos"]), "every row has the label 'pos'"),
        (lambda d: str(d), "has no <label>/\\*.txt files"),
        (lambda d: "", "data.path is empty"),
    ],
)
def test_file_level_errors(tmp_path, make, match):
    with pytest.raises(UserError, match=match):
        _load(make(tmp_path))


def test_binary_file(tmp_path):
    p = tmp_path / "d.csv"
    p.write_bytes(bytes(range(256)) * 40)
    with pytest.raises(UserError, match="looks binary"):
        _load(str(p))
    p.write_text("text,label\nhello,pos\n", encoding="utf-16")
    with pytest.raises(UserError, match="is UTF-16 text; save it as UTF-8"):
        _load(str(p))
    p.write_bytes("text,label\nhello,pos\n".encode("utf-16-le") * 10)  # no BOM
    with pytest.raises(
        UserError, match=r"is UTF-16 text; save it as UTF-8 \(iconv -f UTF-16 -t UTF-8 does\)"
    ):
        _load(str(p))


# Reviews as spreadsheet users write them, each saved in the encoding its Windows would use.
SIMPLIFIED = [
    "这本书很好看，推荐给大家。",
    "服务态度非常好，房间也很干净。",
    "质量太差了，不会再买。",
]
TRADITIONAL = [
    "這本書很好看，推薦給大家。",
    "服務態度非常好，房間也很乾淨。",
    "質量太差了，不會再買。",
]
JAPANESE = [
    "この映画はとても面白かったです。",
    "サービスが悪くて、二度と行きません。",
    "値段の割に品質が良い。",
]
FRENCH = [
    "très bon café à Noël, je recommande",
    "Ça ne marche pas du tout, déçu",
    "L’hôtel était « parfait »",
]
GERMAN = ["Größe passt, schöne Qualität", "Überhaupt nicht zufrieden", "Äußerst gut verarbeitet"]
SPANISH = ["El envío llegó rápido", "¡Me encantó! Excelente atención", "¿Vale la pena? No, señor."]
# Every accent inside a word, some in pairs of high bytes: read as GBK these are valid pairs.
GERMAN_WORDS = ["Größe schön", "übermäßig Gefäß", "Straße Maße", "Äußerung"]


@pytest.mark.parametrize(
    "texts, codec, named, iconv",
    [
        (SIMPLIFIED, "gbk", "GBK/GB18030", "GB18030"),
        (SIMPLIFIED, "gb18030", "GBK/GB18030", "GB18030"),
        (TRADITIONAL, "gbk", "GBK/GB18030", "GB18030"),  # GBK holds traditional characters too
        (TRADITIONAL, "big5", "Big5", "BIG5"),
        (JAPANESE, "shift_jis", "Shift-JIS", "SHIFT_JIS"),
        (JAPANESE, "cp932", "Shift-JIS", "SHIFT_JIS"),  # Windows' Shift-JIS
        (FRENCH, "cp1252", "Windows-1252 or Latin-1", "WINDOWS-1252"),
        (GERMAN, "latin-1", "Windows-1252 or Latin-1", "WINDOWS-1252"),
        (SPANISH, "cp1252", "Windows-1252 or Latin-1", "WINDOWS-1252"),
        (GERMAN_WORDS, "latin-1", "Windows-1252 or Latin-1", "WINDOWS-1252"),
        (["好", "差", "棒"], "gbk", "GBK/GB18030", "GB18030"),  # one character a row
    ],
)
def test_a_file_not_in_utf8_names_its_encoding(tmp_path, texts, codec, named, iconv):
    p = tmp_path / "d.csv"
    rows = [f"{t},{'pos' if i % 2 else 'neg'}" for i, t in enumerate(texts * 40)]
    p.write_bytes(("text,label\n" + "\n".join(rows) + "\n").encode(codec))
    with pytest.raises(UserError, match="is not UTF-8 but ") as e:
        _load(str(p))
    assert f"is not UTF-8 but {named}" in str(e.value)
    assert f"(iconv -f {iconv} -t UTF-8 does)" in str(e.value)


def test_an_encoding_not_recognised_is_not_guessed(tmp_path):
    p = tmp_path / "d.csv"
    p.write_bytes(b"text,label\n" + b"\x80\xff\x80\xff\x80\xff,pos\n" * 50)
    with pytest.raises(UserError, match="is not UTF-8, nor any encoding recognised; save it as"):
        _load(str(p))


def test_bad_arguments_and_tiny_split(tmp_path):
    path = _csv(tmp_path, ["text,label", "a,pos", "b,neg"])
    with pytest.raises(UserError, match="max_bad_fraction must be in"):
        _load(path, max_bad_fraction=1.5)
    with pytest.raises(UserError, match="split='dev'"):
        user_files.load_splits(path, ("dev",))
    empty = next(s for s, (t, _, _) in _load(path).items() if not t)
    with pytest.raises(UserError, match=f"split '{empty}' is empty"):
        user_files.load_splits(path, ("train", empty))


def test_a_label_seen_once_is_refused_naming_its_row(tmp_path):
    rows = [f"review {i},{'pos' if i % 2 else 'neg'}" for i in range(40)]
    rows.insert(17, "review odd,neutral")
    path = tmp_path / "r.csv"
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        user_files.load(str(path))
    assert "'neutral' (1 row: line 19)" in str(e.value) and "\n" not in str(e.value)
    # Either declaration is a fix: without it the row is a bad one, with it a class.
    skipped = user_files.load(str(path), label_names=("neg", "pos"), max_bad_fraction=0.05)
    assert skipped["train"][2] == ("neg", "pos")
    kept = user_files.load(str(path), label_names=("neg", "neutral", "pos"))
    assert sum(int((y == 1).sum()) for _, y, _ in kept.values()) == 1


def test_a_misspelt_label_is_refused_not_trained_as_a_class(tmp_path):
    # 900 rows, 3 of which say `negativ`: they used to become a third class after a warning.
    labels = ["positive", "negative"] * 450
    for i in (40, 41, 700):
        labels[i] = "negativ"
    path = _csv(tmp_path, ["text,label", *(f"review {i},{y}" for i, y in enumerate(labels))])
    with pytest.raises(UserError) as e:
        user_files.load(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert "'negativ' (3 rows: line 42, line 43, line 702; spelt like 'negative'" in msg
    assert "Fix those rows" in msg
    assert """--config.data.label_names="('negative', 'positive')\"""" in msg
    assert "add a label to that list to keep it as a class" in msg
    assert user_files.load(path, label_names=("negative", "positive"))["train"][2] == (
        "negative",
        "positive",
    )


def test_every_rare_label_is_named_in_one_line_with_the_label_meant(tmp_path):
    # 300 rows: 4 of them (1.3%) say `postive`; 2 say `neutral`, spelt like no other label.
    labels = ["positive", "negative"] * 147
    labels[10:14] = ["postive"] * 4
    labels[100:102] = ["neutral"] * 2
    labels += ["Negative ", "negative", "positive", "negative", "positive", "negative"]
    rows = [f"review {i},{label}" for i, label in enumerate(labels)]
    path = tmp_path / "r.csv"
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        user_files.load(str(path))
    msg = str(e.value)
    assert "'Negative' (1 row: line 296; spelt like 'negative', 147 rows)" in msg
    assert "'neutral' (2 rows: line 102, line 103)," in msg
    assert (
        "'postive' (4 rows: line 12, line 13, line 14, line 15; spelt like 'positive', 146 rows)"
        in msg
    )
    # Skipping 7 of 300 rows is more than the default 1% of bad rows: the advice says so.
    flag = """--config.data.label_names="('negative', 'positive')" """
    assert flag + "--config.data.max_bad_fraction=0.03" in msg
    out = user_files.load(str(path), label_names=("negative", "positive"), max_bad_fraction=0.03)
    assert out["train"][2] == ("negative", "positive")


def test_labels_that_are_merely_few_or_alike_are_not_warned_about(tmp_path, capsys):
    # Ten classes of 3-5% each, named alike: no class is rare next to the others.
    rows = [f"review {i},label_{i % 10 if i < 270 else 0}" for i in range(300)]
    path = _csv(tmp_path, ["text,label", *rows])
    assert len(user_files.load(path)["train"][2]) == 10
    assert "warning" not in capsys.readouterr().err


def test_the_advice_for_a_label_seen_once_is_a_flag_that_works(tmp_path, capsys):
    rows = [f"review {i},{'pos' if i % 2 else 'neg'}" for i in range(200)] + ["review x,neutral"]
    path = tmp_path / "r.csv"
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    base = ["--config=configs/csv.py:tiny", f"--config.data.path={path}"]
    proc = run_here("experiments.data_info", *base, capsys=capsys)
    # The refusal names the flag to pass, quoted for a shell.
    error = assert_one_line_error(proc, "'neutral' (1 row: line 202)")
    value = re.search(r'--config\.data\.label_names="([^"]+)"', error)[1]
    proc = run_here(
        "experiments.data_info", *base, f"--config.data.label_names={value}", capsys=capsys
    )
    assert proc.returncode == 0 and "labels ['neg', 'pos']" in proc.stdout
    assert "line 202: unknown label 'neutral'" in proc.stderr


def _reviews(n: int) -> list[str]:
    return [
        f"评论{i}很{'好' if i % 2 else '差'},{'positive' if i % 2 else 'negative'}"
        for i in range(n)
    ]


def test_a_quote_that_never_closes_is_named_and_every_line_it_swallows_counts(tmp_path):
    rows = _reviews(499)
    rows[14] = '"未闭合的引号，positive'  # line 16 of the file
    path = _csv(tmp_path, ["text,label", *rows])
    message = (
        "485 of 499 rows malformed: line 16: a quote opens here and never closes, so lines 16-500 "
        "would be read as one field"
    )
    for fraction in (0.01, 0.5):  # not "1 of 15 rows": 485 rows are lost
        with pytest.raises(UserError, match=message):
            _load(path, max_bad_fraction=fraction)


def test_a_quote_that_closes_rows_later_is_named(tmp_path, capsys):
    rows = _reviews(999)
    rows[14] = '"未闭合的引号，positive'
    rows[20] = '他说"好",positive'  # the quote closes here, on line 22
    path = _csv(tmp_path, ["text,label", *rows])
    with pytest.raises(UserError, match="line 16: a quote opens here and closes only on line 22"):
        _load(path, max_bad_fraction=0.005)
    out = _load(path)  # 7 of 999 is under 1%: a warning, and the 7 are not trained on
    err = capsys.readouterr().err
    assert "7 of 999 rows malformed: line 16: a quote opens here and closes only on line 22" in err
    assert sum(len(t) for t, _, _ in out.values()) == 992
    assert not any("未闭合" in t for texts, _, _ in out.values() for t in texts)


def test_a_row_with_an_extra_field_is_malformed(tmp_path, capsys):
    rows = _reviews(200)
    rows[9] = "很好,positive,extra"
    out = _load(_csv(tmp_path, ["text,label", *rows]))
    err = capsys.readouterr().err
    assert "1 of 200 rows malformed: line 11: 3 fields where the header has 2" in err
    assert sum(len(t) for t, _, _ in out.values()) == 199
    tsv = _csv(tmp_path, ["text\tlabel", *(r.replace(",", "\t") for r in rows)], name="d.tsv")
    with pytest.raises(UserError, match=r"line 11: 3 fields where the header has 2 \(a tab in"):
        _load(tsv, max_bad_fraction=0.0)
