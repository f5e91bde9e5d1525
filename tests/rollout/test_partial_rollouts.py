"""Pausing a ``RequestServer`` mid-generation on the real vLLM engine (the weight-sync point of asynchronous training).

Every request in flight is aborted, keeping its sampled tokens, and resumed from them; with the weights unchanged,
a greedy generation so interrupted equals the uninterrupted one. Each token's policy version says which side of
the pause sampled it.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest
from rollout_testlib import PROMPTS, rollout_config

from rlflow.rollout import build_rollout
from rlflow.rollout.request_server import RequestServer
from rlflow.rollout.requests import Completion, GenerationRequest
from rlflow.rollout.sampling import resolve_sampling

RESPONSE = 24
PAUSE_AFTER_STEPS = 6  # engine steps before the pause: every request is part-way through its response
LOG_PROB_TOLERANCE = 1e-4  # a resumed request recomputes its prefix in one prefill instead of step by step
BEFORE, AFTER = 3, 4  # the policy versions on either side of the pause (the weights themselves do not change)


@pytest.fixture(scope="module")
def engine(tiny_path):
    rollout = build_rollout(rollout_config("vllm", prompt_length=64, response_length=RESPONSE), tiny_path, "cpu")
    rollout.track_partial_outputs(True)
    yield rollout
    rollout.shutdown()


def _requests(engine, tokenizer) -> list[GenerationRequest]:
    greedy = replace(resolve_sampling(engine.config, RESPONSE), greedy=True, n=1, stop_token_ids=())
    prompts = [tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in PROMPTS] * 2
    return [GenerationRequest(prompt, greedy) for prompt in prompts]


def _serve(engine, requests: list[GenerationRequest], pause: bool) -> list[Completion]:
    """Serve ``requests`` concurrently; with ``pause``, pause after ``PAUSE_AFTER_STEPS`` engine steps from another
    thread and resume with version ``AFTER``."""
    server = RequestServer(engine, version=BEFORE)
    stepped, original_step = threading.Event(), engine.step
    steps = 0

    def counted_step():
        nonlocal steps
        steps += 1
        if steps == PAUSE_AFTER_STEPS:
            stepped.set()
        return original_step()

    def pause_and_resume():
        stepped.wait()
        server.pause()
        server.resume(AFTER)

    async def work() -> list[Completion]:
        return list(await asyncio.gather(*(server.generate(request) for request in requests)))

    engine.step = counted_step
    pauser = threading.Thread(target=pause_and_resume, daemon=True)
    try:
        if pause:
            pauser.start()
        return server.serve(work())
    finally:
        del engine.step
        stepped.set()


def test_an_aborted_and_resumed_greedy_generation_equals_the_uninterrupted_one(engine, tokenizer):
    requests = _requests(engine, tokenizer)
    reference = _serve(engine, requests, pause=False)
    paused = _serve(engine, requests, pause=True)
    assert min(len(c.token_ids) for c in reference) > PAUSE_AFTER_STEPS  # every request was in flight at the pause
    for want, got in zip(reference, paused, strict=True):
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        assert max(abs(a - b) for a, b in zip(got.log_probs, want.log_probs)) <= LOG_PROB_TOLERANCE
        assert set(want.versions) == {BEFORE}
        switch = got.versions.index(AFTER)  # the kept prefix was sampled before the pause, the rest after it
        assert 0 < switch < len(got.versions) and set(got.versions[:switch]) == {BEFORE}
        assert set(got.versions[switch:]) == {AFTER}
