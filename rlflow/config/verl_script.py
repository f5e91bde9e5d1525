"""Read a verl launch script (or a plain list of overrides) the way bash would hand it to verl's entry point.

verl's example scripts set shell variables (``train_files="['$gsm8k_train_path', ...]"``), quote
values (``trainer.logger='["console","wandb"]'``), continue lines with backslashes and start
``python3 -m verl.trainer.main_ppo`` or ``torchrun ... -m verl.trainer.fsdp_sft_trainer``.
``read_verl_command`` splits the text into commands with bash's quoting rules, expands ``$NAME``,
``${NAME}`` and ``${NAME:-default}`` from the assignments above the command and the environment,
and returns the arguments after the verl module. Nothing in the script is run: a command
substitution (``$(...)``), an unset variable or a positional parameter (``$1``, ``$@``) is left
out of the value and reported in ``unresolved``. Text without a verl module line is read as
overrides, any number a line.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional

from rlflow.config.validation import ConfigError

# verl's entry modules -> rlflow's config name.
VERL_MODULES = {
    "verl.trainer.main_ppo": "ppo_trainer",
    "verl.trainer.fsdp_sft_trainer": "sft_trainer",
    "verl.trainer.sft_trainer": "sft_trainer",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_SEPARATORS = {"\n", ";", "&"}
PASSED_THROUGH = ("$@", "$*")  # the script's extra arguments: give them to rlflow's command yourself
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod}


def _integer_value(node: ast.AST) -> int:
    """The value of an integer expression of ``+ - * // %``, parentheses and unary minus (bash's arithmetic)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_integer_value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_integer_value(node.left), _integer_value(node.right))
    raise ValueError("not an integer expression")


@dataclass
class VerlCommand:
    """The verl entry point a script runs (``ppo_trainer`` / ``sft_trainer``, None for a bare override list), its
    arguments after the module, and what could not be expanded without running the script."""

    entry: Optional[str]
    args: list[str]
    launcher: list[str] = field(default_factory=list)  # the words before the module (python3, torchrun ... -m)
    unresolved: dict[int, list[str]] = field(default_factory=dict)  # arg index -> what it left unexpanded


class _Words:
    """bash's word splitting and quote removal over ``text``, one command at a time, expanding from ``variables``."""

    def __init__(self, text: str, variables: dict[str, str]):
        self.text, self.pos, self.variables = text, 0, variables
        self.unresolved: list[str] = []

    def commands(self) -> Iterator[tuple[list[str], dict[int, list[str]]]]:
        """Each command's words, and for the words that left something unexpanded, what (by word index)."""
        while self.pos < len(self.text):
            words, unresolved = self._command()
            if words:
                yield words, unresolved

    def _command(self) -> tuple[list[str], dict[int, list[str]]]:
        words: list[str] = []
        unresolved: dict[int, list[str]] = {}
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in _SEPARATORS:
                self.pos += 1
                break
            if char in " \t":
                self.pos += 1
            elif char == "#":
                self._skip_to_line_end()
            elif char == "\\" and self.text.startswith("\\\n", self.pos):
                self.pos += 2
            else:
                self.unresolved, start = [], self.pos
                word = self._word()
                if word == "" and self.text[start] == "$":
                    continue  # an unquoted expansion to nothing is no word at all (bash drops it)
                words.append(word)
                missing = [name for name in self.unresolved if name not in PASSED_THROUGH]
                if missing:
                    unresolved[len(words) - 1] = missing
        return words, unresolved

    def _skip_to_line_end(self) -> None:
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end

    def _word(self) -> str:
        parts: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in " \t" or char in _SEPARATORS:
                break
            self.pos += 1
            if char == "\\":
                if self.text.startswith("\n", self.pos):
                    self.pos += 1
                    break
                parts.append(self.text[self.pos:self.pos + 1])
                self.pos += 1
            elif char == "'":
                end = self.text.index("'", self.pos)
                parts.append(self.text[self.pos:end])
                self.pos = end + 1
            elif char == '"':
                parts.append(self._double_quoted())
            elif char == "$":
                parts.append(self._expansion())
            else:
                parts.append(char)
        return "".join(parts)

    def _double_quoted(self) -> str:
        parts: list[str] = []
        while True:
            char = self.text[self.pos]
            self.pos += 1
            if char == '"':
                return "".join(parts)
            if char == "\\" and self.text[self.pos] in '$`"\\\n':
                parts.append("" if self.text[self.pos] == "\n" else self.text[self.pos])
                self.pos += 1
            elif char == "$":
                parts.append(self._expansion())
            else:
                parts.append(char)

    def _expansion(self) -> str:
        """The value of the ``$...`` just read (``self.pos`` is past the ``$``)."""
        rest = self.text[self.pos:]
        if rest.startswith("{"):
            inner = _balanced(rest, "{", "}")
            self.pos += len(inner) + 2
            name, _, default = inner.partition(":-")
            return self._lookup(name, self._expand_text(default) if default else None, f"${{{inner}}}")
        if rest.startswith("(("):
            inner = _balanced(rest, "(", ")")
            self.pos += len(inner) + 2
            return self._arithmetic(inner[1:-1], f"$({inner})")
        if rest.startswith("("):
            inner = _balanced(rest, "(", ")")
            self.pos += len(inner) + 2
            self.unresolved.append(f"$({inner})")
            return ""
        match = _NAME.match(rest)
        if match is None:  # $1, $@, $#: the script's own arguments
            if rest[:1] and rest[0] not in " \t\n\"'":
                self.pos += 1
                self.unresolved.append(f"${rest[0]}")
                return ""
            return "$"
        self.pos += match.end()
        return self._lookup(match.group(), None, f"${match.group()}")

    def _expand_text(self, text: str) -> str:
        """``text`` (a ``${NAME:-default}`` default) with its quotes removed and its ``$`` expanded."""
        inner = _Words(text, self.variables)
        value = inner._word()
        self.unresolved += inner.unresolved
        return value

    def _arithmetic(self, expression: str, spelled: str) -> str:
        """bash's ``$((...))`` over integers and the variables set so far; unresolved when it holds anything else."""
        names = {name: self.variables.get(name, "") for name in _NAME.findall(expression)}
        text = _NAME.sub(lambda match: names[match.group()], expression.replace("$", ""))
        if not re.fullmatch(r"[0-9+\-*/%() ]+", text):
            self.unresolved.append(spelled)
            return ""
        return str(_integer_value(ast.parse(text.replace("/", "//"), mode="eval").body))

    def _lookup(self, name: str, default: Optional[str], spelled: str) -> str:
        if name in self.variables and self.variables[name] != "":
            return self.variables[name]
        if default is not None:
            return default
        self.unresolved.append(spelled)
        return ""


def _balanced(text: str, opening: str, closing: str) -> str:
    """What lies between ``text``'s first character (``opening``) and the ``closing`` that matches it."""
    depth = 0
    for index, char in enumerate(text):
        depth += 1 if char == opening else -1 if char == closing else 0
        if depth == 0:
            return text[1:index]
    raise ValueError(f"no closing {closing!r}")


def _module_at(words: list[str]) -> Optional[int]:
    """The index of the verl module among a command's words (``-m verl.trainer.main_ppo`` or the bare name)."""
    return next((index for index, word in enumerate(words) if word in VERL_MODULES), None)


def read_verl_command(text: str, environment: Mapping[str, str]) -> VerlCommand:
    """The verl command of a launch script, or the overrides of a list (see the module doc)."""
    variables = dict(environment)
    every_word: list[str] = []
    every_unresolved: dict[int, list[str]] = {}
    try:
        for command, unresolved in _Words(text, variables).commands():
            module = _module_at(command)
            if module is not None:
                after = {index - module - 1: names for index, names in unresolved.items() if index > module}
                return VerlCommand(VERL_MODULES[command[module]], command[module + 1:], command[:module], after)
            every_unresolved.update({len(every_word) + index: names for index, names in unresolved.items()})
            every_word += command
            assignments = [_ASSIGNMENT.match(word) for word in command[1:] if command[0] == "export"] or [
                _ASSIGNMENT.match(word) for word in command]
            if all(assignments):
                variables.update(match.groups() for match in assignments)
    except (ValueError, IndexError):
        raise ConfigError("the script has an unbalanced quote or brace; check it runs in bash") from None
    if not every_word:
        raise ConfigError("no verl command found: expected a script that runs python -m verl.trainer.main_ppo (or "
                          "verl.trainer.fsdp_sft_trainer / sft_trainer), or a list of key=value overrides")
    return VerlCommand(None, every_word, [], every_unresolved)
