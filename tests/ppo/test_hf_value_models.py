"""A reward model and a critic saved by another tool (``Qwen2ForSequenceClassification.save_pretrained``) in a
real PPO run: the scores the run trained on are HF's own pooled logits for those sequences, and the critic
started from the folder's weights (its first values are HF's logits of each response prefix).

The run is ``run_ppo`` (``main_ppo``'s body) in this process on real Ray, real FSDP2 engines and the HF
rollout; the advantage phase (``Advantages.run``) is wrapped (it still runs) only to keep a copy of each
batch it receives: its scores and values are what the run used.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, Qwen2ForSequenceClassification

from conftest import base_overrides, compose_ppo, read_jsonl
from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import build_preset
from rlflow.protocol import DataProto
from rlflow.trainer.phases.advantages import Advantages
from rlflow.trainer.ppo_trainer import run_ppo

TOL = 1e-4  # fp32; the engine packs the batch (another attention layout than one unpadded row)


def save_sequence_classifier(tiny_model: Path, folder: Path) -> Path:
    """A tiny-qwen2 reward model with one label and random weights, written with ``save_pretrained``."""
    preset = build_preset(folder.parent / "tiny-qwen2", tokenizer_corpus(), "tiny-qwen2", seed=0)
    config = AutoConfig.from_pretrained(preset, num_labels=1)
    assert config.vocab_size == AutoConfig.from_pretrained(tiny_model).vocab_size  # one tokenizer for actor and RM
    config.architectures = ["Qwen2ForSequenceClassification"]
    torch.manual_seed(7)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0)  # scores that spread, so equal-by-accident is unlikely
    model.save_pretrained(folder)
    return folder


def hf_pooled_logit(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    """HF's own score of one unpadded sequence (``model(**inputs).logits``, pooled at its last token)."""
    with torch.no_grad():
        return float(model(input_ids=tokens[None]).logits[0, 0])


@pytest.mark.timeout(600)
def test_sequence_classifier_scores_and_initialises_the_critic_in_a_ppo_run(tiny_model, addition_data, tmp_path, monkeypatch):
    rm_folder = save_sequence_classifier(tiny_model, tmp_path / "rm")
    seen: list[DataProto] = []
    original = Advantages.run

    def keep_a_copy(self, ctx, batch, state):
        seen.append(DataProto.from_dict({k: v.clone() for k, v in batch.batch.items()}))
        return original(self, ctx, batch, state)

    monkeypatch.setattr(Advantages, "run", keep_a_copy)
    overrides = base_overrides(tiny_model, addition_data, tmp_path / "run") + [
        "algorithm=ppo", "rollout=hf", "trainer.total_training_steps=1", "critic.ppo_mini_batch_size=2", "data.val_files=[]",
        "reward.reward_model.enable=true", f"reward.reward_model.path={rm_folder}", f"critic.model.path={rm_folder}",
    ]
    run_ppo(compose_ppo(overrides))

    assert len(seen) == 1
    batch = seen[0].batch
    reference = AutoModelForSequenceClassification.from_pretrained(rm_folder).eval()
    reference.config.pad_token_id = None  # one unpadded row at a time: HF pools its last token
    response_len = batch["responses"].shape[1]
    prompt_mask = batch["attention_mask"][:, :-response_len].bool()
    rm_scores, rm_expected, values, values_expected = [], [], [], []
    for row in range(len(batch["input_ids"])):
        prompt = batch["input_ids"][row, :-response_len][prompt_mask[row]]
        n_response = int(batch["response_mask"][row].sum())
        assert n_response > 0 and bool(batch["response_mask"][row, :n_response].all())
        tokens = torch.cat([prompt, batch["responses"][row, :n_response]])
        scores = batch["token_level_scores"][row]
        assert torch.count_nonzero(scores[: n_response - 1]) == 0 and torch.count_nonzero(scores[n_response:]) == 0
        rm_scores.append(float(scores[n_response - 1]))
        rm_expected.append(hf_pooled_logit(reference, tokens))
        for t in range(n_response):  # the critic's value before response token t: the score of the prefix
            values.append(float(batch["values"][row, t]))
            values_expected.append(hf_pooled_logit(reference, tokens[: len(prompt) + t]))
    torch.testing.assert_close(torch.tensor(rm_scores), torch.tensor(rm_expected), rtol=0, atol=TOL)
    torch.testing.assert_close(torch.tensor(values), torch.tensor(values_expected), rtol=0, atol=TOL)
    assert torch.tensor(rm_expected).std() > 0.01  # distinct sequences got distinct scores
    record = read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]
    assert record["reward/rm_score/mean"] == pytest.approx(sum(rm_scores) / len(rm_scores), abs=1e-5)
    assert not any(key.startswith("reward/source/") for key in record)  # combine=replace: no rule rewards
