"""Converters from local copies of public datasets (GSM8K, MATH) to verl-format RL parquet.

``rlflow-data gsm8k --src FILE_OR_FOLDER --out DIR`` (and ``math``) run them; the rows carry a
``data_source`` that a built-in reward scores (``rlflow/rewards/gsm8k.py``, ``math_boxed.py``).
"""

from rlflow.data.converters import gsm8k, hendrycks_math  # noqa: F401  (registers the converters)
from rlflow.data.converters.base import CONVERTER_REGISTRY, ConvertedRow, DatasetConverter
from rlflow.data.converters.sources import SPLIT_WORDS, convert_sources, split_files

__all__ = [
    "CONVERTER_REGISTRY",
    "ConvertedRow",
    "DatasetConverter",
    "SPLIT_WORDS",
    "convert_sources",
    "split_files",
]
