"""vLLM (in-process, eager, fp32) loads a preset of each architecture and decodes greedily like HF transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "What is 12+34? Answer with the number after ####."
MAX_TOKENS = 8
# tiny (Qwen2) and the Qwen3 and Llama presets; tiny-qwen2 differs from tiny only in layer count and tying.
VLLM_PRESETS = ("tiny", "tiny-qwen3", "tiny-llama")


@pytest.fixture(scope="module")
def vllm_results(tiny_preset, architecture_presets):
    """``{preset: (folder, vLLM result)}`` from one vLLM process that loads every folder in turn."""
    folders = {"tiny": tiny_preset, **architecture_presets}
    helper = Path(__file__).with_name("vllm_generate.py")
    dirs = [str(folders[name]) for name in VLLM_PRESETS]
    done = subprocess.run([sys.executable, str(helper), PROMPT, str(MAX_TOKENS), *dirs],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    by_dir = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: (folders[name], by_dir[str(folders[name])]) for name in VLLM_PRESETS}


@pytest.mark.parametrize("name", VLLM_PRESETS)
def test_vllm_loads_preset_and_matches_hf_greedy(name, vllm_results):
    folder, result = vllm_results[name]
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]
    assert result["prompt_token_ids"] == prompt_ids

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                            min_new_tokens=MAX_TOKENS)
    assert result["token_ids"] == hf[0, len(prompt_ids):].tolist()
