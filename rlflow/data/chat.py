"""Chat templates: prompt token ids for generation and assistant-token masks for SFT.

The template is the tokenizer's own (``apply_chat_template``), rendered to text and then
tokenized with ``add_special_tokens=False`` (a template that writes a BOS token writes it
into the text, so it is not added twice).

Which tokens are the assistant's is found from the text, for any template: assistant turn
``i`` starts where ``messages[:i]`` rendered with the generation prompt ends, and stops
where ``messages[:i+1]`` rendered ends, minus trailing whitespace the template adds after
the end-of-turn token (Qwen's ``"\\n"`` after ``<|im_end|>``). The turn's content and its
end-of-turn token are therefore learned; the role header (``<|im_start|>assistant\\n``) and
the separator are not. A token belongs to the assistant when its first character does.

``template_kwargs`` (``data.apply_chat_template_kwargs``) are extra variables for the template,
such as Qwen3's ``enable_thinking``; every rendering of a conversation gets the same ones.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from rlflow.errors import UserError


class ChatTemplateError(ValueError):
    """The chat template failed on, or rendered inconsistently for, one conversation."""


def check_chat_tokenizer(tokenizer: Any) -> None:
    """Raise ``UserError`` unless ``tokenizer`` is a fast tokenizer with a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; set one "
            "(tokenizer.chat_template) or use a chat model's tokenizer"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} is not a fast tokenizer; "
                        "rlflow needs tokenizer.json (character offsets) to build loss masks")


# Arguments rlflow itself passes to apply_chat_template; data.apply_chat_template_kwargs may not set them.
RESERVED_TEMPLATE_KWARGS = ("conversation", "tokenize", "add_generation_prompt")


def check_template_kwargs(template_kwargs: Mapping[str, Any], config_key: str) -> dict[str, Any]:
    """``template_kwargs`` as a plain dict; ``UserError`` naming ``config_key`` if one is rlflow's own."""
    plain = OmegaConf.to_container(template_kwargs) if isinstance(template_kwargs, DictConfig) else dict(template_kwargs)
    reserved = sorted(set(plain) & set(RESERVED_TEMPLATE_KWARGS))
    if reserved:
        raise UserError(f"config key '{config_key}': {', '.join(reserved)} is set by rlflow itself; "
                        "pass only the template's own variables (e.g. {enable_thinking: false})")
    return plain


def render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool,
           template_kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """The chat template applied to ``messages`` as text; ``template_kwargs`` are extra template variables."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **(template_kwargs or {}))
    except Exception as error:  # noqa: BLE001 - jinja raises many types; all mean "this conversation is bad"
        raise ChatTemplateError(f"the chat template failed: {type(error).__name__}: {error}") from None
    return text


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of already-templated text."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: Optional[Mapping[str, Any]] = None) -> list[int]:
    """Token ids of a prompt ready for generation (the template's generation prompt appended)."""
    return encode_text(tokenizer, render(tokenizer, messages, add_generation_prompt=True, template_kwargs=template_kwargs))


def encode_conversation(
    tokenizer: Any, messages: list[dict[str, str]], template_kwargs: Optional[Mapping[str, Any]] = None
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a whole conversation; the mask is 1 exactly on assistant tokens."""
    if not any(message["role"] == "assistant" for message in messages):
        raise ChatTemplateError("the conversation has no assistant turn, so there is nothing to learn")
    text = render(tokenizer, messages, add_generation_prompt=False, template_kwargs=template_kwargs)
    spans = [_assistant_span(tokenizer, messages, turn, text, template_kwargs)
             for turn, m in enumerate(messages) if m["role"] == "assistant"]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    loss_mask = [int(any(start <= first < end for start, end in spans)) for first, _ in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), loss_mask


def _assistant_span(tokenizer: Any, messages: list[dict[str, str]], turn: int, text: str,
                    template_kwargs: Optional[Mapping[str, Any]]) -> tuple[int, int]:
    """Character range of assistant turn ``turn`` inside the rendered conversation ``text``."""
    before = render(tokenizer, messages[:turn], add_generation_prompt=True, template_kwargs=template_kwargs)
    through = render(tokenizer, messages[: turn + 1], add_generation_prompt=False, template_kwargs=template_kwargs)
    if not (text.startswith(before) and text.startswith(through) and through.startswith(before)):
        raise ChatTemplateError(
            f"the chat template renders assistant turn {turn} differently inside the whole conversation "
            "than on its own prefix, so its tokens cannot be located"
        )
    return len(before), max(len(before), len(through.rstrip()))


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, or its EOS id when it has no pad token."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    raise UserError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a pad nor an EOS token; set tokenizer.pad_token")
