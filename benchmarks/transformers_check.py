"""Exported directories against transformers itself: each loads with AutoTokenizer and
AutoModelForSequenceClassification (trust_remote_code for a mean-pooled one) with nothing missing,
unexpected or mismatched, its tokenizer gives the ids attn read, and its probabilities are attn's,
also through pipeline("text-classification"), which must log no error;
so are those of DIR/model.onnx (export --onnx) under ONNX Runtime, where both exist. attn never
imports torch or transformers: run this file in an environment that has them (torch, transformers
4.x, sentencepiece and protobuf for DeBERTa's tokenizer), e.g.

    python -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch "transformers==4.57.6" safetensors tokenizers \
        sentencepiece protobuf
    /tmp/refvenv/bin/python benchmarks/transformers_check.py EXPECTED.json [RESULT.json]

EXPECTED.json, from benchmarks/probes/export_runs.py (attn's side): {name: {"dir": an exported
directory, "texts": [...], "ids": [the checkpoint's ids attn read for each text], "probabilities":
[attn predict's, per text], "tokenized": {text: the whole ids attn's tokenizer gives, [CLS] and
[SEP] around, nothing cut}}}. Prints one row per directory and, with RESULT.json, writes them
there; exits 1 when any directory fails (tolerance 1e-4 on the probabilities).
"""

import json
import logging
import sys

import torch
import transformers

TOLERANCE = 1e-4


def check(entry: dict) -> dict:
    """One directory: the load's faults, whether the ids match, the largest probability gap."""
    directory = entry["dir"]
    config = json.load(open(f"{directory}/config.json", encoding="utf-8"))
    remote = "auto_map" in config
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        directory, trust_remote_code=remote, output_loading_info=True
    )
    model.eval()
    faults = {k: sorted(v) for k, v in info.items() if v and k != "error_msgs"}
    faults.update({"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    ids_match = True
    gap = 0.0
    for text, ids, want in zip(entry["texts"], entry["ids"], entry["probabilities"], strict=True):
        batch = tokenizer([text], return_tensors="pt")
        ids_match &= batch["input_ids"][0].tolist() == ids
        with torch.no_grad():
            got = model(**batch).logits.softmax(-1)[0].double()
        gap = max(gap, float((got - torch.tensor(want, dtype=torch.float64)).abs().max()))
    for text, ids in entry.get("tokenized", {}).items():
        ids_match &= tokenizer(text)["input_ids"] == ids
    onnx_gap = _onnx_gap(directory, tokenizer, entry)
    errors, pipeline_gap = _pipeline(directory, remote, entry)
    return {
        "class": type(model).__name__,
        "tokenizer": type(tokenizer).__name__,
        "load_faults": faults,
        "ids_match": ids_match,
        "max_probability_gap": gap,
        "onnx_max_probability_gap": onnx_gap,
        "pipeline_errors": errors,
        "pipeline_max_probability_gap": pipeline_gap,
        "ok": not faults
        and not errors
        and ids_match
        and max(gap, onnx_gap or 0.0, pipeline_gap) <= TOLERANCE,
    }


class _Errors(logging.Handler):
    """The error-level lines transformers logs, kept."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage()[:200])


def _pipeline(directory: str, remote: bool, entry: dict) -> tuple[list[str], float]:
    """pipeline("text-classification") on the directory, as a transformers user first tries it:
    the error lines it logs, and the largest gap between its scores and attn's probabilities."""
    errors = _Errors()
    logger = logging.getLogger("transformers")
    logger.addHandler(errors)
    try:
        classify = transformers.pipeline(
            "text-classification", model=directory, trust_remote_code=remote, top_k=None
        )
        answers = classify(list(entry["texts"]))
    finally:
        logger.removeHandler(errors)
    label2id = classify.model.config.label2id
    gap = max(
        abs(a["score"] - want[label2id[a["label"]]])
        for answer, want in zip(answers, entry["probabilities"], strict=True)
        for a in answer
    )
    return errors.lines, float(gap)


def _onnx_gap(directory: str, tokenizer, entry: dict) -> float | None:
    """The largest probability gap of DIR/model.onnx under ONNX Runtime, every text in one padded
    batch; None when there is no model.onnx or no onnxruntime."""
    try:
        import onnxruntime
    except ImportError:
        return None
    path = f"{directory}/model.onnx"
    try:
        session = onnxruntime.InferenceSession(path)
    except Exception:  # noqa: BLE001 (no such file, among others)
        return None
    batch = tokenizer(entry["texts"], padding=True, return_tensors="np")
    feed = {i.name: batch[i.name].astype("int64") for i in session.get_inputs()}
    logits = torch.tensor(session.run(None, feed)[0], dtype=torch.float64)
    want = torch.tensor(entry["probabilities"], dtype=torch.float64)
    return float((logits.softmax(-1) - want).abs().max())


def main(argv: list[str]) -> int:
    expected = json.load(open(argv[1], encoding="utf-8"))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    rows = {name: check(entry) for name, entry in expected.items()}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, r in rows.items():
        print(
            f"{'ok  ' if r['ok'] else 'FAIL'} {name}: {r['class']} + {r['tokenizer']}, ids "
            f"{'match' if r['ids_match'] else 'DIFFER'}, max |p - attn's| "
            f"{r['max_probability_gap']:.1e}"
            + (
                f", ONNX Runtime {r['onnx_max_probability_gap']:.1e}"
                if r["onnx_max_probability_gap"] is not None
                else ""
            )
            + f", pipeline {r['pipeline_max_probability_gap']:.1e}"
            + (f", load faults {r['load_faults']}" if r["load_faults"] else "")
            + (f", pipeline errors {r['pipeline_errors']}" if r["pipeline_errors"] else "")
        )
    if len(argv) > 2:
        versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        with open(argv[2], "w", encoding="utf-8") as f:
            json.dump({"versions": versions, "rows": rows}, f, indent=2)
    return 0 if all(r["ok"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
