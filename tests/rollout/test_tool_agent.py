"""The ``tool_agent`` loop end to end: a real vLLM engine, the real calculator and python tools.

The tiny preset is first taught (plain PyTorch, a few hundred steps on three conversations) to write one
tool call per prompt: a good calculator call, a malformed call, and a python call that never ends. Greedy
decoding then reproduces those calls, so the loop, the parser and the tools run on what the engine
really sampled.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from rollout_testlib import make_prompts, rollout_config

from rlflow.config.multi_turn_schema import MultiTurnConfig
from rlflow.config.schema import SamplingConfig
from rlflow.models.loading import load_causal_lm, load_tokenizer
from rlflow.rollout import build_rollout
from rlflow.rollout.agent.runner import generate_trajectories

CALCULATOR_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
MALFORMED_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'
ENDLESS_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "while True: pass"}}\n</tool_call>'
CONVERSATIONS = {
    "What is 12 times 34?": [CALCULATOR_CALL, "408", "#### 408"],
    "Break the calculator.": [MALFORMED_CALL],
    "Loop forever.": [ENDLESS_CALL],
}
TIMEOUT_S = 2.0


def conversation(question: str, turns: list[str]) -> list[dict[str, str]]:
    roles = ["assistant", "tool"] * 2
    return [{"role": "user", "content": question}] + [{"role": r, "content": t} for r, t in zip(roles, turns)]


@pytest.fixture(scope="module")
def tool_model_path(tiny_path, tmp_path_factory):
    """The tiny preset after memorising the three conversations (saved as an HF folder)."""
    tokenizer = load_tokenizer(tiny_path)
    model = load_causal_lm(tiny_path, dtype="float32").train()
    sequences = [torch.tensor(tokenizer.apply_chat_template(conversation(q, t), tokenize=True, return_dict=True)["input_ids"])
                 for q, t in CONVERSATIONS.items()]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(300):
        loss = sum(model(input_ids=s[None], labels=s[None]).loss for s in sequences)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01 * len(sequences):
            break
    path = tmp_path_factory.mktemp("tool-model") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    for extra in ("generation_config.json",):
        source = tiny_path / extra
        if source.exists():
            (path / extra).write_text(source.read_text())
    return path


@pytest.fixture(scope="module")
def trajectories(tool_model_path):
    tokenizer = load_tokenizer(tool_model_path)
    config = rollout_config("vllm", prompt_length=64, response_length=512, n=1)
    multi_turn = MultiTurnConfig(enable=True, default_agent_loop="tool_agent", tools=["calculator", "python"],
                                 tool_options={"python": {"timeout_s": TIMEOUT_S}}, max_assistant_turns=3)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True,
                                             return_dict=True)["input_ids"] for q in CONVERSATIONS]
    with build_rollout(config, tool_model_path, "cpu") as rollout:
        output, metrics = generate_trajectories(rollout, make_prompts(tokenizer, token_lists=prompts), multi_turn,
                                                SamplingConfig(n=1, do_sample=False))
    return tokenizer, output, metrics


def turns(tokenizer, output, i: int) -> list[tuple[int, str]]:
    """Sample ``i``'s response as (mask bit, decoded text) runs."""
    width = output.batch["prompts"].shape[1]
    length = int(output.batch["attention_mask"][i, width:].sum())
    ids, mask = output.batch["responses"][i, :length].tolist(), output.batch["response_mask"][i, :length].tolist()
    runs: list[tuple[int, list[int]]] = []
    for token, bit in zip(ids, mask):
        if runs and runs[-1][0] == bit:
            runs[-1][1].append(token)
        else:
            runs.append((bit, [token]))
    return [(bit, tokenizer.decode(tokens)) for bit, tokens in runs]


def test_a_calculator_call_gets_the_calculators_answer_masked_out_of_the_loss(trajectories):
    tokenizer, output, metrics = trajectories
    runs = turns(tokenizer, output, 0)
    assert [bit for bit, _ in runs] == [1, 0, 1], runs
    assert runs[0][1] == CALCULATOR_CALL + "<|im_end|>"
    assert runs[1][1] == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"  # 12*34, computed by the tool
    assert runs[2][1] == "#### 408<|im_end|>"
    assert metrics["agent/tool_calls"] == 1.0


def test_a_malformed_call_is_an_error_the_model_reads_not_a_crash(trajectories):
    tokenizer, output, _ = trajectories
    runs = turns(tokenizer, output, 1)
    assert runs[0] == (1, MALFORMED_CALL + "<|im_end|>")
    assert runs[1][0] == 0 and "tool_call" in runs[1][1] and "<|im_start|>tool\n" in runs[1][1]


def test_an_endless_python_call_is_killed_and_reported_to_the_model(trajectories):
    tokenizer, output, metrics = trajectories
    runs = turns(tokenizer, output, 2)
    assert runs[0] == (1, ENDLESS_CALL + "<|im_end|>")
    assert runs[1][0] == 0 and "timed out" in runs[1][1]
    assert metrics["agent/tool_errors"] == pytest.approx(2 / 3)  # the malformed call and the endless one
