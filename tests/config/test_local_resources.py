"""A run on the local Ray cluster that asks for more CPUs, GPUs or nodes than it has is one line, before Ray starts."""

from __future__ import annotations

import pytest
from one_line_errors import cli_refusal, one_line_error

from rlflow.trainer.entry_points import PPO_ENTRY, compose_ppo_config


def test_more_worker_processes_than_the_local_cluster_has_cpus_is_one_line_before_ray(tmp_path):
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", "trainer.device=cpu", "trainer.n_procs_per_node=64",
                        "data.train_batch_size=64", "actor.ppo_mini_batch_size=64", f"trainer.ray_temp_dir={tmp_path / 'ray'}",
                        f"trainer.default_local_dir={tmp_path / 'run'}"], ray_dir=tmp_path / "ray")
    assert line.startswith("config keys 'trainer.n_procs_per_node' / 'trainer.cpus_per_proc': 64 worker processes x 1 CPUs "
                           "need 64 CPUs, and the local Ray cluster has "), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    (["trainer.nnodes=2"], "config key 'trainer.nnodes': 2 nodes need a Ray cluster of that many"),
    (["trainer.device=cpu", "trainer.n_procs_per_node=2", "trainer.cpus_per_proc=0.5", "trainer.ray_num_cpus=0.5"],
     "need 1 CPUs, and the local Ray cluster has 0.5 (trainer.ray_num_cpus)"),
    (["trainer.device=cpu", "trainer.placement=split", "rollout.tensor_parallel_size=2", "trainer.ray_num_cpus=2"],
     "3 worker processes x 1 CPUs need 3 CPUs"),  # the actor and a CPU per shard of the rollout's engine
])
def test_the_local_cluster_check_names_nodes_and_ray_num_cpus(overrides, message):
    assert message in one_line_error(lambda args: PPO_ENTRY.check_machine(compose_ppo_config(args)), overrides)


def test_a_composed_config_is_not_judged_by_the_machine_it_is_composed_on():
    """``compose`` (tests, recipes checked on a laptop) validates the config alone; ``run`` checks the machine."""
    assert compose_ppo_config(["trainer.device=cpu", "trainer.n_procs_per_node=64"]).trainer.n_procs_per_node == 64
