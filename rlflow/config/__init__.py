"""Structured (dataclass) configs: the schema every Hydra YAML under rlflow/configs/ is checked against."""

from rlflow.config.validation import ConfigError, validate_config

__all__ = ["ConfigError", "validate_config"]
