"""``TinkerService``: the state behind the HTTP routes (sessions, training clients, samplers, futures).

A training or sampling request is checked when it arrives (unknown model, malformed data, a
sequence too long: ``UserError``, answered 4xx by the app) and queued on its base model's host;
the client gets a request id at once and polls ``retrieve_future``. The host runs its queue in
order on one thread; each job's outcome, or its error named after the request, fills the future.
A host whose workers died or hung is shut down, and its clients' requests fail from then on
(their saved checkpoints stay loadable by a new client).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from rlflow.engines.base import Capability
from rlflow.engines.registry import ENGINE_REGISTRY, engines_with
from rlflow.errors import UserError
from rlflow.meta_info import CUSTOM_LOSS, FORWARD_ONLY, LOSS_FN, LOSS_FN_CONFIG, PROMPT_TOP_K
from rlflow.service.base_models import BaseModelHost, TrainingModel
from rlflow.service.batches import training_batch
from rlflow.service.catalogue import BaseModel, CheckpointFolders, LoraShape, UnknownModelError, find_base_model
from rlflow.service.custom_losses import CUSTOM, CustomLossStore, request_metrics
from rlflow.service.futures import FutureStore, Outcome, Payload
from rlflow.service.scheduler import Job, JobBatch
from rlflow.service.losses import loss_config, loss_inputs
from rlflow.service.sampling import SamplingRequest, rollout_prompts, sample_outcome, sample_outcomes
from rlflow.service.sequencer import RequestSequencer
from rlflow.service.wire import PROTOBUF, ForwardBackwardCall, encode_forward_backward_output
from rlflow.utils.logging import get_logger
from rlflow.workers import WorkerDiedError, WorkerTimeoutError

logger = get_logger(__name__)
REQUEST_LOG = "requests.jsonl"
# Tinker's create_model flags -> rlflow's LoRA parts.
PART_FLAGS = {"train_attn": "attention", "train_mlp": "mlp", "train_unembed": "unembedding"}
SAMPLING_SHAPE = LoraShape(1, ("attention",))  # the smallest, for a group started by a base model's sampler


def session_of(model_id: str) -> str:
    """The session a training client's id ``<session id>:train:<n>`` belongs to."""
    return model_id.rsplit(":train:", 1)[0]


class CapacityError(UserError, RuntimeError):
    """The request needs another worker group and the service already runs ``service.max_hosts``."""


class RequestLog:
    """One JSON line per finished request: id, label, model and seq_id, when it was queued, started and finished,
    and its error if any (the order requests ran in, and their latency)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, entry: dict[str, Any]) -> None:
        with self.path.open("a") as log:
            log.write(json.dumps(entry) + "\n")


@dataclass
class Client:
    """A training client: its adapters on a host, and the order its requests run in."""

    model: TrainingModel
    host: BaseModelHost
    sequencer: RequestSequencer
    requested_base: str  # the base model as the client named it (returned by get_info)
    account: str  # rlflow.service.accounts


@dataclass
class InflightWeights:
    """The weights a training client's ``inflight`` sampling sessions share: the adapters it saved last."""

    folder: str


@dataclass
class Sampler:
    """A sampling session: a host and the saved adapters it samples with (None: the base model), or, for an
    ``inflight`` session, whichever adapters its training client saved for inflight sampling last."""

    host: BaseModelHost
    adapter_folder: Optional[str]
    base_model: str
    model_path: Optional[str]
    account: str
    inflight: Optional[InflightWeights] = None

    def weights_folder(self) -> Optional[str]:
        """The adapters this session samples with now."""
        return self.adapter_folder if self.inflight is None else self.inflight.folder


class TinkerService:
    """The service's state; every method runs on the server's event loop."""

    def __init__(self, config: Any, catalogue: dict[str, BaseModel], work_dir: Path) -> None:
        service = config.service
        self.config = config
        self.catalogue = catalogue
        self.folders = CheckpointFolders(work_dir)
        self.futures = FutureStore(service.poll_wait_s, service.keep_result_s, service.expire_result_s)
        self.max_seq_len = int(service.max_seq_len)
        self.hosts: dict[tuple[str, LoraShape], BaseModelHost] = {}
        self.clients: dict[str, Client] = {}
        self.samplers: dict[str, Sampler] = {}
        self.sessions: dict[str, str] = {}  # session id -> its account
        self.inflight: dict[str, InflightWeights] = {}  # model id -> what its inflight sampling sessions use
        self.custom_losses = CustomLossStore()
        self._session_ids = itertools.count()
        self.request_log = RequestLog(work_dir / REQUEST_LOG)

    # ------------------------------------------------------------------ sessions
    def create_session(self, account: str) -> str:
        session_id = f"s{next(self._session_ids)}-{uuid.uuid4().hex[:8]}"
        self.sessions[session_id] = account
        return session_id

    def _session(self, body: dict[str, Any], account: str) -> str:
        """The body's ``session_id``, one of ``account``'s sessions (else ``UnknownModelError``)."""
        session_id = body.get("session_id")
        if not isinstance(session_id, str) or self.sessions.get(session_id) != account:
            raise UnknownModelError(f"session {session_id!r} does not exist (create one with create_session)")
        return session_id

    def create_custom_loss(self, body: dict[str, Any], account: str) -> str:
        """Check and store a ``CreateCustomLossRequest``'s loss in one of ``account``'s sessions; the request id of
        its (already finished) future, whose result names the loss id."""
        loss_id = self.custom_losses.create(body, self._session(body, account), account)
        request_id = self.futures.create(account)
        self.futures.finish(request_id, Outcome(payload={"type": "create_custom_loss", "loss_id": loss_id}))
        return request_id

    def _new_model_id(self, body: dict[str, Any], account: str) -> str:
        """``<session id>:train:<model_seq_id>``, the id the SDK expects (it builds it itself for a client from a
        state), in one of ``account``'s sessions."""
        session_id = self._session(body, account)
        if not isinstance(body.get("model_seq_id", 0), int):
            raise UserError("the request needs a model_seq_id (an integer)")
        return f"{session_id}:train:{body.get('model_seq_id', 0)}"

    # ------------------------------------------------------------------ running requests
    def _queue(self, host: BaseModelHost, label: str, job: Callable[[], Payload], account: str, owner: Optional[str] = None,
               seq_id: Optional[int] = None, accumulates: bool = False, steps: bool = False,
               batch: Optional[JobBatch] = None) -> str:
        """Queue ``job`` on ``host`` for ``account`` (``owner``: the training client whose engine state it uses, None: the sampler
        only; ``HostScheduler`` orders it, and runs it with queued jobs of its ``batch`` key). Its result, or its
        error naming ``label``, fills a new future, and the request log gets a line when it ends (``batched``: the
        requests that ran in its call)."""
        request_id = self.futures.create(account)
        entry = {"request_id": request_id, "label": label, "model_id": owner, "seq_id": seq_id, "queued": time.time()}

        def started(jobs_in_call: int) -> None:
            entry.update(started=time.time(), batched=jobs_in_call)

        def done(task: asyncio.Future) -> None:
            outcome = self._outcome(host, label, task)
            self.futures.finish(request_id, outcome)
            self.request_log.write({**entry, "finished": time.time(), "error": outcome.error})

        host.scheduler.submit(Job(owner, job, done, accumulates=accumulates, steps=steps, on_start=started, batch=batch))
        return request_id

    def _outcome(self, host: BaseModelHost, label: str, done: asyncio.Future) -> Outcome:
        error = done.exception()
        if error is None:
            return Outcome(payload=done.result())
        if isinstance(error, (WorkerDiedError, WorkerTimeoutError)):
            host.mark_dead(f"{type(error).__name__} during {label}")
        if isinstance(error, UserError):
            return Outcome(error=f"{label}: {error}", category="user")
        logger.error("%s failed", label, exc_info=error)
        return Outcome(error=f"{label} failed on the server: {type(error).__name__}: {error}", category="server")

    async def retrieve(self, request_id: str, account: str) -> Optional[Outcome]:
        """The outcome of ``request_id`` (long poll), None while it runs; ``UnknownFutureError`` if unknown to
        ``account``."""
        return await self.futures.retrieve(request_id, account)

    # ------------------------------------------------------------------ training clients
    def _host(self, base: BaseModel, shape: LoraShape) -> BaseModelHost:
        key = (base.name, shape)
        host = self.hosts.get(key)
        if host is not None and host.dead is None:
            return host
        live = sum(h.dead is None for h in self.hosts.values())
        if live >= int(self.config.service.max_hosts):
            raise CapacityError(f"base model {base.name!r} with LoRA rank {shape.rank} on {'+'.join(shape.parts)} needs "
                                f"another worker group, and service.max_hosts={self.config.service.max_hosts} are running")
        host = BaseModelHost(base, shape, self.config, self.folders.root / "hosts" / str(len(self.hosts)),
                             hold_s=float(self.config.service.gradient_hold_s),
                             max_sample_batch=int(self.config.service.max_sample_batch),
                             max_queued=int(self.config.service.max_queued_requests))
        self.hosts[key] = host
        return host

    @property
    def _engine_has_lora(self) -> bool:
        return Capability.LORA in ENGINE_REGISTRY.get(str(self.config.engine.name)).capabilities

    def _lora_shape(self, lora_config: dict[str, Any]) -> LoraShape:
        """The client's adapters; rank 0 is full fine-tuning (every weight trains, the part flags do not apply)."""
        rank = int(lora_config.get("rank", 32))
        if rank == 0:
            return LoraShape(0, ())
        parts = tuple(part for flag, part in PART_FLAGS.items() if lora_config.get(flag, True))
        if rank < 0 or not parts:
            raise UserError(f"lora_config {lora_config}: rank must be >= 0 (0: full fine-tuning) and, with adapters, "
                            f"at least one of {sorted(PART_FLAGS)} true")
        if not self._engine_has_lora:
            raise UserError(f"engine {self.config.engine.name!r} trains no LoRA adapters: create the client with rank=0 "
                            f"(full fine-tuning), or serve with one of {list(engines_with(Capability.LORA))}")
        return LoraShape(rank, parts)

    def create_model(self, body: dict[str, Any], account: str) -> tuple[str, str]:
        """Create a training client (``create_model``) for ``account``: its request id and model id."""
        model_id = self._new_model_id(body, account)
        base = find_base_model(self.catalogue, str(body.get("base_model")))
        shape = self._lora_shape(body.get("lora_config") or {})
        return self._add_client(model_id, base, shape, str(body.get("base_model")), account, label=f"create_model {model_id}",
                                then=None, result={"model_id": model_id, "type": "create_model"}), model_id

    def create_model_from_state(self, body: dict[str, Any], account: str) -> str:
        """``load_weights`` without a model id: a new training client of ``account`` starting from a saved state's
        weights, and its optimizer state if the body's ``optimizer`` is set (``..._with_optimizer``)."""
        model_id = self._new_model_id(body, account)
        source_id, folder = self.folders.resolve(str(body.get("path")), "weights", account)
        base_name, shape = self.folders.read_record(source_id)
        base = find_base_model(self.catalogue, base_name)
        return self._add_client(model_id, base, shape, base_name, account, label=f"load_weights {model_id}",
                                then=lambda host, model: host.load_state(model, folder, bool(body.get("optimizer"))),
                                result={"model_id": model_id, "path": str(body.get("path")), "type": "load_weights"})

    def _add_client(self, model_id: str, base: BaseModel, shape: LoraShape, requested: str, account: str, label: str,
                    then: Optional[Callable[[BaseModelHost, TrainingModel], None]], result: Payload) -> str:
        """Register a training client (its requests start at seq_id 1) and queue its start: the host's workers,
        then ``then`` (a state to load); the future's result is ``result``."""
        if model_id in self.clients:
            raise UserError(f"model id {model_id!r} exists already (model_seq_id reused in this session)")
        host = self._host(base, shape)
        host.scheduler.check_room(label)
        model = TrainingModel(model_id, base.name, shape, self.folders.model_dir(model_id) / "active_state")
        self.folders.write_record(model_id, base.name, shape, account)
        sequencer = RequestSequencer(model_id, first_seq_id=1, gap_wait_s=float(self.config.service.seq_gap_wait_s))
        self.clients[model_id] = Client(model, host, sequencer, requested, account)

        def job() -> Payload:
            host.start()
            if then is not None:
                then(host, model)
            return result

        return self._queue(host, label, job, account, owner=model_id if then is not None else None)

    def client(self, model_id: str, account: str) -> Client:
        """``account``'s training client ``model_id`` (another account's does not exist to it)."""
        client = self.clients.get(model_id)
        if client is None or client.account != account:
            raise UnknownModelError(f"model {model_id!r} does not exist (create it with create_lora_training_client)")
        return client

    def get_info(self, model_id: str, account: str) -> dict[str, Any]:
        client = self.client(model_id, account)
        base = self.catalogue[client.model.base_model]
        return {"type": "get_info", "model_id": model_id, "is_lora": client.model.shape.is_lora,
                "lora_rank": client.model.shape.rank,
                "model_name": client.requested_base,
                "model_data": {"arch": "causal_lm", "model_name": client.requested_base, "tokenizer_id": str(base.path)}}

    async def submit(self, model_id: str, account: str, seq_id: Optional[int], label: str,
                     prepare: Callable[[Client], Callable[[], Payload]], accumulates: bool = False, steps: bool = False) -> str:
        """Admit a training client's request in ``seq_id`` order and queue the job ``prepare(client)`` returns
        (``accumulates``: it leaves gradients in the engine; ``steps``: it uses them up; see ``HostScheduler``).

        ``prepare`` checks the request (raising ``UserError``, answered 4xx) and returns the job; a refused
        request still takes its turn, so the client's next one is not held up waiting for it. A request refused for a
        full queue keeps its ``seq_id`` for the client's retry (``RequestSequencer.in_turn_with_room``).
        """
        client = self.client(model_id, account)
        earlier = client.sequencer.earlier_request(seq_id)
        if earlier is not None:
            return earlier
        label = f"{label} (model {model_id}, seq_id {seq_id})"
        client.sequencer.in_turn_with_room(seq_id, lambda: client.host.scheduler.check_room(label))
        await client.sequencer.admit(seq_id)
        request_id = None
        try:
            request_id = self._queue(client.host, label, prepare(client), account, model_id, seq_id, accumulates, steps)
            return request_id
        finally:
            await client.sequencer.release(seq_id, request_id)

    def forward_backward_job(self, call: ForwardBackwardCall) -> Callable[[Client], Callable[[], Payload]]:
        def prepare(client: Client) -> Callable[[], Payload]:
            base = self.catalogue[client.model.base_model]
            if call.loss_fn == CUSTOM:
                custom = self.custom_losses.get(call.loss_fn_config, session_of(client.model.model_id), client.account)
                batch = training_batch(call.data, dict(custom.inputs[1:]), base.pad_token_id, self.max_seq_len, base.vocab_size)
                batch.meta_info = {LOSS_FN.name: CUSTOM, CUSTOM_LOSS.name: custom}
            else:
                batch = training_batch(call.data, dict.fromkeys(loss_inputs(call.loss_fn), 1), base.pad_token_id,
                                       self.max_seq_len, base.vocab_size)
                batch.meta_info = {LOSS_FN.name: call.loss_fn, LOSS_FN_CONFIG.name: loss_config(call.loss_fn, call.loss_fn_config)}
            batch.meta_info[FORWARD_ONLY.name] = call.forward_only

            def job() -> Payload:
                logprobs, metrics = client.host.forward_backward(client.model, batch, call.data)
                return PROTOBUF, encode_forward_backward_output(logprobs, request_metrics(metrics, len(call.data)))

            return job

        return prepare

    def sampler(self, sampling_session_id: str, account: str) -> Sampler:
        """``account``'s sampling session (another account's does not exist to it)."""
        sampler = self.samplers.get(sampling_session_id)
        if sampler is None or sampler.account != account:
            raise UnknownModelError(f"sampling session {sampling_session_id!r} does not exist")
        return sampler

    def create_sampling_session(self, body: dict[str, Any], account: str) -> str:
        """A sampling session of ``account`` over the saved adapters at ``model_path``, or over ``base_model`` alone."""
        session_id = self._session(body, account)
        seq, model_path, base_model = int(body.get("sampling_session_seq_id", 0)), body.get("model_path"), body.get("base_model")
        if model_path:
            source_id, folder = self.folders.resolve(str(model_path), "sampler_weights", account)
            base_name, shape = self.folders.read_record(source_id)
            base = find_base_model(self.catalogue, base_name)
            sampler = Sampler(self._host(base, shape), str(folder), base_model or base_name, model_path, account)
        else:
            base = find_base_model(self.catalogue, str(base_model))
            # any live group of the base model samples it (its rollout loads the base weights); with none, one is
            # started with the smallest LoRA shape (full fine-tuning on an engine without LoRA), which a later
            # training client of that shape shares
            hosts = [host for (name, _), host in self.hosts.items() if name == base.name and host.dead is None]
            host = hosts[0] if hosts else self._host(base, SAMPLING_SHAPE if self._engine_has_lora else LoraShape(0, ()))
            sampler = Sampler(host, None, str(base_model), None, account)
        sampling_session_id = f"{session_id}:sample:{seq}"
        self.samplers[sampling_session_id] = sampler
        return sampling_session_id

    def sample(self, request: SamplingRequest, account: str) -> tuple[str, list[str]]:
        """Queue a sampling request; returns its request id and the ids of its samples. Queued requests of one
        sampler with one ``batch_key`` run as one rollout call (``HostScheduler``, ``service.max_sample_batch``); a full
        queue refuses it (``QueueFullError``: the SDK backs off and sends it again)."""
        sampler = self.sampler(request.sampling_session_id, account)
        base = self.catalogue[sampler.host.name]
        request.check(self.max_seq_len, base.vocab_size)
        sampler.host.scheduler.check_room(f"asample (session {request.sampling_session_id})")
        folder = sampler.weights_folder()  # an inflight session: the newest weights saved when the request arrives

        def run_together(requests: list[SamplingRequest]) -> list[Payload]:
            sampler.host.start()
            prompts = rollout_prompts(requests, base.pad_token_id)
            return sample_outcomes(sampler.host.sample(folder, prompts), requests, base)

        def run_scored() -> Payload:  # a request with prompt log-probs runs alone (no batch key)
            sampler.host.start()
            prompts = rollout_prompts([request], base.pad_token_id)
            samples = sampler.host.sample(folder, prompts)
            prompts.meta_info = {PROMPT_TOP_K.name: request.topk_prompt_logprobs}
            return sample_outcome(samples, request, base, sampler.host.score_prompts(folder, prompts))

        batch = None
        if request.batch_key is not None:
            batch = JobBatch((folder, request.batch_key), request, run_together)
        request_id = self._queue(sampler.host, f"asample (session {request.sampling_session_id})",
                                 run_scored if request.scores_prompt else lambda: run_together([request])[0], account,
                                 batch=batch)
        return request_id, [f"{request_id}:{index}" for index in range(request.num_samples)]

    def shutdown(self) -> None:
        for host in self.hosts.values():
            host.shutdown()
            host.executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["CapacityError", "TinkerService", "session_of"]
