"""Config loading for every entry point: Hydra composition, choice checks, verl key handling, the dtype guard.

This package sits above the engines, rollouts and registries whose names it checks, and below the
drivers (``rlflow.trainer``) and the Tinker service (``rlflow.service``), which each describe
their entry point as an ``EntryPoint`` (``entry_point.py``). The rest of ``rlflow.config`` (the
schema, ``validate_config``, verl's key table) is the lowest tier and imports none of this.
"""
