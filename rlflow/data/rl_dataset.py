"""RL prompt datasets in verl's format, batched as left-padded ``DataProto`` prompts.

A row has ``data_source`` (which reward scores it), ``prompt`` (a chat message list),
``reward_model.ground_truth``, an optional ``extra_info`` dict and an optional ``agent_name`` (the
agent loop that produces its trajectories; ``ability`` and other columns are ignored). Every file
is read and every row checked and tokenized when the dataset is built, so a malformed row or an
over-long prompt stops the run before training, with a ``DataError`` naming file, row and field.

Over-long prompts (more than ``max_prompt_length`` tokens after the chat template):
``filter_overlong_prompts=True`` drops them at load time and logs how many; otherwise the
``truncation`` policy applies (``error``, ``left``, ``right`` or ``filter``, see
``rlflow.data.truncation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from rlflow.config import ConfigError
from rlflow.data.chat import ChatTemplateError, check_chat_tokenizer, check_template_kwargs, encode_prompt, pad_token_id
from rlflow.data.collate import object_array, pad_to_tensor, position_ids_from_mask
from rlflow.data.files import read_rows, resolve_files
from rlflow.data.rows import check_ground_truth, check_messages, check_optional_dict, check_string, row_error
from rlflow.data.sampler import BatchLoader, build_loader
from rlflow.data.truncation import OverlongError, check_policy, keep_slice
from rlflow.protocol import DataProto
from rlflow.utils.logging import get_logger

logger = get_logger(__name__)

RL_TRUNCATION_POLICIES = ("error", "left", "right", "filter")


@dataclass(frozen=True)
class PromptRow:
    """One checked, tokenized prompt (``input_ids`` already truncated to the budget)."""

    input_ids: list[int]
    raw_prompt: list[dict[str, str]]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    agent_name: str = ""  # "": the rollout's rollout.multi_turn.default_agent_loop


class RLDataset:
    """Prompts for rollouts, read from parquet/jsonl files or folders; ``collate`` makes generation batches."""

    def __init__(
        self,
        files: str | Path | Iterable[str | Path],
        tokenizer: Any,
        prompt_key: str = "prompt",
        max_prompt_length: int = 64,
        truncation: str = "error",
        filter_overlong_prompts: bool = True,
        apply_chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        tools: Optional[list[dict[str, Any]]] = None,
    ):
        check_policy(truncation, RL_TRUNCATION_POLICIES)
        check_chat_tokenizer(tokenizer)
        if max_prompt_length < 1:
            raise ConfigError(f"config key 'data.max_prompt_length': must be >= 1, got {max_prompt_length}")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.filter_overlong_prompts = filter_overlong_prompts
        self.template_kwargs = check_template_kwargs(apply_chat_template_kwargs or {}, "data.apply_chat_template_kwargs")
        if tools:
            self.template_kwargs["tools"] = list(tools)  # the chat template renders the tools the model may call
        self.pad_token_id = pad_token_id(tokenizer)
        self.files = resolve_files(files)
        self.num_dropped = 0
        self.rows: list[PromptRow] = []
        for path in self.files:
            self.rows.extend(row for row in read_rows(path, self._parse_row) if row is not None)
        if self.num_dropped:
            logger.info(
                "dropped %d of %d prompts longer than max_prompt_length=%d tokens",
                self.num_dropped, self.num_dropped + len(self.rows), max_prompt_length,
            )
        logger.info("loaded %d prompts from %d file(s)", len(self.rows), len(self.files))

    @classmethod
    def from_config(
        cls, data_config: Any, tokenizer: Any, split: str, tools: Optional[list[dict[str, Any]]] = None
    ) -> "RLDataset":
        """The ``train`` or ``val`` split described by a ``DataConfig`` (``data:`` in ppo_trainer.yaml); ``tools``
        (OpenAI function schemas) are passed to the chat template."""
        files = {"train": data_config.train_files, "val": data_config.val_files}[split]
        return cls(
            list(files),
            tokenizer,
            prompt_key=data_config.prompt_key,
            max_prompt_length=data_config.max_prompt_length,
            truncation=data_config.truncation,
            filter_overlong_prompts=data_config.filter_overlong_prompts,
            apply_chat_template_kwargs=data_config.apply_chat_template_kwargs,
            tools=tools,
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> PromptRow:
        return self.rows[index]

    def _parse_row(self, row: dict[str, Any], path: Path, index: int) -> Optional[PromptRow]:
        """Check one raw row and tokenize its prompt; None if the prompt is dropped as over-long."""
        messages = check_messages(row.get(self.prompt_key), path, index, self.prompt_key)
        data_source = check_string(row.get("data_source"), path, index, "data_source")
        reward_model = row.get("reward_model")
        if not isinstance(reward_model, dict):
            raise row_error(path, index, "reward_model", f"must be a dict with a ground_truth, got {type(reward_model).__name__}")
        ground_truth = check_ground_truth(reward_model.get("ground_truth"), path, index, "reward_model.ground_truth")
        extra_info = check_optional_dict(row.get("extra_info"), path, index, "extra_info")
        agent_name = "" if row.get("agent_name") is None else check_string(row["agent_name"], path, index, "agent_name")
        try:
            input_ids = encode_prompt(self.tokenizer, messages, self.template_kwargs)
        except ChatTemplateError as error:
            raise row_error(path, index, self.prompt_key, str(error)) from None
        keep = self._keep_slice(len(input_ids), path, index)
        if keep is None:
            self.num_dropped += 1
            return None
        return PromptRow(input_ids[keep], messages, data_source, ground_truth, extra_info, agent_name)

    def _keep_slice(self, length: int, path: Path, index: int) -> Optional[slice]:
        policy = "filter" if self.filter_overlong_prompts else self.truncation
        try:
            return keep_slice(length, self.max_prompt_length, policy)
        except OverlongError as error:
            raise row_error(
                path, index, self.prompt_key,
                f"the prompt is {error.length} tokens after the chat template, over data.max_prompt_length="
                f"{error.budget}; raise it, or set data.truncation=left|right|filter or data.filter_overlong_prompts=true",
            ) from None

    def collate(self, indices: list[int], epoch: int = 0) -> DataProto:
        """A generation batch of the given rows, left-padded to ``max_prompt_length``.

        Tensors: ``input_ids``, ``attention_mask``, ``position_ids`` (0 at the first real token).
        Non-tensors: ``uid`` (``"<epoch>-<row>"``: unique per prompt and stable across resumes),
        ``raw_prompt`` (the messages), ``data_source``, ``ground_truth``, ``extra_info``, and ``agent_name``
        when any row of the dataset names its agent loop.
        """
        rows = [self.rows[i] for i in indices]
        input_ids = pad_to_tensor([r.input_ids for r in rows], self.pad_token_id, "left", self.max_prompt_length)
        attention_mask = pad_to_tensor([[1] * len(r.input_ids) for r in rows], 0, "left", self.max_prompt_length)
        tensors = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
        }
        non_tensors = {
            "uid": object_array([f"{epoch}-{i}" for i in indices]),
            "raw_prompt": object_array([r.raw_prompt for r in rows]),
            "data_source": object_array([r.data_source for r in rows]),
            "ground_truth": object_array([r.ground_truth for r in rows]),
            "extra_info": object_array([r.extra_info for r in rows]),
        }
        if any(row.agent_name for row in self.rows):
            non_tensors["agent_name"] = object_array([r.agent_name for r in rows])
        return DataProto.from_dict(tensors, non_tensors)


def build_rl_loader(
    data_config: Any, tokenizer: Any, split: str, tools: Optional[list[dict[str, Any]]] = None
) -> BatchLoader:
    """The loader of a ``DataConfig`` split.

    ``train``: ``train_batch_size`` prompts per batch, full batches only (``drop_last``), shuffled
    per epoch with ``data.seed`` when ``data.shuffle``. ``val``: in file order, ``val_batch_size``
    per batch (null: one batch with everything), the last batch may be smaller.
    """
    dataset = RLDataset.from_config(data_config, tokenizer, split, tools)
    if split == "train":
        return build_loader(dataset, data_config.train_batch_size, shuffle=data_config.shuffle, seed=data_config.seed, drop_last=True)
    batch_size = data_config.val_batch_size or len(dataset)
    return build_loader(dataset, batch_size, shuffle=False, seed=data_config.seed, drop_last=False)
