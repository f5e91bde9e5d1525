"""A Tinker-compatible training service on rlflow's engines, driven by the ``tinker`` SDK (docs/service.md).

``python -m rlflow.service`` serves the Tinker API (``app``) over per-base-model Ray worker groups
(``base_models``), each a LoRA training engine plus a rollout replica per rank (``model_worker``).
"""
