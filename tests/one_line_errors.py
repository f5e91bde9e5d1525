"""``one_line_error``: what the start-up checks' tests share (importable from every test folder: pytest puts
``tests/`` on ``sys.path`` for its root ``conftest.py``)."""

from __future__ import annotations

from typing import Callable

import pytest

from rlflow.errors import UserError


def one_line_error(compose: Callable[[list[str]], object], overrides: list[str],
                   error: type[Exception] = UserError) -> str:
    """The message of the ``error`` that ``compose(overrides)`` raises, which must be one line."""
    with pytest.raises(error) as raised:
        compose(overrides)
    message = str(raised.value)
    assert "\n" not in message, message
    return message
