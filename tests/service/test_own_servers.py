"""Servers of their own (``make test-full``: each test starts its own): checkpoints outlive the server (a second
``python -m rlflow.service`` over the first one's ``service.checkpoint_dir`` lists them through the SDK's
``RestClient``, samples and resumes from them, and deletes one on request, leaving the rest and a file rlflow did not
write alone), and megatron, an engine without LoRA, serves full fine-tuning."""

from __future__ import annotations

import pytest
import tinker
from sdk_clients import greedy, sft_data, supervised_loop
from sdk_servers import check_full_fine_tuning
from service_runner import API_KEY, start_service

pytestmark = pytest.mark.full


def _serve(tmp_path, tiny_model):
    return start_service(tmp_path, ["engine=fsdp2", "rollout=hf", f"service.models.tiny={tiny_model}"])


def test_checkpoints_are_listed_sampled_and_deleted_after_a_restart(tiny_model, tmp_path):
    first = _serve(tmp_path, tiny_model)
    server = next(first)
    with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as service:
        client = service.create_lora_training_client(base_model="tiny", rank=8).result()
        tokenizer = client.get_tokenizer()
        prompts = [tokenizer.encode(text) for text in ("12+7=", "3+4=")]
        supervised_loop(client, sft_data(tokenizer), steps=3, lr=1e-2)
        state = client.save_state("kept").result().path
        sampler_path = client.save_weights_for_sampler("doomed").result().path
        samples = greedy(service.create_sampling_client(model_path=sampler_path).result(), prompts)
        run_id = client.model_id
    next(first, None)  # stops the server: its worker groups and Ray go with it
    stranger = server.checkpoint_dir / "not_rlflows.txt"
    stranger.write_text("a file rlflow did not write")

    second = _serve(tmp_path, tiny_model)
    server = next(second)
    try:
        with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as service:
            rest = service.create_rest_client()
            assert run_id in {run.training_run_id for run in rest.list_training_runs().result().training_runs}
            listed = {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
            assert {state, sampler_path} <= listed
            assert greedy(service.create_sampling_client(model_path=sampler_path).result(), prompts) == samples
            resumed = service.create_training_client_from_state(state).result()
            assert greedy(resumed.save_weights_and_get_sampling_client().result(), prompts) == samples

            rest.delete_checkpoint_from_tinker_path(sampler_path).result()
            assert sampler_path not in {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
            assert not server.checkpoint_folder(sampler_path).exists() and server.checkpoint_folder(state).is_dir()
            assert stranger.read_text() == "a file rlflow did not write"
    finally:
        next(second, None)


def test_megatron_serves_rank_0_clients_and_refuses_lora_in_one_line(tiny_model, tmp_path):
    """An engine without LoRA serves full fine-tuning: the same checks as fsdp2's (``test_sdk_api.py``)."""
    runner = start_service(tmp_path, ["engine=megatron", "rollout=vllm", f"service.models.tiny={tiny_model}"])
    server = next(runner)
    try:
        with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as service:
            check_full_fine_tuning(server, service, tiny_model)
            with pytest.raises(tinker.BadRequestError, match="engine 'megatron' trains no LoRA adapters: create the client "
                                                             "with rank=0"):
                service.create_lora_training_client(base_model="tiny", rank=8).result()
    finally:
        next(runner, None)
