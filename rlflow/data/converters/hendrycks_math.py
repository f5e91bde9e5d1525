r"""MATH (Hendrycks et al.; ``DigitalLearningGmbH/MATH-lighteval``): ``problem``, ``solution`` with ``\boxed{}``, ``level``, ``type``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlflow.data.boxed import last_boxed
from rlflow.data.converters.base import CONVERTER_REGISTRY, ConvertedRow, DatasetConverter
from rlflow.data.rows import check_string, describe, row_error


@CONVERTER_REGISTRY.register("math")
class MATHConverter(DatasetConverter):
    r"""MATH competition problems; the ground truth is the solution's last ``\boxed{...}``."""

    data_source = "DigitalLearningGmbH/MATH-lighteval"
    instruction = r"Reason it out step by step, then put the final answer inside \boxed{}."

    def convert(self, row: dict[str, Any], path: Path, index: int) -> ConvertedRow:
        problem = check_string(row.get("problem"), path, index, "problem")
        solution = check_string(row.get("solution"), path, index, "solution")
        answer = last_boxed(solution)
        if not answer:
            raise row_error(path, index, "solution", r"has no \boxed{...} final answer (or its braces do not close)")
        extra = {"problem": problem, "solution": solution}
        for key in ("level", "type"):
            value = row.get(key)
            if value is not None and not isinstance(value, str):
                raise row_error(path, index, key, f"must be a string (or absent), got {describe(value)}")
            extra[key] = value
        return ConvertedRow(problem, answer, extra)
