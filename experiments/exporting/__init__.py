"""Exporting a fine-tuned workdir as a transformers model directory (`hub_dir`), and the modeling
file it ships for a mean-pooled classifier (`mean_pooled`, read by transformers, never imported
here)."""
