"""Multi-turn trajectories on the tiny preset with a real in-process vLLM engine.

The engine's own requests and completions are recorded (a wrapper around ``add_request``/``step``), so each
trajectory is checked against what the engine actually sampled: model segments equal the engine's output
ids, their log-probs are the engine's, environment turns are the chat template's rendering and are
masked out of the loss, and earlier turns are never re-tokenized.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from rollout_testlib import make_prompts, rollout_config

from rlflow.config.multi_turn_schema import MultiTurnConfig
from rlflow.meta_info import GLOBAL_STEP
from rlflow.rollout import build_rollout
from rlflow.rollout.agent import AGENT_LOOP_REGISTRY, ENV_REGISTRY, AgentLoop, Env, EnvStep, Trajectory
from rlflow.rollout.agent.runner import generate_trajectories

ENV_TURNS = 3


class CountingEnv(Env):
    """Answers every model turn with a numbered tool message; done after ``ENV_TURNS`` model turns."""

    def step(self, action: str) -> EnvStep:
        self.steps = getattr(self, "steps", 0) + 1
        return EnvStep([{"role": "tool", "content": f"observation {self.steps}"}], reward=0.5, done=self.steps >= ENV_TURNS)


class SpelledOutLoop(AgentLoop):
    """Two model turns restricted to single-character tokens (which the tokenizer would merge) around a user turn."""

    async def run(self, sample):
        trajectory = Trajectory(list(sample.prompt_ids), self.ctx.sampling.max_new_tokens)
        letters = tuple(self.ctx.tokenizer.convert_tokens_to_ids(list("the")))
        allowed = letters + tuple(sorted(self.ctx.end.end_ids))
        for turn in range(2):
            tokens, completion = await self.ctx.generate(trajectory, sample, allowed_token_ids=allowed)
            trajectory.add_model_turn(tokens, completion)
            if turn == 0:
                trajectory.add_env_turn(self.ctx.turns.encode([{"role": "user", "content": "again"}]))
        return trajectory


@pytest.fixture(scope="module")
def rollout(tiny_path):
    engine = build_rollout(rollout_config("vllm", prompt_length=300, response_length=48, n=2), tiny_path, "cpu")
    calls = engine.recorded = {}
    add_request, step = engine.add_request, engine.step

    def recording_add(request_id, request):
        calls[request_id] = [request, None]
        add_request(request_id, request)

    def recording_step():
        finished = step()
        for request_id, completion in finished:
            calls[request_id][1] = completion
        return finished

    engine.add_request, engine.step = recording_add, recording_step
    yield engine
    engine.shutdown()


def model_segments(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s."""
    runs, start = [], None
    for i, bit in enumerate(mask + [0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def sample_view(output, i: int) -> tuple[list[int], list[int], list[int], torch.Tensor]:
    """Sample ``i``'s prompt ids, response ids, response mask and rollout log-probs, without padding."""
    width = output.batch["prompts"].shape[1]
    attention = output.batch["attention_mask"][i]
    prompt = output.batch["prompts"][i][attention[:width].bool()].tolist()
    length = int(attention[width:].sum())
    return (prompt, output.batch["responses"][i, :length].tolist(), output.batch["response_mask"][i, :length].tolist(),
            output.batch["rollout_log_probs"][i, :length])


def assert_model_turns_are_the_engines(rollout, output) -> None:
    """Every run of mask-1 tokens is exactly what the engine sampled for the request whose prompt was everything
    before it, with the engine's log-probs; every mask-0 token has log-prob 0."""
    by_prompt: dict[tuple, list] = {}  # a prompt's n samples share their first turn's prompt
    for request, completion in rollout.recorded.values():
        by_prompt.setdefault(tuple(request.prompt_ids), []).append(completion)
    for i in range(len(output)):
        prompt, ids, mask, log_probs = sample_view(output, i)
        for start, end in model_segments(mask):
            matches = [c for c in by_prompt[tuple(prompt + ids[:start])] if list(c.token_ids[: end - start]) == ids[start:end]]
            assert matches, f"sample {i}: the tokens at {start}:{end} are not what the engine sampled for that prefix"
            assert torch.equal(log_probs[start:end], torch.tensor(matches[0].log_probs[: end - start]))
        assert not log_probs[torch.tensor(mask) == 0].any(), "no log-prob on tool or environment tokens"


def test_environment_trajectories_are_the_engines_tokens_and_mask_the_environment(rollout, tokenizer):
    multi_turn = MultiTurnConfig(enable=True, default_agent_loop="env_agent", env_class="counting")
    rollout.recorded.clear()
    with ENV_REGISTRY.temporary():
        ENV_REGISTRY.register("counting")(CountingEnv)
        output, metrics = generate_trajectories(rollout, make_prompts(tokenizer), multi_turn)
    assert_model_turns_are_the_engines(rollout, output)
    env_turns = 0
    for i in range(len(output)):
        _, ids, mask, _ = sample_view(output, i)
        for start, end in model_segments([1 - bit for bit in mask]):
            env_turns += 1
            text = tokenizer.decode(ids[start:end])
            assert text.startswith("\n<|im_start|>tool\nobservation ") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert output.non_tensor_batch["extra_info"][i]["agent_reward"] == pytest.approx(0.5 * len(model_segments(mask)))
    assert env_turns > 0 and metrics["num_turns"] > 1


def test_turns_are_appended_as_tokens_never_re_tokenized(rollout, tokenizer):
    multi_turn = MultiTurnConfig(enable=True, default_agent_loop="spelled_out")
    rollout.recorded.clear()
    with AGENT_LOOP_REGISTRY.temporary():
        AGENT_LOOP_REGISTRY.register("spelled_out")(SpelledOutLoop)
        output, _ = generate_trajectories(rollout, make_prompts(tokenizer, texts=["Say it:", "Again:"]), multi_turn)
    assert_model_turns_are_the_engines(rollout, output)
    differs = 0
    for i in range(len(output)):
        prompt, ids, mask, _ = sample_view(output, i)
        assert len(model_segments(mask)) == 2
        text = tokenizer.decode(prompt + ids)
        differs += tokenizer(text, add_special_tokens=False)["input_ids"] != prompt + ids
    assert differs, "the crafted case (spelled-out letters a tokenizer merges) did not arise; it must, to mean anything"


def test_single_turn_loop_samples_what_batched_generate_samples(rollout, tokenizer):
    prompts = make_prompts(tokenizer)
    prompts.meta_info[GLOBAL_STEP.name] = 3
    batched = rollout.generate(prompts)
    looped, metrics = generate_trajectories(rollout, prompts, MultiTurnConfig(enable=True))
    for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(batched.batch[key], looped.batch[key]), key
    assert torch.allclose(batched.batch["rollout_log_probs"], looped.batch["rollout_log_probs"], atol=1e-6, rtol=0)
    assert metrics["num_turns"] == 1.0 and list(looped.non_tensor_batch) == list(batched.non_tensor_batch) + ["num_turns"]
