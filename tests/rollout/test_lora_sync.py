"""LoRA weight sync (issue 19): after every sync from a LoRA actor, the vLLM rollout's greedy generations
equal a merged HF model's on the same prompts, for both ``rollout.lora_sync`` modes.

The actor is a real fsdp2 engine (one rank, gloo) training rank-8 adapters on the tiny preset, at a
learning rate that changes its greedy outputs within a step. The reference is independent of rlflow's
merge: the engine's peft adapter folder loaded with ``PeftModel.from_pretrained`` on the base HF model,
merged by peft (``merge_and_unload``), generating with HF ``generate``.
"""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from rollout_testlib import make_prompts, rollout_config

from rlflow.config.schema import SamplingConfig
from rlflow.engines import build_engine
from rlflow.models.loading import load_causal_lm
from rlflow.protocol import DataProto
from rlflow.rollout import WeightSyncError, build_rollout

RANK = 8
PROMPTS = ["12+30=", "7*8=", "The quick brown fox", "1 2 3 4", "You are a helpful assistant.", "99-9="]
NEW_TOKENS = 16
GREEDY = SamplingConfig(n=1, do_sample=False, max_new_tokens=NEW_TOKENS)


def _sft_step(engine, tokenizer) -> None:
    """One step that makes the model repeat the prompts (moves the adapters well away from zero)."""
    rows = [tokenizer(text, add_special_tokens=False)["input_ids"] * 3 for text in PROMPTS]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "loss_mask": mask.float()})

    def nll(outputs, micro, ctx):
        loss_mask = micro.batch["loss_mask"]
        return -(outputs["log_probs"] * loss_mask).sum() / ctx.global_num_tokens * ctx.dp_size, {}

    engine.forward_backward(batch, nll)
    engine.optim_step()


def _hf_greedy(model, prompts: DataProto) -> list[list[int]]:
    out = model.generate(input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
                         max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[:, prompts.batch["input_ids"].shape[1]:].tolist()


def _rollout_greedy(rollout, prompts: DataProto) -> list[list[int]]:
    out = rollout.generate(prompts, GREEDY)
    return [row[mask.bool()].tolist() for row, mask in zip(out.batch["responses"], out.batch["response_mask"])]


@pytest.mark.parametrize("lora_sync, shards", [("merged", 1), ("adapter", 1), ("adapter", 2)])
def test_greedy_generations_after_each_sync_equal_the_merged_hf_model(lora_sync, shards, tiny_path, tokenizer, tmp_path,
                                                                      in_process_group):
    """``shards=2``: the engine split over two tensor-parallel processes, each loading its slice of the adapters
    (or of the merged weights)."""
    engine = build_engine({"name": "fsdp2", "device": "cpu", "micro_batch_size": 8, "lora": {"rank": RANK, "alpha": 16},
                           "optimizer": {"lr": 3e-2, "weight_decay": 0.0}}, tiny_path)
    engine.initialize()
    config = rollout_config("vllm", prompt_length=48, response_length=NEW_TOKENS, lora_sync=lora_sync, lora_rank=RANK,
                            tensor_parallel_size=shards)
    rollout = build_rollout(config, tiny_path, "cpu")
    prompts = make_prompts(tokenizer, texts=PROMPTS)
    base = _rollout_greedy(rollout, prompts)
    try:
        for step in range(2):
            _sft_step(engine, tokenizer)
            if lora_sync == "adapter":
                loaded = rollout.update_lora_adapter(engine.lora_adapter_config(), engine.export_lora_adapter())
            else:
                loaded = rollout.update_weights(engine.export_hf_weights())
            assert loaded > 0
            engine.save_lora_adapter(tmp_path / f"adapter{step}")
            merged = PeftModel.from_pretrained(load_causal_lm(tiny_path, dtype="float32"), tmp_path / f"adapter{step}")
            merged = merged.merge_and_unload().eval()
            got, expected = _rollout_greedy(rollout, prompts), _hf_greedy(merged, prompts)
            for row, (ours, ref) in enumerate(zip(got, expected)):
                assert ours == ref[: len(ours)], f"step {step}, prompt {row}: rollout {ours} vs merged HF {ref}"
                assert len(ours) == NEW_TOKENS or ours[-1] in rollout.eos_ids, f"prompt {row} ended early: {ours}"
        assert _rollout_greedy(rollout, prompts) != base, "training did not change the greedy outputs"
    finally:
        rollout.shutdown()


def test_an_adapter_vllm_rejects_fails_the_sync_and_generation_waits_for_a_good_one(tiny_path, tokenizer, in_process_group):
    engine = build_engine({"name": "fsdp2", "device": "cpu", "lora": {"rank": RANK, "alpha": 16}}, tiny_path)
    engine.initialize()
    rollout = build_rollout(rollout_config("vllm", prompt_length=48, response_length=NEW_TOKENS, lora_sync="adapter",
                                           lora_rank=RANK), tiny_path, "cpu")
    good = list(engine.export_lora_adapter())
    bad = [(name.replace("q_proj", "lm_head"), tensor) for name, tensor in good if "layers.0.self_attn.q_proj" in name]
    try:
        with pytest.raises(Exception, match="lm_head"):  # vLLM's Qwen2 takes no adapter on lm_head
            rollout.update_lora_adapter(engine.lora_adapter_config().replace("q_proj", "lm_head"), bad)
        with pytest.raises(WeightSyncError, match="failed part-way"):
            rollout.generate(make_prompts(tokenizer, texts=PROMPTS), GREEDY)
        rollout.update_lora_adapter(engine.lora_adapter_config(), good)
        assert len(_rollout_greedy(rollout, make_prompts(tokenizer, texts=PROMPTS))) == len(PROMPTS)
    finally:
        rollout.shutdown()
