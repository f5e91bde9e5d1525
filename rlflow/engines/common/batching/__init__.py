"""Micro-batching and packing: the micro-batch plan (fixed or by token budget), the token streams a
micro-batch is laid out in (padded or packed rows), prefix sharing and the ``sdpa_varlen`` attention."""
