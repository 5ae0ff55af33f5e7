"""`benchmarks/bert.py`'s fine-tuning step in PyTorch, with attention by
`torch.nn.functional.scaled_dot_product_attention` (SDPA): the peer `python -m benchmarks device`
times attn's implementations against, on the same device. PyTorch is no dependency of attn:
device.py imports this module only when torch is installed.

The same step: BERT's encoder (word + position + token type embeddings, LayerNorm, post-LayerNorm
blocks, exact GELU) at `bert.Config`'s sizes, mean pooling over real tokens, a linear head,
cross-entropy, AdamW (lr 1e-4, weight decay 0.01, as bert.py's optax.adamw); hidden dropout on,
attention dropout off. Eager PyTorch, random parameters; compute in float32, or in bfloat16
under autocast with float32 parameters (attn's dtype does the same). As Hugging Face's BertModel
does with SDPA, a batch without padding passes no mask, so PyTorch may choose its flash kernel.
"""

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attn import bert


def unavailable(platform: str) -> str | None:
    """Why the step cannot run on JAX's `platform` ("cpu", "gpu", "tpu"), or None."""
    if platform == "gpu" and not torch.cuda.is_available():
        return f"this PyTorch ({torch.__version__}) has no CUDA device"
    if platform not in ("cpu", "gpu"):
        return f"PyTorch runs on CUDA GPUs and CPUs, not on a {platform.upper()}"
    return None


class _Block(nn.Module):
    def __init__(self, cfg: bert.Config):
        super().__init__()
        d = cfg.d_model
        self.num_heads = cfg.num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ff_in, self.ff_out = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)
        self.ln_attn = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.ln_ff = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x_BxLxD: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        b, n, d = x_BxLxD.shape

        def heads(t_BxLxD: torch.Tensor) -> torch.Tensor:  # -> [B, H, L, K]
            return t_BxLxD.view(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)

        q, k, v = (heads(f(x_BxLxD)) for f in (self.q, self.k, self.v))
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        mixed_BxLxD = mixed.transpose(1, 2).reshape(b, n, d)
        x_BxLxD = self.ln_attn(x_BxLxD + self.dropout(self.o(mixed_BxLxD)))
        ff_BxLxD = self.ff_out(F.gelu(self.ff_in(x_BxLxD)))
        return self.ln_ff(x_BxLxD + self.dropout(ff_BxLxD))


class _Classifier(nn.Module):
    def __init__(self, cfg: bert.Config, num_classes: int = 2):
        super().__init__()
        d = cfg.d_model
        self.word = nn.Embedding(cfg.vocab_size, d)
        self.position = nn.Embedding(cfg.max_positions, d)
        self.token_type = nn.Embedding(cfg.type_vocab_size, d)
        self.ln = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.num_layers))
        self.head = nn.Linear(d, num_classes)

    def forward(
        self, ids_BxL: torch.Tensor, mask_BxL: torch.Tensor, keep: torch.Tensor | None
    ) -> torch.Tensor:
        positions_L = torch.arange(ids_BxL.shape[1], device=ids_BxL.device)
        x_BxLxD = self.word(ids_BxL) + self.position(positions_L)[None]
        x_BxLxD = self.dropout(self.ln(x_BxLxD + self.token_type(torch.zeros_like(ids_BxL))))
        for block in self.blocks:
            x_BxLxD = block(x_BxLxD, keep)
        real_BxLx1 = mask_BxL[..., None].to(x_BxLxD.dtype)
        pooled_BxD = (x_BxLxD * real_BxLx1).sum(1) / real_BxLx1.sum(1)
        return self.head(pooled_BxD.float())


def step(cfg: bert.Config, batch: dict, dtype: str, platform: str) -> Callable[[], float]:
    """One fine-tuning step on `batch` (bert.make_batch's), ready to call repeatedly; each call
    returns the loss, which waits for the device."""
    device = torch.device("cuda" if platform == "gpu" else "cpu")
    torch.manual_seed(0)
    model = _Classifier(cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids_BxL = torch.as_tensor(batch["ids"], dtype=torch.long, device=device)
    mask_BxL = torch.as_tensor(batch["mask"], device=device)
    label_B = torch.as_tensor(batch["label"], dtype=torch.long, device=device)
    keep = None if np.all(batch["mask"]) else mask_BxL[:, None, None, :]  # True = attend

    def run() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = F.cross_entropy(model(ids_BxL, mask_BxL, keep), label_B)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return run
