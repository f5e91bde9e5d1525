"""A small byte-level BPE tokenizer trained locally, with a Qwen-style chat template.

The caller passes the training corpus (rlflow's presets use the synthetic tasks' text, from
``rlflow.data.tasks.corpus``). Byte-level BPE means every string encodes (no unknown
tokens), and digits are always split one per token so arithmetic stays digit-aligned.
The normalizer and pre-tokenizer are exactly Qwen2's, because ``AutoTokenizer`` loads every
preset folder (whatever its architecture) through ``Qwen2Tokenizer``, which rebuilds them from
its own definition: matching them means every loader (transformers 4/5, vLLM, ``tokenizers``)
encodes alike.
Training is deterministic: the same corpus and vocab size give the same ``tokenizer.json``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

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


def train_tokenizer(
    corpus: Iterable[str], vocab_size: int = 512, model_max_length: int = 2048
) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``corpus`` (lines of text) and wrap it as an HF fast tokenizer."""
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
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
