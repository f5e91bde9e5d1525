"""``Critic``: the value model for GAE, trained with PPO's clipped value loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from rlflow.meta_info import MINI_BATCH_SIZE, SEED
from rlflow.protocol import DataProto
from rlflow.roles.batch_views import engine_batch, response_length, state_values_slice
from rlflow.roles.engine_role import EngineRole, forward_only
from rlflow.roles.losses import make_value_loss_fn
from rlflow.utils.metric_values import mean_per_key
from rlflow.workers import DP_COMPUTE, register

CRITIC_MESH = "critic"


class Critic(EngineRole):
    """Hosts a value-head engine: ``compute_values`` and ``update_critic`` (mini-batches x epochs inside)."""

    model_kind = "value"

    def __init__(self, critic_config: Any, model_path: str | Path):
        super().__init__(critic_config.engine, model_path, CRITIC_MESH)
        self.critic_config = critic_config
        self.loss_fn = make_value_loss_fn(critic_config)

    @register(dispatch_mode=DP_COMPUTE, mesh=CRITIC_MESH)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``[B, R]``: the value of the state each response token is generated from."""
        outputs = forward_only(self.engine, engine_batch(data))
        if outputs is None:
            return DataProto()
        values = state_values_slice(outputs.batch["values"], response_length(data))
        return DataProto.from_dict({"values": values * data.batch["response_mask"]})

    @register(dispatch_mode=DP_COMPUTE, mesh=CRITIC_MESH)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """PPO value updates over this rank's share: ``critic.ppo_epochs`` x mini-batches.

        ``MINI_BATCH_SIZE`` in ``data.meta_info`` is the global mini-batch size in sequences (``SEED`` seeds the shuffle). Besides the
        mean loss and optimizer metrics (``critic/skipped``: the fraction of skipped optimizer steps,
        ``critic/skipped_steps``: the engine's count, as the actor reports them), it reports
        ``critic/optim_steps`` and ``critic/trailing_skipped_steps`` (how many of the last optimizer
        steps were skipped in a row) for the driver's divergence guard. An empty batch has no mini-batches: no
        optimizer step, ``critic/optim_steps`` 0.
        """
        cfg = self.critic_config
        local_mini_batch = max(1, MINI_BATCH_SIZE.read(data.meta_info) // self.engine.mesh.dp_size)
        view = engine_batch(data, extra_keys=("values", "returns"))
        step_metrics, skipped = [], []
        with self.engine.train_mode():
            for mini_batch in view.make_iterator(local_mini_batch, cfg.ppo_epochs, cfg.shuffle, seed=SEED.read(data.meta_info)):
                _, metrics = self.engine.forward_backward(mini_batch, self.loss_fn)
                step = self.engine.optim_step()
                skipped.append(bool(step["skipped"]))
                step_metrics.append(
                    {**{k: v for k, v in metrics.items() if k.startswith("critic/")},
                     **{f"critic/{key}": float(step[key]) for key in ("grad_norm", "lr", "skipped", "skipped_steps")}}
                )
        return {**mean_per_key(step_metrics), "critic/optim_steps": float(len(skipped)),
                "critic/trailing_skipped_steps": float(trailing_skipped_steps(skipped))}


def trailing_skipped_steps(skipped: Sequence[bool]) -> int:
    """How many optimizer steps at the end of ``skipped`` (one flag per step, in order) were skipped in a row."""
    count = 0
    for flag in reversed(skipped):
        if not flag:
            break
        count += 1
    return count
