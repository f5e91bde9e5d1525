"""In-process unit tests of the shared engine machinery (no process group needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from engine_testlib import build_test_model
from rlflow.engines import BaseEngine, EngineConfigError, EngineRegistry, build_engine, get_engine_cls
from rlflow.engines.common import checkpointing as ckpt
from rlflow.engines.common.hf_export import write_hf_folder
from rlflow.engines.common.logprob import chunked_log_probs
from rlflow.engines.common.models import get_model_kind
from rlflow.engines.common.lr_schedulers import LR_SCHEDULE_REGISTRY, LRSchedule, register_lr_schedule
from rlflow.engines.common.micro_batching import plan_micro_batches
from rlflow.engines.common.optimizers import build_adamw, clean_param_name, no_decay_names
from rlflow.engines.common.packing import first_fit_rows, make_token_stream, row_width
from rlflow.engines.config import (
    ADAMW_IMPLEMENTATIONS,
    EngineConfig,
    HFModuleEngineConfig,
    LRSchedulerConfig,
    OptimizerConfig,
    config_from_mapping,
)
from rlflow.engines.fsdp import FSDPEngine, FSDPEngineConfig
from rlflow.engines.fsdp2 import FSDP2Engine, FSDP2EngineConfig
from rlflow.errors import CheckpointError
from rlflow.config.loading.hydra_entry import CONFIG_DIR


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_model(tmp_path_factory.mktemp("unit_model") / "tiny")


# ------------------------------------------------------------------------------ micro-batching
def test_fixed_micro_batches_are_consecutive_and_bounded() -> None:
    plan = plan_micro_batches([5] * 10, micro_batch_size=4, use_dynamic_bsz=False, max_token_len=1)
    assert [len(g) for g in plan.groups] == [3, 4, 3]
    assert plan.order == list(range(10))


def test_dynamic_micro_batches_respect_budget_and_restore_order() -> None:
    lengths = [10, 20, 20, 3, 20, 20, 7]
    plan = plan_micro_batches(lengths, micro_batch_size=1, use_dynamic_bsz=True, max_token_len=40)
    assert all(sum(lengths[i] for i in g) <= 40 for g in plan.groups)
    assert len(plan.groups) == math.ceil(sum(lengths) / 40) == 3
    assert sorted(sum(lengths[i] for i in g) for g in plan.groups) == [30, 30, 40]
    stacked = torch.tensor(plan.order, dtype=torch.float32).unsqueeze(-1)  # row i holds its input index
    assert plan.restore(stacked).squeeze(-1).tolist() == list(range(len(lengths)))


def test_micro_batching_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="max_token_len_per_micro_batch=10"):
        plan_micro_batches([11, 3], micro_batch_size=1, use_dynamic_bsz=True, max_token_len=10)
    with pytest.raises(ValueError, match="empty batch"):
        plan_micro_batches([], micro_batch_size=1, use_dynamic_bsz=False, max_token_len=10)


# ------------------------------------------------------------------------------------ packing
def _targets_as_rows(stream) -> torch.Tensor:
    flat = torch.zeros(stream.input_ids.numel(), dtype=torch.long)
    flat[stream.target_index] = stream.labels
    return stream.to_rows(flat)


def test_packed_rows_reset_positions_and_unpack() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    predicted = ids * mask
    predicted[0, 2] = predicted[1, 0] = predicted[2, 0] = 0  # first tokens are never predicted
    stream = make_token_stream(ids, mask, None, remove_padding=True)  # sdpa: rows as long as the longest
    assert stream.input_ids.tolist() == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9]]
    assert stream.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert stream.attention_mask is None
    assert torch.equal(stream.to_rows(stream.input_ids.reshape(-1)), ids * mask)
    assert torch.equal(_targets_as_rows(stream), predicted)
    varlen = make_token_stream(ids, mask, None, remove_padding=True, attn_implementation="flash_attention_2")
    assert varlen.input_ids.shape == (1, 10) and torch.equal(_targets_as_rows(varlen), predicted)
    padded = make_token_stream(ids, mask, None, remove_padding=False)
    assert padded.input_ids is ids and torch.equal(_targets_as_rows(padded), predicted)


def test_packed_rows_fill_the_tail_with_a_separate_block() -> None:
    ids = torch.arange(1, 13).reshape(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    stream = make_token_stream(ids, mask, None, remove_padding=True)
    # rows of 4: [seq2], [seq0 + 1 filler], [seq1 + 2 fillers]; fillers restart positions at 0
    assert stream.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 1]]
    assert stream.target_index.tolist() == [1, 2, 3, 5, 6, 9]
    assert torch.equal(stream.to_rows(stream.input_ids.reshape(-1)), ids * mask)


def test_row_width_widens_rows_only_when_the_filler_saved_outweighs_the_attention() -> None:
    similar = [84, 80, 70, 60, 50] * 20  # most longer than half the longest: one per row at width 84
    assert row_width(similar, hidden_size=None) == 84
    assert row_width(similar, hidden_size=512) > 84  # wider rows pair them up
    assert row_width(similar, hidden_size=8) == 84  # attention dear relative to the layers: keep rows short
    assert row_width([84, 20, 20, 20, 20], hidden_size=512) == 84  # already filled at width 84


def test_row_width_finds_the_fit_between_two_multiples_of_the_longest() -> None:
    lengths = [100] + [60] * 40  # two 60s fill a row of 120+, one fills a row of 100, three need 180+
    width = row_width(lengths, hidden_size=512)
    assert 120 <= width < 200

    def slots(width: int) -> int:
        return len(first_fit_rows(lengths, width)) * width

    assert slots(width) < min(slots(multiple * 100) for multiple in (1, 2, 3, 4))  # fewer slots than any multiple


def test_wide_packed_rows_keep_each_sequence_apart() -> None:
    lengths = [7, 4, 4, 4]  # one per row at width 7, all four in one row of 21
    width = max(lengths)
    ids = torch.arange(1, len(lengths) * width + 1).reshape(len(lengths), width)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    narrow = make_token_stream(ids, mask, None, remove_padding=True)
    wide = make_token_stream(ids, mask, None, remove_padding=True, hidden_size=10**6)
    assert wide.input_ids.shape[1] > narrow.input_ids.shape[1] and wide.input_ids.numel() < narrow.input_ids.numel()
    assert torch.equal(wide.to_rows(wide.input_ids.reshape(-1)), ids * mask)
    assert torch.equal(_targets_as_rows(wide), _targets_as_rows(narrow))
    starts = (wide.position_ids.reshape(-1) == 0).sum()  # every sequence and each row's filler restart at 0
    assert starts >= len(lengths)


def test_wide_packed_rows_give_the_padded_log_probs(model_path: Path) -> None:
    """The HF model itself on wide packed rows (several sequences and a filler block per row) against its padded batch."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    forward = get_model_kind("causal_lm").forward_cls(model, logprob_chunk_size=64)
    generator = torch.Generator().manual_seed(3)
    lengths = [24, 13, 13, 13, 13]  # one per row at width 24; two rows at width 48
    ids = torch.randint(3, 100, (len(lengths), 24), generator=generator)
    mask = (torch.arange(24)[None, :] >= 24 - torch.tensor(lengths)[:, None]).long()  # left padding
    with torch.no_grad():
        padded = forward(make_token_stream(ids, mask, None, remove_padding=False), 1.0, False)["log_probs"]
        wide_stream = make_token_stream(ids, mask, None, remove_padding=True, hidden_size=10**6)
        wide = forward(wide_stream, 1.0, False)["log_probs"]
    assert wide_stream.input_ids.shape[1] > max(lengths) and wide_stream.input_ids.numel() < ids.numel()
    torch.testing.assert_close(wide, padded, atol=1e-5, rtol=0)
    assert padded.abs().sum() > 0


# ---------------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_chunked_log_probs_match_full_softmax(chunk_size: int) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(7, 8, requires_grad=True)
    labels = torch.randint(0, 11, (7,))
    log_probs, entropy = chunked_log_probs(
        hidden, head, labels, temperature=0.7, chunk_size=chunk_size, compute_entropy=True
    )
    (log_probs.sum() + entropy.sum()).backward()
    grads = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    full = torch.log_softmax(head(hidden) / 0.7, dim=-1)
    expected_lp = full.gather(-1, labels[:, None]).squeeze(-1)
    expected_ent = -(full.exp() * full).sum(-1)
    (expected_lp.sum() + expected_ent.sum()).backward()
    torch.testing.assert_close(log_probs, expected_lp)
    torch.testing.assert_close(entropy, expected_ent)
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], head.weight.grad)


def test_log_probs_reject_bad_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        chunked_log_probs(torch.zeros(2, 3), torch.nn.Identity(), torch.zeros(2, dtype=torch.long), temperature=0.0)


# -------------------------------------------------------------------------------- LR schedules
def test_warmup_starts_above_zero_and_decays_to_floor() -> None:
    config = LRSchedulerConfig(name="cosine", warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    schedule = LRSchedule(config, base_lr=2.0)
    lrs = []
    for _ in range(16):
        lrs.append(schedule.current_lr())
        schedule.advance()
    assert lrs[:5] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])
    assert lrs[9] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))
    assert lrs[14] == pytest.approx(0.2) and lrs[15] == pytest.approx(0.2)
    linear = LRSchedule(LRSchedulerConfig(name="linear", total_steps=10), base_lr=1.0)
    assert [linear.multiplier(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])
    constant = LRSchedule(LRSchedulerConfig(name="constant", warmup_steps=2), base_lr=1.0)
    assert [constant.multiplier(s) for s in (0, 1, 2, 100)] == [0.5, 1.0, 1.0, 1.0]


def test_schedule_errors_and_registry() -> None:
    with pytest.raises(EngineConfigError, match="registered"):
        LRSchedule(LRSchedulerConfig(name="triangle"), 1.0)
    with pytest.raises(EngineConfigError, match="total_steps"):
        LRSchedule(LRSchedulerConfig(name="cosine", warmup_steps=5, total_steps=0), 1.0)
    with LR_SCHEDULE_REGISTRY.temporary():
        register_lr_schedule("half_test", needs_total_steps=False)(lambda progress, floor: 0.5)
        assert LRSchedule(LRSchedulerConfig(name="half_test"), 4.0).current_lr() == 2.0
        register_lr_schedule("half_decay_test")(lambda progress, floor: 0.5)
        with pytest.raises(EngineConfigError, match="total_steps"):  # needs_total_steps defaults to True
            LRSchedule(LRSchedulerConfig(name="half_decay_test"), 4.0)


# ---------------------------------------------------------------------------------- optimizer
def test_adamw_skips_decay_on_biases_and_norms(model_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_path)
    no_decay = no_decay_names(model)
    assert "model.norm.weight" in no_decay and "model.layers.0.self_attn.q_proj.bias" in no_decay
    assert "model.layers.0.self_attn.q_proj.weight" not in no_decay
    optimizer = build_adamw(model.named_parameters(), no_decay, OptimizerConfig(weight_decay=0.1))
    by_decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in optimizer.param_groups}
    params = dict(model.named_parameters())
    assert id(params["model.norm.weight"]) in by_decay[0.0]
    assert id(params["model.embed_tokens.weight"]) in by_decay[0.1]
    assert clean_param_name("model._fsdp_wrapped_module.layers.0._fsdp_wrapped_module.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )



@pytest.mark.parametrize("implementation", ADAMW_IMPLEMENTATIONS)
def test_adamw_runs_the_kernels_named_and_steps_like_the_python_loop(implementation: str) -> None:
    """Each ``optimizer.implementation`` selects its AdamW kernels, and 3 steps land within 1e-6 of torch's
    for-loop AdamW on the same gradients (the kernels differ in rounding only)."""
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    reference.load_state_dict(model.state_dict())
    optimizer = build_adamw(model.named_parameters(), set(), OptimizerConfig(lr=1e-2, implementation=implementation))
    expected = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.01, foreach=False)
    assert bool(optimizer.defaults["fused"]) == (implementation == "fused")
    assert bool(optimizer.defaults["foreach"]) == (implementation == "foreach")
    for _ in range(3):
        for net, opt in ((model, optimizer), (reference, expected)):
            net(torch.linspace(-1, 1, 32).view(2, 16)).square().sum().backward()
            opt.step()
            opt.zero_grad()
    for param, ref in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(param, ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(EngineConfigError, match="optimizer.implementation='fast'"):
        config_from_mapping(EngineConfig, {"name": "fsdp2", "optimizer": {"implementation": "fast"}})

# ------------------------------------------------------------------------- registry and config
def test_unknown_engine_lists_registered() -> None:
    with pytest.raises(EngineConfigError, match=r"unknown engine 'nope' \(config key engine.name\); registered: fsdp, fsdp2"):
        get_engine_cls("nope")
    with pytest.raises(EngineConfigError, match="needs a 'name'"):
        build_engine({}, "unused")


def test_build_engine_validates_against_the_engine_dataclass(model_path: Path) -> None:
    engine = build_engine({"name": "fsdp2", "hybrid_replicate_size": 2, "optimizer": {"lr": 0.5}}, model_path)
    assert isinstance(engine, FSDP2Engine) and isinstance(engine.config, FSDP2EngineConfig)
    assert engine.config.optimizer.lr == 0.5 and engine.config.hybrid_replicate_size == 2
    assert isinstance(build_engine({"name": "fsdp"}, model_path), FSDPEngine)
    with pytest.raises(EngineConfigError, match="hybrid_replicate_size"):
        build_engine({"name": "fsdp", "hybrid_replicate_size": 2}, model_path)  # an fsdp2-only key
    with pytest.raises(EngineConfigError, match="optimizer.lrr"):
        build_engine({"name": "fsdp2", "optimizer": {"lrr": 1.0}}, model_path)
    with pytest.raises(EngineConfigError, match="'micro_batch_size': must be >= 1, got 0"):
        config_from_mapping(FSDPEngineConfig, {"micro_batch_size": 0})
    with pytest.raises(ValueError, match="unknown model kind"):
        build_engine({"name": "fsdp2"}, model_path, model_kind="diffusion")


def test_registering_a_new_engine() -> None:
    from dataclasses import dataclass

    @dataclass
    class ToyConfig(EngineConfig):
        name: str = "toy_test_engine"
        toy_knob: int = 3

    with EngineRegistry.temporary():

        @EngineRegistry.register("toy_test_engine")
        class ToyEngine(FSDP2Engine):
            config_class = ToyConfig

        engine = build_engine({"name": "toy_test_engine", "toy_knob": 5}, "unused")
        assert isinstance(engine, ToyEngine) and engine.config.toy_knob == 5
        assert "toy_test_engine" in EngineRegistry.names()
        with pytest.raises(TypeError):
            EngineRegistry.register("not_an_engine")(dict)
    assert "toy_test_engine" not in EngineRegistry
    assert issubclass(ToyEngine, BaseEngine)


@pytest.mark.parametrize("name", ["fsdp", "fsdp2", "megatron", "torchtitan"])
def test_engine_yaml_is_valid_and_documented(name: str) -> None:
    from hydra import compose, initialize_config_dir

    configs = Path(CONFIG_DIR)
    with initialize_config_dir(str(configs), version_base=None):
        node = compose(config_name=f"engine/{name}").engine
    config = config_from_mapping(get_engine_cls(name).config_class, node)
    assert config.name == name
    defaults = type(config)()
    assert config == type(defaults)(**{**defaults.__dict__, "name": name})  # the YAML restates the defaults
    common = configs / "engine" / "common"
    for path in (configs / "engine" / f"{name}.yaml", common / "hf_module.yaml", common / "base.yaml"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped and not stripped.startswith(("#", "- ")) and stripped != "defaults:":
                assert "#" in stripped, f"{path.name}: '{stripped}' has no comment"


@pytest.mark.parametrize("option,config_class", [("base", EngineConfig), ("hf_module", HFModuleEngineConfig)])
def test_common_engine_yaml_layers_match_their_dataclasses(option: str, config_class: type) -> None:
    """base.yaml alone is a complete EngineConfig (what megatron.yaml composes); hf_module.yaml adds the HF keys."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(CONFIG_DIR, version_base=None):
        node = compose(config_name=f"engine/common/{option}").engine.common
    assert config_from_mapping(config_class, {**node, "name": "x"}) == config_class(name="x")
    hf_only = {"attn_implementation", "logprob_chunk_size", "wrap_layer_classes"}
    assert (hf_only <= set(node)) == (config_class is HFModuleEngineConfig)
    if config_class is EngineConfig:
        with pytest.raises(EngineConfigError, match="attn_implementation"):
            config_from_mapping(EngineConfig, {"name": "x", "attn_implementation": "eager"})


# -------------------------------------------------------------------------------- checkpoints
def test_atomic_dir_replaces_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    with ckpt.atomic_checkpoint_dir(target, None) as folder:
        (folder / "a.txt").write_text("first")
        ckpt.write_meta(folder, {"engine": "fsdp2"}, None)
    with pytest.raises(RuntimeError):
        with ckpt.atomic_checkpoint_dir(target, None) as folder:
            (folder / "a.txt").write_text("second")
            raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "first"
    assert ckpt.resolve_checkpoint_dir(target) == target
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.resolve_checkpoint_dir(tmp_path / "missing")
    (tmp_path / "half").mkdir()
    with pytest.raises(CheckpointError, match="incomplete"):
        ckpt.resolve_checkpoint_dir(tmp_path / "half")


def test_layout_check_names_every_difference(tmp_path: Path) -> None:
    saved = {"engine": "fsdp2", "model_kind": "causal_lm", "world_size": 4, "layout": {"dp_shard": 4}}
    current = {"engine": "fsdp2", "model_kind": "causal_lm", "world_size": 2, "layout": {"dp_shard": 2}}
    with pytest.raises(CheckpointError) as error:
        ckpt.check_compatible(saved, current, tmp_path)
    assert "world_size: checkpoint 4 vs this engine 2" in str(error.value) and "layout" in str(error.value)
    ckpt.check_compatible(saved, dict(saved), tmp_path)
    with pytest.raises(CheckpointError) as error:  # an engine that reshards: the layout is still checked
        ckpt.check_compatible(saved, current, tmp_path, reshard=True)
    assert "layout" in str(error.value) and "world_size" not in str(error.value)
    ckpt.check_compatible(saved, {**saved, "world_size": 2}, tmp_path, reshard=True)


# --------------------------------------------------------------------------------- HF folders
def test_sharded_hf_folder_loads_in_transformers(model_path: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_path)
    state = model.state_dict()
    out = write_hf_folder(tmp_path / "hf", state.items(), model_path, shard_bytes=50_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and set(index["weight_map"]) == set(state)
    assert (out / "tokenizer.json").is_file() and not list(out.glob(".*"))
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_a_model_config_replaces_the_source_config(model_path: Path, tmp_path: Path) -> None:
    config = AutoConfig.from_pretrained(model_path, num_labels=1)
    config.architectures = ["Qwen2ForTokenClassification"]
    out = write_hf_folder(tmp_path / "v", [("score.weight", torch.zeros(1, 4))], model_path, config)
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["Qwen2ForTokenClassification"] and len(written["id2label"]) == 1
    assert set(load_file(out / "model.safetensors")) == {"score.weight"}
    assert (out / "tokenizer.json").is_file()
