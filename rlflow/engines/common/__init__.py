"""Machinery shared by every engine: batching, packing, log-probs, loss scaling, optimizers, checkpoints."""
