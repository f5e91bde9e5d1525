"""The converter interface: one row of a public dataset's files -> one verl-format RL row.

A converter is a class registered with ``@CONVERTER_REGISTRY.register("name")`` (which sets its
``name``); ``rlflow-data name``
runs it. It names the reward ``data_source`` its rows carry and reads the question and the
ground truth out of a source row (raising ``DataError`` naming the row and field when it can't).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rlflow.utils.registry import Registry


@dataclass(frozen=True)
class ConvertedRow:
    """What a converter reads from one source row."""

    question: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)


class DatasetConverter(ABC):
    """Turns the rows of one public dataset's files into verl-format RL rows."""

    name: ClassVar[str] = ""
    data_source: ClassVar[str] = ""  # a data_source a registered reward scores
    ability: ClassVar[str] = "math"
    instruction: ClassVar[str] = ""  # appended to every question: how to write the final answer

    @abstractmethod
    def convert(self, row: dict[str, Any], path: Path, index: int) -> ConvertedRow:
        """Question, ground truth and extra info of source row ``index`` of ``path`` (``DataError`` if malformed)."""

    def rl_row(self, converted: ConvertedRow, split: str, index: int) -> dict[str, Any]:
        """The verl-format row: data_source, chat prompt, ability, rule reward_model, extra_info."""
        return {
            "data_source": self.data_source,
            "prompt": [{"role": "user", "content": f"{converted.question} {self.instruction}"}],
            "ability": self.ability,
            "reward_model": {"style": "rule", "ground_truth": converted.ground_truth},
            "extra_info": {"split": split, "index": index, **converted.extra_info},
        }


CONVERTER_REGISTRY: Registry[type[DatasetConverter]] = Registry("dataset converter", "rlflow-data COMMAND",
                                                                 base=DatasetConverter, name_attribute="name")
