"""rlflow-from-verl's parts: reading a verl script as bash would, and translating its keys and values.

Each expected value here is verl's own behaviour worked out by hand (its YAML's interpolations, its
warmup rule), not read back from the translator.
"""

from __future__ import annotations

import pytest

from rlflow.config import ConfigError
from rlflow.config.loading.verl_translate import render_value, translate
from rlflow.config.verl_script import VerlCommand, read_verl_command

SCRIPT = r"""
set -x
# a comment with a 'quote
gsm8k_train_path=$HOME/data/gsm8k/train.parquet
math_train_path=${DATA:-"${HOME}/data"}/math/train.parquet
train_files="['$gsm8k_train_path', '$math_train_path']"
max_len=$((1024 * 2))
save_path=$2
export VLLM_USE_V1=1

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml'\
    data.train_files="$train_files" \
    data.max_prompt_length=$max_len \
    trainer.logger='["console","wandb"]' \
    trainer.default_local_dir=$save_path \
    trainer.total_epochs=15 $@
"""


def overrides_of(args: list[str], device: str = "cpu", entry: str | None = None) -> dict[str, str]:
    translation = translate(VerlCommand(entry, args), device)
    return dict(override.lstrip("+").split("=", 1) for override in translation.overrides)


def test_a_script_is_read_the_way_bash_hands_it_to_verl():
    command = read_verl_command(SCRIPT, {"HOME": "/home/u"})
    assert command.entry == "ppo_trainer" and command.launcher == ["python3", "-m"]
    assert command.args == [
        "--config-path=config", "--config-name=ppo_megatron_trainer.yaml",
        "data.train_files=['/home/u/data/gsm8k/train.parquet', '/home/u/data/math/train.parquet']",
        "data.max_prompt_length=2048", 'trainer.logger=["console","wandb"]', "trainer.default_local_dir=",
        "trainer.total_epochs=15",
    ]
    assert command.unresolved == {5: ["$save_path"]}  # $@ passes the caller's arguments: not a gap


def test_an_override_list_and_a_torchrun_sft_script():
    listed = read_verl_command("data.train_files=/d/train.parquet\n+data.response_dict_keys=[answer]  # note\n", {})
    assert (listed.entry, listed.args) == (None, ["data.train_files=/d/train.parquet", "+data.response_dict_keys=[answer]"])
    sft = read_verl_command("torchrun --standalone --nproc_per_node=2 -m verl.trainer.fsdp_sft_trainer optim.lr=1e-4", {})
    assert (sft.entry, sft.launcher[-1], sft.args) == ("sft_trainer", "-m", ["optim.lr=1e-4"])
    with pytest.raises(ConfigError, match="unbalanced quote"):
        read_verl_command("python3 -m verl.trainer.main_ppo data.x='oops", {})


def test_keys_values_and_the_forms_rlflow_wants():
    ours = overrides_of(["actor_rollout_ref.actor.optim.lr=3e-6", "data.train_files=/d/t.parquet", "trainer.logger=console",
                         "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.model.path=/m",
                         "trainer.n_gpus_per_node=2", "actor_rollout_ref.hybrid_engine=False",
                         "custom_reward_function.path=/r/fn.py", "actor_rollout_ref.actor.strategy=fsdp",
                         "actor_rollout_ref.rollout.engine_kwargs.vllm.block_size=16"])
    assert ours["actor.engine.optimizer.lr"] == "3e-06" and ours["data.train_files"] == "[/d/t.parquet]"
    assert ours["trainer.logger"] == "[console]" and ours["actor.engine.lora.target_modules"] == "[all-linear]"
    assert (ours["model.path"], ours["model.preset"], ours["trainer.n_procs_per_node"]) == ("/m", "null", "2")
    assert ours["trainer.placement"] == "split" and ours["reward.custom_function"] == "/r/fn.py:compute_score"
    assert ours["actor.engine"] == "fsdp" and ours["rollout.engine_kwargs.block_size"] == "16"


def test_unmappable_keys_are_listed_with_their_reason():
    translation = translate(VerlCommand("ppo_trainer", ["actor_rollout_ref.rollout.layered_summon=True",
                                                        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                                                        "global_profiler.tool=nsys", "algorithm.made_up=1"]), "cpu")
    reasons = dict(line.split(": ", 1) for line in translation.dropped)
    assert set(reasons) == {"actor_rollout_ref.rollout.layered_summon=True", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                            "global_profiler.tool=nsys", "algorithm.made_up=1"}
    assert "weight sync streams" in reasons["actor_rollout_ref.rollout.layered_summon=True"]
    assert "rollout.num_replicas" in reasons["actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    assert "no profiler" in reasons["global_profiler.tool=nsys"] and "neither" in reasons["algorithm.made_up=1"]


def test_the_gpu_memory_fraction_is_kept_for_a_gpu_and_refused_for_a_cpu():
    args = ["actor_rollout_ref.rollout.gpu_memory_utilization=0.6"]
    assert overrides_of(args, "cuda")["rollout.gpu_memory_utilization"] == "0.6"
    cpu = translate(VerlCommand("ppo_trainer", args), "cpu")
    assert "rollout.gpu_memory_utilization" not in str(cpu.overrides) and "kv_cache_space_gb" in cpu.dropped[0]


def test_warmup_ratios_become_optimizer_steps_when_the_run_length_is_known():
    # verl: int(0.1 x 20 steps) = 2 warmup steps of its once-per-step schedule; rlflow steps per mini-batch update:
    # 1024 prompts / 256 per mini-batch x 2 epochs = 8 updates a step, so 16. The critic: int(0.05 x 20) = 1 -> 8 x 1.
    ours = overrides_of(["trainer.total_training_steps=20", "data.train_batch_size=1024", "algorithm.adv_estimator=gae",
                         "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_epochs=2",
                         "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1", "critic.optim.lr_warmup_steps_ratio=0.05"])
    assert ours["actor.engine.lr_scheduler.warmup_steps"] == "16" and ours["critic.engine.lr_scheduler.warmup_steps"] == "8"
    unknown = translate(VerlCommand("ppo_trainer", ["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
                                                    "data.train_files=/not/here.parquet"]), "cpu")
    assert "the run's length is not known here" in unknown.dropped[0]


def test_verls_inherited_values_and_defaults_are_written_out():
    # verl's critic takes the actor's mini-batch, epochs, shuffle and dynamic batching; its reference takes the actor's
    # dynamic batching and token budget; rollout.n and the actor's shuffle default to 1 and false in verl.
    ours = overrides_of(["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                         "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=9000",
                         "actor_rollout_ref.actor.use_kl_loss=True"])
    assert (ours["critic.ppo_mini_batch_size"], ours["critic.shuffle"], ours["critic.engine.use_dynamic_bsz"]) == ("64", "false", "true")
    assert ours["critic.engine.max_token_len_per_micro_batch"] == "32768"  # verl's own critic default, not the actor's
    assert (ours["ref.engine.use_dynamic_bsz"], ours["ref.engine.max_token_len_per_micro_batch"]) == ("true", "9000")
    assert (ours["rollout.n"], ours["actor.shuffle"], ours["critic.engine.optimizer.lr"]) == ("1", "false", "1e-05")
    grpo = overrides_of(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=5"])
    assert "critic.ppo_mini_batch_size" not in grpo and grpo["rollout.n"] == "5"


def test_megatron_keys_pick_the_megatron_engine_for_their_roles():
    ours = overrides_of(["--config-name=ppo_megatron_trainer", "algorithm.adv_estimator=grpo",
                         "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                         "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2"])
    assert (ours["actor.engine"], ours["ref.engine"]) == ("megatron", "megatron") and "critic.engine" not in ours
    assert (ours["actor.engine.tensor_model_parallel_size"], ours["ref.engine.pipeline_model_parallel_size"]) == ("2", "2")


def test_sft_nested_columns_and_verls_sft_defaults():
    ours = overrides_of(["model.partial_pretrain=/m", "data.prompt_key=extra_info", "data.response_key=extra_info",
                         "data.prompt_dict_keys=['question']", "+data.response_dict_keys=['answer']",
                         "data.micro_batch_size_per_gpu=4", "trainer.total_training_steps=50"], entry="sft_trainer")
    assert (ours["data.prompt_key"], ours["data.response_key"]) == ("extra_info.question", "extra_info.answer")
    assert (ours["engine.micro_batch_size"], ours["data.train_batch_size"], ours["data.max_length"]) == ("4", "256", "1024")
    assert ours["engine.optimizer.lr"] == "1e-05" and ours["engine.lr_scheduler.warmup_steps"] == "5"  # int(0.1 x 50)


@pytest.mark.parametrize("value", ["plain", "a b", "1e-6", "true", "null", "x'y", "${oc.env:HOME}", 3, 2.5, None, ["a", "b c"]])
def test_rendered_values_read_back_as_the_same_value(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert OverridesParser.create().parse_override(f"k={render_value(value)}").value() == value
