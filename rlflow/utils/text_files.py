"""Reading UTF-8 and JSON files so that a damaged one is one line naming the file and where it breaks.

Every reader of a user's or a checkpoint's text file (data rows, ``config.json``, tokenizer files,
engine metadata, a checkpoint's fingerprint) goes through these: invalid UTF-8 names the byte
offset, invalid JSON the line, column and character offset, in a ``UserError`` of the caller's
class (``FileFormatError`` by default), instead of a decoder's traceback. ``what`` names the kind of
file at the start of the message (``data file /x/train.jsonl: ...``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlflow.errors import UserError


class FileFormatError(UserError, ValueError):
    """A file cannot be decoded or parsed; the message names the file and the offset."""


def _name(path: str | Path, what: str) -> str:
    return f"{what} {path}" if what else str(path)


def decode_utf8(data: bytes, path: str | Path, error: type[UserError] = FileFormatError, what: str = "") -> str:
    """``data`` (the bytes of ``path``) as text; invalid UTF-8 raises ``error`` naming the byte offset and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as bad:
        line = data.count(b"\n", 0, bad.start) + 1
        raise error(f"{_name(path, what)}: not UTF-8 text at byte {bad.start} (line {line}: {bad.reason}); "
                    "save it as UTF-8") from None


def read_text(path: str | Path, error: type[UserError] = FileFormatError, what: str = "") -> str:
    """The UTF-8 text of ``path``; a file that cannot be read or decoded raises ``error`` naming it."""
    try:
        data = Path(path).read_bytes()
    except OSError as bad:
        raise error(f"{_name(path, what)}: cannot be read ({bad.strerror or bad})") from None
    return decode_utf8(data, path, error, what)


def parse_json(text: str, path: str | Path, error: type[UserError] = FileFormatError, what: str = "") -> Any:
    """``text`` (the content of ``path``) parsed as JSON; invalid JSON raises ``error`` naming the line, column and
    character offset, and saying so when the text ends before the value does (a cut-off file)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as bad:
        ends_early = bad.pos >= len(text.rstrip()) or bad.msg.startswith("Unterminated string")
        cut = " (the text ends early: cut off?)" if ends_early else ""
        raise error(f"{_name(path, what)}: not valid JSON at line {bad.lineno}, column {bad.colno} (character {bad.pos}): "
                    f"{bad.msg}{cut}") from None


def read_json(path: str | Path, error: type[UserError] = FileFormatError, what: str = "") -> Any:
    """The JSON value ``path`` holds; a file that cannot be read, decoded or parsed raises ``error`` naming it."""
    return parse_json(read_text(path, error, what), path, error, what)
