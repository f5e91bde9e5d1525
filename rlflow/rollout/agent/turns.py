"""Tokens for a tool or environment turn, rendered once by the model's own chat template.

A conversation grows by appending token ids; earlier turns are never decoded and re-encoded (a
re-tokenized prefix can differ from what the model sampled, and verl measured PPO failing to
converge when it did). The new messages are rendered after a fixed two-message conversation and the
tokens that follow that conversation's end-of-turn token are the turn's tokens: the template's own
delimiters (e.g. ChatML's ``\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n``), ready
to append after a model turn that ended with that end-of-turn token.
"""

from __future__ import annotations

from typing import Any

_BASE = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "."}]


class TurnEncoder:
    """Encodes non-model turns for appending after a model turn that ended with an end-of-turn token."""

    def __init__(self, tokenizer: Any, end_ids: frozenset[int], template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        base = self._render(_BASE, add_generation_prompt=False)
        ends = [i for i, token in enumerate(base) if token in end_ids]
        if not ends:
            raise ValueError("the chat template ends an assistant turn with no end-of-turn token; cannot append turns")
        self._prefix = base[: ends[-1] + 1]

    def encode(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` (roles ``tool`` or ``user``), then the next assistant turn's header."""
        full = self._render(_BASE + list(messages), add_generation_prompt)
        if full[: len(self._prefix)] != self._prefix:
            raise ValueError("the chat template renders earlier turns differently once more messages follow; "
                             "token-in, token-out turns need a template that only appends")
        return full[len(self._prefix):]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, **self.template_kwargs
        )
        ids = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
        return [int(token) for token in ids]
