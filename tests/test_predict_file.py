"""predict --path: every row of a file classified in batches, its columns kept, one output row per
input row, bad rows named without losing the rest."""

import csv
import json

import numpy as np
import pytest
from conftest import assert_one_line_error, run_here

from experiments import predict, serving

ROWS = [  # (id, text, note): a quoted text across lines, a comma inside, an empty one
    ("1", "质量很好，很满意", "short"),
    ("2", "第一行\n第二行，质量太差了\n\n第四行", "three line breaks"),
    ("3", "", "empty"),
    ("4", "还行, 一般般", "a comma"),
]


def _csv(path, rows=ROWS, header=("id", "text", "note")) -> str:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def _read_csv(path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_every_row_is_answered_in_order_with_its_columns_kept(trained_copy, tmp_path, capsys):
    src = _csv(tmp_path / "in.csv")
    with open(src, "a", encoding="utf-8") as f:
        f.write('5,"a,b",wide,extra\n')  # more fields than the header
    out = tmp_path / "out.csv"
    proc = run_here(
        "experiments.predict",
        f"--workdir={trained_copy}",
        f"--path={src}",
        f"--out={out}",
        capsys=capsys,
    )
    assert proc.returncode == 2  # some rows failed; the others are written
    assert "error: line 7: text is empty" in proc.stderr  # row 2 spans lines 3-6
    assert "error: line 9: 4 fields where the header has 3" in proc.stderr
    assert "3 of 5 rows answered" in proc.stderr
    rows = _read_csv(out)
    trained = serving.load(trained_copy)
    names = trained.label_names
    assert list(rows[0]) == [
        "id",
        "text",
        "note",
        "predicted",
        "probability",
        *(f"prob_{n}" for n in names),
        "error",
    ]
    assert [r["id"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r["text"] for r in rows[:4]] == [text for _, text, _ in ROWS]
    assert rows[1]["note"] == "three line breaks"
    for r, (_, text, _) in zip(rows, ROWS, strict=False):
        if not text:
            assert r["predicted"] == "" and r["error"] == "text is empty"
            continue
        probs = np.array([float(r[f"prob_{n}"]) for n in names])
        assert r["predicted"] == names[int(probs.argmax())] and r["error"] == ""
        assert float(r["probability"]) == probs.max() and abs(probs.sum() - 1) < 1e-5
        # The same model on the same ids as predict's one-text answer: batches pad to another
        # length, and padded keys are masked, so only float32 rounding differs.
        one = predict.predict_one(trained, text, top=1)
        assert one["label"] == r["predicted"]
        assert float(r["probability"]) == pytest.approx(one["probability"], abs=1e-5)
    assert rows[4]["error"] == "4 fields where the header has 3 (a comma in the text?)"


def test_jsonl_in_and_out_keep_every_value(trained_copy, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    lines = [
        {"text": "质量很好", "stars": 5, "tags": ["a", "b"]},
        "not json",
        {"text": 3},
        {"review": "no text field here"},
    ]
    src.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines)
        + "\n",
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"
    proc = run_here(
        "experiments.predict",
        f"--workdir={trained_copy}",
        f"--path={src}",
        f"--out={out}",
        capsys=capsys,
    )
    assert proc.returncode == 2
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(got) == 4
    assert got[0]["stars"] == 5 and got[0]["tags"] == ["a", "b"] and "error" not in got[0]
    assert got[0]["predicted"] in serving.load(trained_copy).label_names
    assert got[1]["error"].startswith("invalid JSON")
    assert got[2] == {"text": 3, "error": "'text' is a int, not a string"}
    assert got[3]["error"] == "no text" and got[3]["review"] == "no text field here"


def test_a_quote_that_never_closes_is_that_rows_error(trained_copy, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_text('id,text\n1,很好\n2,"很差\n3,一般\n', encoding="utf-8")
    out = tmp_path / "out.csv"
    proc = run_here(
        "experiments.predict",
        f"--workdir={trained_copy}",
        f"--path={src}",
        f"--out={out}",
        capsys=capsys,
    )
    assert proc.returncode == 2
    assert "error: line 3: a quote opens here and never closes, so lines 3-4" in proc.stderr
    rows = _read_csv(out)
    assert [r["id"] for r in rows] == ["1", "2"] and rows[0]["error"] == ""


@pytest.mark.parametrize(
    "make, more, fragments",
    [
        (lambda d: _csv(d / "in.csv"), ["--out={d}/taken.csv"], ["taken.csv exists"]),
        (lambda d: _csv(d / "in.csv"), ["--out={d}/out.txt"], ["writes .csv or .jsonl files"]),
        (lambda d: _csv(d / "in.csv"), ["--text_field=review"], ["no column 'review'"]),
        (
            lambda d: _csv(d / "in.csv", header=("id", "text", "predicted")),
            [],
            ["already has the column(s) ['predicted']"],
        ),
        (lambda d: str(d / "none.csv"), [], ["none.csv: no such file"]),
        (lambda d: _csv(d / "in.csv"), ["some text"], ["pass texts or --path=FILE, not both"]),
    ],
)
def test_what_cannot_be_written_is_refused_before_anything_is(
    trained, tmp_path, capsys, make, more, fragments
):
    (tmp_path / "taken.csv").write_text("mine\n", encoding="utf-8")
    src = make(tmp_path)
    args = [m.format(d=tmp_path) for m in more]
    proc = run_here(
        "experiments.predict", f"--workdir={trained}", f"--path={src}", *args, capsys=capsys
    )
    assert_one_line_error(proc, *fragments)
    assert (tmp_path / "taken.csv").read_text(encoding="utf-8") == "mine\n"
    assert not (tmp_path / "out.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".predict-")) == []


def test_stdout_gets_csv_without_out(trained, tmp_path, capsys):
    src = _csv(tmp_path / "in.csv", rows=ROWS[:2])
    proc = run_here("experiments.predict", f"--workdir={trained}", f"--path={src}", capsys=capsys)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(proc.stdout.splitlines(keepends=True)))
    assert [r["text"] for r in rows] == [ROWS[0][1], ROWS[1][1]]
    assert all(r["predicted"] for r in rows)
