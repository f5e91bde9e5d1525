"""Helper run in a subprocess by test_preset_vllm.py: greedy chat generation with in-process vLLM, as JSON."""

from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(model_dir: str, prompt: str, max_tokens: int) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=256, seed=0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    out = llm.chat([{"role": "user", "content": prompt}], params)[0]
    print(json.dumps({"prompt_token_ids": list(out.prompt_token_ids), "token_ids": list(out.outputs[0].token_ids)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
