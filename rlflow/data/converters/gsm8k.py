"""GSM8K (``openai/gsm8k``): rows with ``question`` and ``answer``, the answer ending in ``#### <number>``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlflow.data.converters.base import CONVERTER_REGISTRY, ConvertedRow, DatasetConverter
from rlflow.data.rows import check_string, row_error
from rlflow.data.tasks.answer import ANSWER_MARKER

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@CONVERTER_REGISTRY.register("gsm8k")
class GSM8KConverter(DatasetConverter):
    """GSM8K word problems; the ground truth is the number after the answer's last ``####``."""

    data_source = "openai/gsm8k"
    instruction = 'Reason it out step by step, then write the final number on its own after "####".'

    def convert(self, row: dict[str, Any], path: Path, index: int) -> ConvertedRow:
        question = check_string(row.get("question"), path, index, "question")
        answer = check_string(row.get("answer"), path, index, "answer")
        if ANSWER_MARKER not in answer:
            raise row_error(path, index, "answer", f"has no final answer '{ANSWER_MARKER} <number>' at its end")
        final = answer.rsplit(ANSWER_MARKER, 1)[1].strip().replace(",", "")
        if not _NUMBER.fullmatch(final):
            raise row_error(path, index, "answer", f"the text after the last '{ANSWER_MARKER}' must be a number, got {final!r}")
        return ConvertedRow(question, final, {"question": question, "answer": answer})
