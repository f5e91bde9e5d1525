"""Helper run in a subprocess by test_preset_vllm.py: greedy chat generation with in-process vLLM, as JSON.

``python vllm_generate.py PROMPT MAX_TOKENS MODEL_DIR...`` loads each folder in turn in one
process (vLLM is imported once) and prints ``{model_dir: {prompt_token_ids, token_ids}}`` as the
last line of stdout.
"""

from __future__ import annotations

import gc
import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main(prompt: str, max_tokens: int, model_dirs: list[str]) -> None:
    from vllm import LLM, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    results = {}
    for model_dir in model_dirs:
        llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=256, seed=0)
        out = llm.chat([{"role": "user", "content": prompt}], params)[0]
        results[model_dir] = {"prompt_token_ids": list(out.prompt_token_ids),
                              "token_ids": list(out.outputs[0].token_ids)}
        del llm
        gc.collect()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
