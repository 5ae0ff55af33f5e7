"""An attn classifier exported with jax.export, served with jax and numpy alone.

    import load
    model = load.Classifier("exported/student")
    model.probabilities(["a text", "另一条评论"])   # float32 [N, C], in model.label_names' order
    model.predict(["a text"])                         # [(label, probability)]

    python load.py TEXT ...                           # a label and its probability per line

The directory holds model.jax (the forward as serialized StableHLO, batch and length symbolic),
weights.npz, the tokenizer's vocab.txt and tokenizer.json, and classifier.json. A text is read as
training read it: the same tokens (characters, words or UTF-8 bytes; ids 0, 1, 2 are padding,
unknown and CLS), a longer text cut to its first and last tokens, and texts are batched as
predict batches them (sorted by length, each batch padded to the first length bucket that holds
it), so the probabilities are predict's. This file is copied into the directory by attn's
export; it imports nothing of attn.
"""

import json
import re
import sys
from pathlib import Path

import numpy as np
from jax import export

PAD, UNK, CLS = 0, 1, 2
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")
_ESCAPE = re.compile(r"\\u([0-9a-f]{6})")


class Classifier:
    def __init__(self, directory: str | Path):
        d = Path(directory)
        self.spec = json.loads((d / "classifier.json").read_text(encoding="utf-8"))
        self.label_names = tuple(self.spec["label_names"])
        self.forward = export.deserialize(bytearray((d / "model.jax").read_bytes()))
        with np.load(d / "weights.npz") as f:
            self.weights = _tree({k: f[k] for k in f.files})
        lines = (d / "vocab.txt").read_bytes().decode("utf-8").split("\n")[:-1]
        vocab = [
            _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), x.removesuffix("\r")) for x in lines
        ]
        self.ids = {t: i for i, t in enumerate(vocab) if i > CLS}

    def encode(self, text: str) -> np.ndarray:
        """The ids of a whole text, int32 (no CLS, not cut)."""
        s = self.spec
        if not text.strip():
            raise ValueError("text is empty")
        text = text.lower() if s["lowercase"] else text
        if s["tokenizer"] == "byte":
            raw = text.encode("utf-8", "surrogatepass")
            return np.frombuffer(raw, np.uint8).astype(np.int32) + 3
        units = list(text) if s["tokenizer"] == "char" else _WORD.findall(text)
        return np.array([self.ids.get(u, UNK) for u in units], np.int32)

    def probabilities(self, texts: list[str]) -> np.ndarray:
        """float32 [N, C]: each text's class probabilities."""
        s = self.spec
        raw = [self.encode(t) for t in texts]
        ids = [_cut(x, s["max_len"], s["tail_len"], s["add_cls"]) for x in raw]
        bag = None
        if s["bag_len"]:
            keep = s["max_len"] - s["add_cls"]
            tail = s["tail_len"] * (s["bag_len"] - s["add_cls"]) // keep if keep else 0
            bag = [_cut(x, s["bag_len"], tail, s["add_cls"]) for x in raw]
        sizes = _sizes(s["buckets"], s["max_len"])
        if bag is not None:
            bag_sizes = _sizes([*s["buckets"], *_doubled(s["max_len"], s["bag_len"])], s["bag_len"])
        out = np.zeros((len(texts), len(self.label_names)), np.float32)
        order = np.argsort([len(x) for x in ids], kind="stable")
        for start in range(0, len(order), s["batch_size"]):
            idx = order[start : start + s["batch_size"]]
            args = [self.weights, _padded([ids[i] for i in idx], sizes)]
            if bag is not None:
                args.append(_padded([bag[i] for i in idx], bag_sizes))
            out[idx] = np.asarray(self.forward.call(*args))
        return out

    def predict(self, texts: list[str]) -> list[tuple[str, float]]:
        """The most probable label of each text, with its probability."""
        probs = self.probabilities(texts)
        return [(self.label_names[int(p.argmax())], float(p.max())) for p in probs]


def _tree(flat: dict[str, np.ndarray]) -> dict:
    """{"a/b": x} -> {"a": {"b": x}}: the weights' tree, as the forward was exported over."""
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def _cut(ids: np.ndarray, max_len: int, tail_len: int, add_cls: bool) -> np.ndarray:
    """A longer text keeps its first max_len - tail_len tokens (CLS counted) and its last
    tail_len."""
    keep = max_len - add_cls
    if len(ids) > keep:
        ids = np.concatenate([ids[: keep - tail_len], ids[len(ids) - tail_len :]])
    return np.concatenate([np.array([CLS] * add_cls, np.int32), ids]).astype(np.int32)


def _doubled(max_len: int, bag_len: int) -> list[int]:
    out, m = [], max_len
    while m < bag_len:
        out.append(m)
        m *= 2
    return out


def _sizes(buckets: list[int], max_len: int) -> list[int]:
    return sorted({b for b in buckets if b < max_len} | {max_len})


def _padded(rows: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    longest = max(len(r) for r in rows)
    length = next((s for s in sizes if s >= longest), sizes[-1])
    out = np.full((len(rows), length), PAD, np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r[:length])] = r[:length]
    return out


if __name__ == "__main__":
    model = Classifier(Path(__file__).parent)
    for label, p in model.predict(sys.argv[1:]):
        print(f"{label}\t{p:.3f}")
