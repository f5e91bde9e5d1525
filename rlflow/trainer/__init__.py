"""The RL trainer: the driver loop, its entry points and the batch math it runs (``core_algos``)."""
