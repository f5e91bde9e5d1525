"""A small byte-level BPE tokenizer trained locally, with a Qwen-style chat template.

The corpus is text from the synthetic tasks (so prompts and worked solutions encode in few
tokens) plus general ASCII prose. Byte-level BPE means every string encodes (no unknown
tokens), and digits are always split one per token so arithmetic stays digit-aligned.
The normalizer and pre-tokenizer are exactly Qwen2's, because ``AutoTokenizer`` loads a
``qwen2`` folder through ``Qwen2Tokenizer``, which rebuilds them from its own definition:
matching them means every loader (transformers 4/5, vLLM, ``tokenizers``) encodes alike.
Training is deterministic: the same corpus and vocab size give the same ``tokenizer.json``.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from rlflow.data.tasks import build_task

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# Qwen-style ChatML. The {% generation %} block marks assistant text so
# apply_chat_template(..., return_assistant_tokens_mask=True) yields an SFT loss mask.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_GENERAL_TEXT = """\
The quick brown fox jumps over the lazy dog. A model reads text as tokens and predicts the next one.
You are a helpful assistant. Please think step by step, then give the final answer.
Question: how many apples are left if you start with 12 and eat 5? Answer: 7.
Reinforcement learning from rewards improves a policy; the reward says whether the answer is right.
def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5
{"role": "user", "content": "hello"} [1, 2, 3] (x + y) * z / 4 - 1 = 0; x != y, a <= b, c >= d.
"""

_CORPUS_SEED = 1234
_EXAMPLES_PER_TASK = 2000
# A fixed list, not the live registry: registering a new task must not change existing presets.
CORPUS_TASKS = ("addition", "chain_arith")


def corpus_lines() -> Iterator[str]:
    """The training corpus: chat-shaped text from ``CORPUS_TASKS`` (default options), then general ASCII."""
    rng = random.Random(_CORPUS_SEED)
    for name in CORPUS_TASKS:
        task = build_task(name)
        for _ in range(_EXAMPLES_PER_TASK):
            example = task.sample(rng)
            yield f"user\n{example.prompt}\n"
            yield f"assistant\n{example.solution}\n"
    yield from _GENERAL_TEXT.splitlines(keepends=True)
    yield string.printable


def train_tokenizer(vocab_size: int = 512, model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``corpus_lines()`` and wrap it as an HF fast tokenizer."""
    min_vocab = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_vocab:
        raise ValueError(f"tokenizer vocab_size must be >= {min_vocab} (256 bytes + special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
