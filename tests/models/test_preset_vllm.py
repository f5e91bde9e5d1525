"""vLLM (in-process, eager, fp32) loads the preset folder and decodes greedily like HF transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "What is 12+34? Answer with the number after ####."
MAX_TOKENS = 8


def test_vllm_loads_preset_and_matches_hf_greedy(tiny_preset):
    helper = Path(__file__).with_name("vllm_generate.py")
    done = subprocess.run([sys.executable, str(helper), str(tiny_preset), PROMPT, str(MAX_TOKENS)],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    tokenizer = AutoTokenizer.from_pretrained(tiny_preset, local_files_only=True)
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]
    assert result["prompt_token_ids"] == prompt_ids

    model = AutoModelForCausalLM.from_pretrained(tiny_preset, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                            min_new_tokens=MAX_TOKENS)
    assert result["token_ids"] == hf[0, len(prompt_ids):].tolist()
