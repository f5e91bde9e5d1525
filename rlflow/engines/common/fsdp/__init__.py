"""FSDP2 helpers: ``FullyShardEngine`` (the hooks fsdp2 and torchtitan share: deferred gradient reduction,
gathered parameters, placement, gradient clipping) and the compiled decoder layer of fsdp2's ``compile``."""
