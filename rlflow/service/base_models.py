"""``BaseModelHost``: one Ray worker group serving every training and sampling client of one base model.

A host is keyed by the base model and the LoRA shape (rank and trained parts): its engine is built
with that shape, and every training client created with it is a set of adapters plus Adam state
that the host keeps on disk while another client's set is in the engine. Rank 0 is full fine-tuning:
the engine has no adapters, and a client's state is the whole model and its Adam moments. Switching clients saves
the active one's checkpoint and loads the next (``activate``), so clients queue on one engine
instead of each holding a model copy and a rollout engine. The rollout replica holds whichever
sampler weights were loaded last (``_load_sampler``).

Every method here blocks and runs on the host's one worker thread (``executor``), so the host's
calls reach the worker group one at a time; ``scheduler`` (``HostScheduler``) picks the order:
each client's requests in ``seq_id`` order, and no switch of clients while one holds gradients.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from rlflow.engines.config import StepHyperparams
from rlflow.errors import UserError
from rlflow.meta_info import METRICS
from rlflow.protocol import DataProto
from rlflow.service.batches import Datum, per_datum_logprobs
from rlflow.service.catalogue import BaseModel, LoraShape
from rlflow.service.scheduler import HostScheduler
from rlflow.service.model_worker import BaseModelWorker
from rlflow.config.loading.timeouts import group_timeouts, resource_wait_s
from rlflow.utils.logging import get_logger
from rlflow.workers import RayWorkerGroup, ResourcePool, RoleHandle, WorkerSpec

logger = get_logger(__name__)
INITIAL_STATE = "initial_adapters"  # the adapters and optimizer of a new training client, saved at start-up


@dataclass
class TrainingModel:
    """A training client's adapters: where their checkpoint lives while another client is active."""

    model_id: str
    base_model: str
    shape: LoraShape
    state_dir: Path
    saved: bool = False  # False: never left the engine (a new client starts from INITIAL_STATE)
    gradients_dropped: bool = False  # its accumulated gradients were dropped (held too long while others waited)


class GradientsDroppedError(UserError, RuntimeError):
    """A client's accumulated gradients were dropped before its ``optim_step`` (``HostScheduler``)."""


class HostDeadError(RuntimeError):
    """The host's workers died or hung; its clients' in-engine state is gone."""


class BaseModelHost:
    """A worker group (engine + rollout replica per rank) for one base model and LoRA shape."""

    def __init__(self, base: BaseModel, shape: LoraShape, config: Any, work_dir: Path, hold_s: float,
                 max_sample_batch: int, max_queued: int) -> None:
        self.base = base
        self.shape = shape
        # the worker group's and thread's name
        self.label = f"{base.name}-r{shape.rank}-{'-'.join(shape.parts)}" if shape.is_lora else f"{base.name}-full"
        self.config = config
        self.work_dir = work_dir
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"host-{self.label}")
        self.scheduler = HostScheduler(self.executor, self.drop_gradients, hold_s, max_batch=max_sample_batch,
                                       max_queued=max_queued)
        self.group: Optional[RayWorkerGroup] = None
        self.dead: Optional[str] = None
        self.active: Optional[TrainingModel] = None
        self.sampler: Optional[tuple[str, Optional[str]]] = None  # what the rollout holds: ("base"|"adapters", folder)

    @property
    def name(self) -> str:
        """The base model's name."""
        return self.base.name

    # ------------------------------------------------------------------ lifecycle (worker thread)
    def start(self) -> None:
        """Start the worker group and save the new-client state; idempotent (the host's thread calls it)."""
        if self.group is not None:
            return
        service = self.config.service
        trainer = self.config.trainer
        pool = ResourcePool(procs_per_node=trainer.n_procs_per_node, nnodes=trainer.nnodes,
                            cpus_per_proc=trainer.cpus_per_proc, device=trainer.device,
                            resource_wait_s=resource_wait_s(trainer), name=f"service-{self.label}")
        engine = OmegaConf.to_container(self.config.engine, resolve=True)
        engine["lora"] = {**engine.get("lora", {}), "rank": self.shape.rank, "alpha": float(service.lora_alpha),
                          "target_modules": ["all-linear"], **({"parts": list(self.shape.parts)} if self.shape.is_lora else {})}
        spec = WorkerSpec(BaseModelWorker, engine, self.config.rollout, str(self.base.path))
        self.group = RayWorkerGroup(pool, spec, name=f"service-{self.label}", timeouts=group_timeouts(trainer.timeouts))
        self._role.save_checkpoint(str(self.work_dir / INITIAL_STATE))
        logger.info("base model %s: worker group up (%s)", self.name, self.label)

    def shutdown(self) -> None:
        """Stop the worker group (blocks while Ray stops the workers)."""
        if self.group is not None:
            self.group.shutdown()
            self.group = None

    def mark_dead(self, reason: str) -> None:
        """Refuse every later call with ``reason`` (its workers died or hung), and stop the worker group on the
        host's own thread, so the caller (the server's event loop) does not wait for it."""
        self.dead = self.dead or reason
        self.executor.submit(self.shutdown)

    @property
    def _role(self) -> RoleHandle:
        if self.dead is not None:
            raise HostDeadError(f"the workers of base model {self.name!r} are gone ({self.dead}); create a new training client")
        if self.group is None:
            raise HostDeadError(f"the workers of base model {self.name!r} are not started")
        return self.group.role("main")

    # ------------------------------------------------------------------ training clients (worker thread)
    def activate(self, model: TrainingModel) -> None:
        """Put ``model``'s adapters and optimizer state in the engine (saving the active client's first)."""
        if self.active is model:
            return
        if self.active is not None:
            self._role.save_checkpoint(str(self.active.state_dir))
            self.active.saved = True
        source = model.state_dir if model.saved else self.work_dir / INITIAL_STATE
        self._role.load_checkpoint(str(source))
        self.active = model

    def forward_backward(self, model: TrainingModel, batch: DataProto, data: list[Datum]) -> tuple[list[list[float]], dict]:
        """Run ``batch`` (``training_batch`` of ``data``, its loss in ``meta_info``): per-datum target log-probs
        and ``{"loss:sum": ...}``; gradients accumulate unless ``FORWARD_ONLY`` (``rlflow.meta_info``)."""
        self.activate(model)
        output = self._role.forward_backward(batch)
        return per_datum_logprobs(output.batch["log_probs"], data), METRICS.read(output.meta_info)

    def optim_step(self, model: TrainingModel, lr: float, hyperparams: StepHyperparams) -> dict[str, float]:
        """One AdamW step of ``model``'s adapters (refused once after its gradients were dropped)."""
        if model.gradients_dropped:
            model.gradients_dropped = False
            raise GradientsDroppedError(
                f"model {model.model_id}: its gradients were dropped after service.gradient_hold_s without a request "
                "while other clients waited; this step is refused, run forward_backward again")
        self.activate(model)
        metrics = self._role.optim_step(lr, hyperparams)[0]
        return {key: float(value) for key, value in metrics.items()}

    def drop_gradients(self, model_id: str) -> None:
        """Zero the active client's accumulated gradients (it held them too long) and mark it."""
        if self.active is not None and self.active.model_id == model_id:
            self._role.zero_grad()
            self.active.gradients_dropped = True
            logger.warning("model %s held gradients too long while other clients waited: dropped them", model_id)

    def save_state(self, model: TrainingModel, folder: Path) -> None:
        """Write ``model``'s resumable state (adapters, Adam moments, step counters) to ``folder``."""
        self.activate(model)
        self._role.save_checkpoint(str(folder))

    def load_state(self, model: TrainingModel, folder: Path, optimizer: bool) -> None:
        """Replace ``model``'s weights with the ones saved in ``folder`` (same base model and LoRA shape), and its
        optimizer state with the saved one (``optimizer``) or a new optimizer's."""
        self.activate(model)
        self._role.load_checkpoint(str(folder))
        if not optimizer:
            self._role.reset_optimizer()

    def save_sampler(self, model: TrainingModel, folder: Path) -> None:
        """Write ``model``'s adapters as a peft folder (full fine-tuning: its weights as an HF folder) and load its
        weights into the rollout replicas."""
        self.activate(model)
        if self.shape.is_lora:
            self._role.save_lora_adapter(str(folder))
        else:
            self._role.save_hf(str(folder))
        self._role.sync_sampler()
        self.sampler = ("adapters", str(folder))

    def sample(self, adapter_folder: Optional[str], prompts: DataProto) -> DataProto:
        """Generate for ``prompts`` (``SAMPLING`` set in its ``meta_info``) with the base model plus the saved
        adapters in ``adapter_folder`` (None: the base model alone)."""
        self._hold_sampler(adapter_folder)
        return self._role.generate_sequences(prompts)

    def score_prompts(self, adapter_folder: Optional[str], prompts: DataProto) -> DataProto:
        """Score ``prompts`` (``PROMPT_TOP_K`` in its ``meta_info``) with the weights ``sample`` would use: the
        ``rlflow.rollout.prompt_scores`` columns."""
        self._hold_sampler(adapter_folder)
        return self._role.score_prompts(prompts)

    def _hold_sampler(self, adapter_folder: Optional[str]) -> None:
        wanted = ("base", None) if adapter_folder is None else ("adapters", adapter_folder)
        if self.sampler != wanted:
            self.sampler = None  # a failed load leaves the replicas holding no known weights
            self._role.load_sampler(adapter_folder)
            self.sampler = wanted
