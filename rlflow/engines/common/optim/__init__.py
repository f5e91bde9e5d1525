"""Optimizer and offload: AdamW with its decay groups and kernels, the LR schedule registry, the optimizer
step (clip, skip, per-step overrides), and host offload of parameters and optimizer state."""
