"""SFT datasets: multi-turn chats or prompt/response pairs, tokenized with an assistant-only loss mask.

A row is either a ``messages`` chat list (every assistant turn is learned), or, when
``prompt_key`` and ``response_key`` are both set, a prompt (a string, sent as one user
message, or a message list) and a response string (one assistant turn). A dotted key reads a
nested field (``extra_info.question``: verl's ``prompt_key=extra_info`` with
``prompt_dict_keys=[question]``). The whole
conversation goes through the tokenizer's chat template; ``loss_mask[t] = 1`` exactly when
token ``t`` is assistant text or its end-of-turn token (see ``rlflow.data.chat``), i.e. a
token the model is trained to predict from the tokens before it.

Samples longer than ``max_length`` follow ``truncation``: ``error`` (a ``DataError`` naming
file and row), ``left`` (drop the start) or ``right`` (drop the end). Samples truncated
down to no assistant token are kept (they add nothing to the loss) and counted in the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from rlflow.config import ConfigError
from rlflow.data.chat import ChatTemplateError, check_chat_tokenizer, check_template_kwargs, encode_conversation, pad_token_id
from rlflow.data.collate import pad_to_tensor, position_ids_from_mask
from rlflow.data.files import read_rows, resolve_files
from rlflow.data.rows import check_messages, check_string, describe, field_value, row_error
from rlflow.data.sampler import BatchLoader, build_loader
from rlflow.data.truncation import OverlongError, check_policy, keep_slice
from rlflow.protocol import DataProto
from rlflow.utils.logging import get_logger

logger = get_logger(__name__)

SFT_TRUNCATION_POLICIES = ("error", "left", "right")


@dataclass(frozen=True)
class SFTSample:
    """One tokenized conversation and its loss mask (same length, already truncated)."""

    input_ids: list[int]
    loss_mask: list[int]


class SFTDataset:
    """Chat or prompt/response SFT data from parquet/jsonl files or folders; ``collate`` makes training batches."""

    def __init__(
        self,
        files: str | Path | Iterable[str | Path],
        tokenizer: Any,
        messages_key: str = "messages",
        prompt_key: Optional[str] = None,
        response_key: Optional[str] = None,
        max_length: int = 128,
        truncation: str = "error",
        apply_chat_template_kwargs: Optional[Mapping[str, Any]] = None,
    ):
        check_policy(truncation, SFT_TRUNCATION_POLICIES)
        check_chat_tokenizer(tokenizer)
        if (prompt_key is None) != (response_key is None):
            raise ConfigError("config keys 'data.prompt_key' and 'data.response_key': set both (pair data) or neither (chat data)")
        if max_length < 1:
            raise ConfigError(f"config key 'data.max_length': must be >= 1, got {max_length}")
        self.tokenizer = tokenizer
        self.messages_key = messages_key
        self.prompt_key = prompt_key
        self.response_key = response_key
        self.max_length = max_length
        self.truncation = truncation
        self.template_kwargs = check_template_kwargs(apply_chat_template_kwargs or {}, "data.apply_chat_template_kwargs")
        self.pad_token_id = pad_token_id(tokenizer)
        self.files = resolve_files(files)
        self.samples: list[SFTSample] = [s for path in self.files for s in read_rows(path, self._parse_row)]
        no_loss = sum(1 for s in self.samples if not any(s.loss_mask))
        if no_loss:
            logger.warning("%d of %d SFT samples have no assistant token left after %s truncation to %d tokens",
                           no_loss, len(self.samples), truncation, max_length)
        logger.info("loaded %d SFT samples from %d file(s)", len(self.samples), len(self.files))

    @classmethod
    def from_config(cls, data_config: Any, tokenizer: Any, split: str) -> "SFTDataset":
        """The ``train`` or ``val`` split described by an ``SFTDataConfig`` (``data:`` in sft_trainer.yaml)."""
        files = {"train": data_config.train_files, "val": data_config.val_files}[split]
        return cls(
            list(files),
            tokenizer,
            messages_key=data_config.messages_key,
            prompt_key=data_config.prompt_key,
            response_key=data_config.response_key,
            max_length=data_config.max_length,
            truncation=data_config.truncation,
            apply_chat_template_kwargs=data_config.apply_chat_template_kwargs,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> SFTSample:
        return self.samples[index]

    def _conversation(self, row: dict[str, Any], path: Path, index: int) -> tuple[str, list[dict[str, str]]]:
        """(the field to blame for errors, the conversation's messages)."""
        if self.prompt_key is None:
            return self.messages_key, check_messages(field_value(row, self.messages_key), path, index, self.messages_key)
        prompt = field_value(row, self.prompt_key)
        if isinstance(prompt, (list, tuple)):
            messages = check_messages(prompt, path, index, self.prompt_key)
        elif isinstance(prompt, str) or prompt is None:
            messages = [{"role": "user", "content": check_string(prompt, path, index, self.prompt_key)}]
        else:
            raise row_error(path, index, self.prompt_key, f"must be a string or a message list, got {describe(prompt)}")
        response = check_string(field_value(row, self.response_key), path, index, self.response_key)
        return self.response_key, [*messages, {"role": "assistant", "content": response}]

    def _parse_row(self, row: dict[str, Any], path: Path, index: int) -> SFTSample:
        field, messages = self._conversation(row, path, index)
        try:
            input_ids, loss_mask = encode_conversation(self.tokenizer, messages, self.template_kwargs)
        except ChatTemplateError as error:
            raise row_error(path, index, field, str(error)) from None
        try:
            keep = keep_slice(len(input_ids), self.max_length, self.truncation)
        except OverlongError as error:
            raise row_error(
                path, index, field,
                f"the sample is {error.length} tokens after the chat template, over data.max_length="
                f"{error.budget}; raise it, or set data.truncation=left|right",
            ) from None
        return SFTSample(input_ids[keep], loss_mask[keep])

    def collate(self, indices: list[int], epoch: int = 0) -> DataProto:
        """A training batch, right-padded to its longest sample.

        Tensors: ``input_ids``, ``attention_mask``, ``position_ids`` (0 at the first token),
        ``loss_mask`` (1 on assistant tokens, 0 on everything else and on padding).
        """
        samples = [self.samples[i] for i in indices]
        attention_mask = pad_to_tensor([[1] * len(s.input_ids) for s in samples], 0, "right")
        tensors = {
            "input_ids": pad_to_tensor([s.input_ids for s in samples], self.pad_token_id, "right"),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "loss_mask": pad_to_tensor([s.loss_mask for s in samples], 0, "right"),
        }
        return DataProto.from_dict(tensors)


def build_sft_loader(data_config: Any, tokenizer: Any, split: str) -> BatchLoader:
    """The loader of an ``SFTDataConfig`` split: ``train_batch_size`` samples per batch.

    ``train``: full batches only, shuffled per epoch with ``data.seed`` when ``data.shuffle``.
    ``val``: in file order, the last batch may be smaller.
    """
    dataset = SFTDataset.from_config(data_config, tokenizer, split)
    if split == "train":
        return build_loader(dataset, data_config.train_batch_size, shuffle=data_config.shuffle, seed=data_config.seed, drop_last=True)
    return build_loader(dataset, data_config.train_batch_size, shuffle=False, seed=data_config.seed, drop_last=False)
