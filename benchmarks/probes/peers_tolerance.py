"""What the peers section's numerics check must catch: attn's own encoder with the two slips a
port of BERT most often makes, against itself, next to `peers.tolerance`.

  PYTHONPATH=. python benchmarks/probes/peers_tolerance.py DIR/all-MiniLM-L6-v2

On the section's serving-style batch of 16 x 128 (real lengths 64 to 128): max |difference| over
real tokens' last hidden states with GELU's tanh approximation instead of erf, and with a
LayerNorm eps of 1e-5 instead of the checkpoint's 1e-12.
"""

import dataclasses
import sys

import jax
import numpy as np

from attn import bert
from benchmarks import peers


def main(bert_dir: str) -> None:
    params, enc = bert.load(bert_dir)
    b = peers.make_batch(enc.vocab_size, 16, 128, seed=1)
    ids, real = b["tokens"], b["mask"]

    def hidden(cfg: bert.Config) -> np.ndarray:
        return np.asarray(jax.jit(bert.encode, static_argnums=1)(params, cfg, ids, real))

    ref = hidden(enc)
    exact = jax.nn.gelu
    jax.nn.gelu = lambda x, approximate=False: exact(x, approximate=True)
    # Another (unused in evaluation) dropout rate: a new static config, so a new trace.
    tanh = hidden(dataclasses.replace(enc, dropout=enc.dropout / 2))
    jax.nn.gelu = exact
    eps = hidden(dataclasses.replace(enc, layer_norm_eps=1e-5))
    largest = float(np.abs(ref[real]).max())
    print(f"largest |value| {largest:.2f}; tolerance {peers.tolerance(enc, largest):.2e}")
    print(f"tanh GELU:          {np.abs(ref - tanh)[real].max():.2e}")
    print(f"LayerNorm eps 1e-5: {np.abs(ref - eps)[real].max():.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
