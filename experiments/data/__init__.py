"""Text to batches: datasets (TFDS and the embedded corpus), user files, the hash split every
dataset uses, tokenizers, encoding and batching."""
