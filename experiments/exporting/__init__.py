"""Exporting a trained workdir: a fine-tune as a transformers model directory (`hub_dir`), with the
modeling file it ships for a mean-pooled classifier (`mean_pooled`, read by transformers, never
imported here); attn's own model as a directory jax serves without this repository (`jax_dir`,
with its loader `jax_loader`, copied there, never imported here)."""
