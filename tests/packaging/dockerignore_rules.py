"""Docker's ``.dockerignore`` rules, enough to check a file's patterns without a Docker daemon.

The documented rules (https://docs.docker.com/build/concepts/context/#dockerignore-files): one
pattern a line, ``#`` lines are comments, surrounding whitespace is trimmed and each pattern is
cleaned like Go's ``filepath.Clean`` (a leading or trailing ``/`` means nothing); Go's
``filepath.Match`` globs (``*`` and ``?`` stop at ``/``, ``[...]`` classes, ``\\`` escapes) plus
``**``, which spans any number of folders, zero included; ``!`` makes an exception; the last
matching line decides; a pattern that matches a folder excludes everything under it.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One cleaned pattern, its compiled regex, and whether it is an exception (``!``)."""

    pattern: str
    regex: re.Pattern
    exception: bool

    def matches(self, path: str) -> bool:
        """The path itself or one of its parent folders matches."""
        parts = path.split("/")
        return any(self.regex.fullmatch("/".join(parts[:end])) for end in range(len(parts), 0, -1))


def _glob_regex(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out.append(".*" if i == len(pattern) else "(?:.*/)?")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.index("]", i + 1)
            out.append("[" + pattern[i + 1:end].replace("\\", "\\\\") + "]")
            i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out))


def parse_rules(text: str) -> list[Rule]:
    """The rules of a ``.dockerignore`` file's text, in file order."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if exception else line).lstrip("/")
        rules.append(Rule(pattern, _glob_regex(pattern), exception))
    return rules


def is_excluded(rules: list[Rule], path: str) -> bool:
    """Whether ``path`` (relative to the build context, ``/``-separated) stays out of the context."""
    excluded = False
    for rule in rules:
        if rule.matches(path):
            excluded = not rule.exception
    return excluded
