"""The request-level rollout: the batched path as its client reproduces ``vllm.LLM.generate``, concurrent
coroutine requests share the engine, abort frees a request, and the HF backend has the same API."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from rollout_testlib import make_prompts, rollout_config

from rlflow.meta_info import GLOBAL_STEP
from rlflow.rollout import build_rollout
from rlflow.rollout.request_server import RequestServer
from rlflow.rollout.requests import GenerationRequest
from rlflow.rollout.sampling import request_seed, resolve_sampling

LOG_PROB_TOLERANCE = 1e-6  # same engine, same batch: only float noise could differ, and none is expected


@pytest.fixture(scope="module", params=["vllm", "hf"])
def rollout(request, tiny_path):
    engine = build_rollout(rollout_config(request.param, prompt_length=300, response_length=12, n=3), tiny_path, "cpu")
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("rollout", ["vllm"], indirect=True)  # HF keeps its own batched generate
def test_batched_generation_samples_what_llm_generate_samples_at_the_same_seeds(rollout, tokenizer):
    """The batched path is a client of add_request/step; vLLM's own offline ``LLM.generate`` on the same engine with
    the same per-request seeds is the reference (the path rlflow used before the request level)."""
    from vllm import SamplingParams

    prompts = make_prompts(tokenizer)
    prompts.meta_info[GLOBAL_STEP.name] = 5
    ours = rollout.generate(prompts)
    sampling = resolve_sampling(rollout.config, rollout.config.response_length)
    token_lists = [row[mask.bool()].tolist() for row, mask in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
    requests, params = [], []
    for row, tokens in enumerate(token_lists):
        for sample in range(sampling.n):
            requests.append({"prompt_token_ids": tokens})
            params.append(SamplingParams(
                n=1, max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=1.0, top_k=-1,
                stop_token_ids=sorted(rollout.eos_ids), seed=request_seed(0, 5, 0, row, sample), logprobs=0,
                detokenize=False,
            ))
    reference = rollout._llm.generate(requests, params, use_tqdm=False)
    mask = ours.batch["response_mask"].bool()
    for index, output in enumerate(reference):
        expected = list(output.outputs[0].token_ids)
        assert ours.batch["responses"][index][mask[index]].tolist() == expected, f"sample {index}"
        got = ours.batch["rollout_log_probs"][index][mask[index]]
        want = [output.outputs[0].logprobs[i][t].logprob for i, t in enumerate(expected)]
        assert max(abs(a - b) for a, b in zip(got.tolist(), want)) <= LOG_PROB_TOLERANCE
    assert len({tuple(r) for r in ours.batch["responses"].tolist()}) > 3, "seeded samples of a prompt differ"


def test_concurrent_coroutines_share_the_engine_and_abort_ends_one_request(rollout, tokenizer):
    sampling = resolve_sampling(rollout.config, rollout.config.response_length)
    once = replace(sampling, n=1)
    prompt = tuple(tokenizer("12+30=", add_special_tokens=False)["input_ids"])
    server = RequestServer(rollout)
    order = []

    async def two_turns(name: str, seed: int):
        first = await server.generate(GenerationRequest(prompt, once, seed))
        order.append(name)
        second = await server.generate(GenerationRequest(prompt + first.token_ids[:3], replace(once, max_new_tokens=4), seed))
        return first, second

    async def aborted():
        waiting = asyncio.ensure_future(server.generate(GenerationRequest(prompt, once, 7), request_id="doomed"))
        await asyncio.sleep(0)
        server.abort(["doomed"])
        return await waiting

    async def everything():
        return await asyncio.gather(two_turns("a", 1), two_turns("b", 2), aborted())

    (a1, a2), (b1, b2), dropped = server.serve(everything())
    assert dropped.finish_reason == "abort" and dropped.token_ids == ()
    for first, second in ((a1, a2), (b1, b2)):
        for completion, budget in ((first, 12), (second, 4)):
            assert len(completion.log_probs) == len(completion.token_ids)
            ended = completion.token_ids[-1] in rollout.eos_ids
            assert completion.finish_reason == ("stop" if ended else "length"), completion
            assert len(completion.token_ids) == budget or ended, "a request stops only at EOS or its budget"
    assert sorted(order) == ["a", "b"]
    assert not rollout.has_unfinished()


@pytest.mark.parametrize("rollout", ["vllm"], indirect=True)  # HF seeds a generate call, so its batch matters
def test_a_seeded_request_samples_the_same_alone_or_among_others(rollout, tokenizer):
    once = replace(resolve_sampling(rollout.config, rollout.config.response_length), n=1)
    prompts = [tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in ("12+30=", "The quick")]
    server = RequestServer(rollout)

    async def crowd():
        return await asyncio.gather(*(server.generate(GenerationRequest(p, once, seed)) for p in prompts for seed in (1, 2)))

    crowded = server.serve(crowd())
    alone = server.serve(server.generate(GenerationRequest(prompts[0], once, 1)))
    assert alone.token_ids == crowded[0].token_ids
    assert max(abs(a - b) for a, b in zip(alone.log_probs, crowded[0].log_probs)) <= 1e-5
    assert crowded[0].token_ids != crowded[1].token_ids, "different seeds sample differently"


def test_allowed_token_ids_restrict_sampling(rollout, tokenizer):
    sampling = replace(resolve_sampling(rollout.config, rollout.config.response_length), n=1)
    prompt = tuple(tokenizer("The quick", add_special_tokens=False)["input_ids"])
    allowed = tuple(tokenizer("ab", add_special_tokens=False)["input_ids"][:1] + tokenizer("7", add_special_tokens=False)["input_ids"])
    server = RequestServer(rollout)
    completion = server.serve(server.generate(GenerationRequest(prompt, sampling, 3, allowed)))
    assert completion.token_ids and set(completion.token_ids) <= set(allowed)
