"""Cross-engine SFT parity: the same job on every engine of the registry at world size 1 and 2.

One SFT job (tiny preset, 2-digit addition, seed 0, 16 samples per step in micro-batches of
4, fp32, sequence packing, 5 steps) runs through the real entry code (``run_sft`` with
``trainer.launcher=torchrun``) on each engine, world size 1 in the test process and world size 2
in one pair of spawned processes. The engines (``ENGINE_SOURCES``) are the built-in ones
(``engine_lists.BUILTIN_ENGINES``, YAML or not) and those the plugin files in ``PLUGIN_FILES``
register, which a run loads through ``trainer.plugins=[file]`` as a user's does (``user_ddp``: a
DDP engine with no YAML). Every loss curve must match the first engine's at world size 1 within
1e-4 relative per step, and so must the torchtitan engine's at tensor parallel size 2 and the
megatron engine's at tensor and at pipeline parallel size 2 (``LAYOUTS``; docs/sft.md explains the
tolerance), and that reference curve must match a plain single-process PyTorch loop (HF model,
padded batches, AdamW) written independently of the engines. The same job with LoRA
(``LORA_RUNS``: rank 4 on every attention and MLP linear layer) runs on every engine with
``Capability.LORA`` at both world sizes and must match the plain loop with ``peft`` adapters drawn
from the same seed, within the same tolerance. The ``curves`` fixture runs only the runs of the
selected tests (and the reference), so ``-k`` or ``-m "not full"`` also saves their cost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from engine_lists import BUILTIN_ENGINES, plugin_engines
from peft import LoraConfig, get_peft_model
from sft_testlib import SFTAssets, run_ranks, sft_assets, sft_config, step_losses
from transformers import AutoModelForCausalLM

from rlflow.data.sft_dataset import build_sft_loader
from rlflow.engines.base import Capability
from rlflow.engines.registry import ENGINE_REGISTRY
from rlflow.models.loading import load_tokenizer
from rlflow.config.loading.hydra_entry import CONFIG_DIR
from rlflow.trainer.main_sft import run_sft
from rlflow.utils.plugins import file_module_name

PLUGIN_FILES = (Path(__file__).resolve().parents[1] / "plugins" / "own_config_engine.py",)
PLUGIN_ENGINES = {name: (plugin, engine_class)  # name -> (its plugin file, its class)
                  for plugin in PLUGIN_FILES for name, engine_class in plugin_engines(plugin).items()}
ENGINE_CLASSES = {**{name: ENGINE_REGISTRY.get(name) for name in BUILTIN_ENGINES},
                  **{name: engine_class for name, (_, engine_class) in PLUGIN_ENGINES.items()}}
ENGINES = list(ENGINE_CLASSES)
REFERENCE = ENGINES[0]
WORLD_SIZES = (1, 2)
STEPS = 5
RTOL = 1e-4
LR, BETAS, EPS, GRAD_CLIP = 1e-3, (0.9, 0.999), 1e-8, 1.0


def engine_overrides(engine: str) -> list[str]:
    """``engine=<name>``, and for a plugin's engine its file in ``trainer.plugins`` (no YAML: its config class's
    defaults)."""
    plugin = [f"trainer.plugins=[{PLUGIN_ENGINES[engine][0]}]"] if engine in PLUGIN_ENGINES else []
    return [f"engine={engine}", *plugin]


def job_overrides(assets: SFTAssets, engine: str, run_dir: Path) -> list[str]:
    return [
        *engine_overrides(engine),
        f"model.path={assets.model}",
        f"data.train_files=[{assets.data['sft_train']}]",
        "data.val_files=[]",
        "data.train_batch_size=16",
        "engine.micro_batch_size=4",
        "engine.use_remove_padding=true",
        "engine.dtype=float32",
        "engine.param_dtype=float32",
        f"engine.optimizer.lr={LR}",
        f"engine.optimizer.betas=[{BETAS[0]},{BETAS[1]}]",
        f"engine.optimizer.eps={EPS}",
        f"engine.optimizer.grad_clip={GRAD_CLIP}",
        "engine.optimizer.weight_decay=0.0",
        "engine.lr_scheduler.name=constant",
        "engine.lr_scheduler.warmup_steps=0",
        "engine.seed=0",
        f"trainer.total_training_steps={STEPS}",
        "trainer.launcher=torchrun",
        "trainer.device=cpu",
        "trainer.logger=[]",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}",
    ]


# label -> (engine, extra overrides): layouts beyond data parallelism, run at world size 2
LAYOUTS = {
    "torchtitan/tp2": ("torchtitan", ["engine.tensor_parallel_size=2"]),
    "megatron/tp2": ("megatron", ["engine.tensor_model_parallel_size=2"]),
    "megatron/pp2": ("megatron", ["engine.pipeline_model_parallel_size=2"]),  # 3 layers: stages of 2 and 1
}
RUNS = {**{engine: (engine, []) for engine in ENGINES}, **{k: v for k, v in LAYOUTS.items() if v[0] in ENGINES}}
# LoRA (rank 4 on every attention and MLP linear layer) on each engine that has it, at both world sizes;
# these curves are checked against a plain peft loop instead
LORA_RANK, LORA_ALPHA = 4, 8.0
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_RUNS = {
    f"{engine}/lora": (engine, [f"engine.lora.rank={LORA_RANK}", f"engine.lora.alpha={LORA_ALPHA}"])
    for engine in ENGINES if Capability.LORA in ENGINE_CLASSES[engine].capabilities
}
# runs only `make test-full` pays for: LoRA on a plugin engine (fsdp and fsdp2 cover LoRA on ModuleEngine)
FULL_ONLY = {f"{engine}/lora" for engine in PLUGIN_ENGINES}


def runs_at(world_size: int) -> list[str]:
    return [label for label in RUNS if label in ENGINES or world_size == 2]


def run_params(runs_of: Callable[[int], list[str]]) -> list:
    """``(world_size, run)`` parameters over both world sizes, marked ``full`` where ``FULL_ONLY`` says."""
    return [pytest.param(ws, label, marks=[pytest.mark.full] if label in FULL_ONLY else [])
            for ws in WORLD_SIZES for label in runs_of(ws)]


CURVE_PARAMS = run_params(runs_at)
LORA_PARAMS = run_params(lambda world_size: list(LORA_RUNS))


def run_every_engine(rank: int, assets: SFTAssets, out_dir: Path, world_size: int, labels: list[str]) -> None:
    """On each rank: the job of each run in ``labels`` in turn (the process group is reused)."""
    curves = {}
    for label in labels:
        engine, extra = {**RUNS, **LORA_RUNS}[label]
        run_dir = out_dir / f"{label.replace('/', '_')}_ws{world_size}"
        history = run_sft(sft_config(job_overrides(assets, engine, run_dir) + extra))
        curves[label] = step_losses(history)
    if rank == 0:
        (out_dir / f"curves_ws{world_size}.json").write_text(json.dumps(curves))


def selected_runs(session: pytest.Session) -> dict[int, list[str]]:
    """``{world size: run labels}`` that this module's selected tests compare, in run order, plus the reference."""
    wanted = {(1, REFERENCE)} | {(item.callspec.params["world_size"], item.callspec.params["run"])
                                 for item in session.items if item.path == Path(__file__) and hasattr(item, "callspec")}
    return {ws: [label for label in [*runs_at(ws), *LORA_RUNS] if (ws, label) in wanted] for ws in WORLD_SIZES}


@pytest.fixture(scope="module")
def curves(request, tmp_path_factory) -> dict[int, dict[str, dict[int, float]]]:
    """The loss curves of the selected runs: ``{world size: {label: {step: loss}}}``."""
    assets = sft_assets()
    out_dir = tmp_path_factory.mktemp("sft_parity")
    result = {}
    for world_size, labels in selected_runs(request.session).items():
        if not labels:
            continue
        run_ranks(run_every_engine, world_size, assets, out_dir, world_size, labels)
        loaded = json.loads((out_dir / f"curves_ws{world_size}.json").read_text())
        result[world_size] = {label: {int(k): v for k, v in curve.items()} for label, curve in loaded.items()}
    return result


def plain_pytorch_losses(assets: SFTAssets, lora: bool = False) -> list[float]:
    """The same job as a plain loop: padded HF forward, token-mean NLL on loss_mask tokens, clip, AdamW
    (``lora``: peft adapters drawn from the engine's seed, and only they train)."""
    torch.manual_seed(0)
    config = sft_config(job_overrides(assets, REFERENCE, Path("unused")))
    loader = build_sft_loader(config.data, load_tokenizer(assets.model), "train")
    model = AutoModelForCausalLM.from_pretrained(assets.model, dtype=torch.float32, attn_implementation="eager")
    if lora:
        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    losses = []
    for _, batch in zip(range(STEPS), loader):
        input_ids, attention_mask, loss_mask = (batch.batch[k] for k in ("input_ids", "attention_mask", "loss_mask"))
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        token_log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        mask = loss_mask[:, 1:].float()
        loss = -(token_log_probs * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def assert_curves_close(curve: dict[int, float], reference: dict[int, float], label: str) -> None:
    assert sorted(curve) == list(range(1, STEPS + 1)), f"{label}: steps {sorted(curve)}"
    rel = {step: abs(curve[step] - ref) / abs(ref) for step, ref in reference.items()}
    print(f"{label}: max relative loss difference {max(rel.values()):.2e} over {STEPS} steps")
    for step, ref in reference.items():
        assert rel[step] <= RTOL, f"{label}: step {step} loss {curve[step]:.7f} vs {ref:.7f} (rel {rel[step]:.2e} > {RTOL})"


def test_the_suite_covers_fsdp_and_fsdp2():
    assert {"fsdp", "fsdp2"} <= set(ENGINES)


def test_a_plugin_engine_without_a_yaml_is_in_the_parameter_list():
    """``user_ddp`` lives in a file outside the package and has no YAML; the suite trains with it at both world
    sizes, naming its file in ``trainer.plugins`` as a user does."""
    assert "user_ddp" in PLUGIN_ENGINES and not (Path(CONFIG_DIR) / "engine" / "user_ddp.yaml").exists()
    assert {(1, "user_ddp"), (2, "user_ddp")} <= {tuple(param.values) for param in CURVE_PARAMS}
    assert engine_overrides("user_ddp") == ["engine=user_ddp", f"trainer.plugins=[{PLUGIN_FILES[0]}]"]


PLUGIN_SOURCE = """
from rlflow.engines.fsdp2 import FSDP2Engine
from rlflow.engines.registry import ENGINE_REGISTRY


@ENGINE_REGISTRY.register("parity_probe")
class ParityProbeEngine(FSDP2Engine):
    pass
"""


def test_an_engine_in_a_plugin_file_is_found_and_the_process_left_as_it_was(tmp_path):
    plugin = tmp_path / "parity_plugin.py"
    plugin.write_text(PLUGIN_SOURCE)
    found = plugin_engines(plugin)
    assert list(found) == ["parity_probe"] and Capability.LORA in found["parity_probe"].capabilities  # FSDP2's
    assert "parity_probe" not in ENGINE_REGISTRY.names() and file_module_name(plugin) not in sys.modules


def test_reference_engine_matches_a_plain_pytorch_loop(curves):
    reference = curves[1][REFERENCE]
    plain = dict(enumerate(plain_pytorch_losses(sft_assets()), start=1))
    assert_curves_close(reference, plain, f"{REFERENCE} ws=1 vs plain PyTorch")
    assert plain[STEPS] < plain[1], "the job must actually train"


@pytest.mark.parametrize("world_size,run", CURVE_PARAMS)
def test_engine_loss_curve_matches_the_reference(curves, run, world_size):
    assert_curves_close(curves[world_size][run], curves[1][REFERENCE], f"{run} ws={world_size}")


@pytest.fixture(scope="module")
def plain_peft_curve() -> dict[int, float]:
    return dict(enumerate(plain_pytorch_losses(sft_assets(), lora=True), start=1))


def test_the_suite_covers_lora_on_fsdp_and_fsdp2():
    assert {"fsdp/lora", "fsdp2/lora"} <= set(LORA_RUNS)


@pytest.mark.parametrize("world_size,run", LORA_PARAMS)
def test_lora_loss_curve_matches_a_plain_peft_loop(curves, plain_peft_curve, run, world_size):
    assert_curves_close(curves[world_size][run], plain_peft_curve, f"{run} ws={world_size} vs plain peft")
    assert plain_peft_curve[STEPS] < plain_peft_curve[1], "the LoRA job must actually train"
