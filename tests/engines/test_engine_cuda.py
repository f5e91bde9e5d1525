"""Every registered engine on a GPU, against plain PyTorch and the HF model on the same GPU.

Marked ``gpu``: ``make test`` and ``make test-full`` deselect it (CI and the dev machines have no
GPU); ``make test-gpu`` runs it where CUDA is. One NCCL rank runs ``cuda_scenarios.cuda_suite``;
tolerances are those of the CPU suite (fp32 with TF32 off, torch's default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from cuda_scenarios import cuda_suite, probe_batch
from engine_testlib import ENGINES, REFERENCE_LRS, engines_with, load_results, spawn
from rlflow.engines.base import Capability
from rlflow.engines.common.batching.packing import make_token_stream

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOKEN_TOL = 1e-4  # absolute, per token log-prob and per step loss (as tests/engines/test_engine_distributed.py)
GPU_ENGINES = tuple(os.environ.get("RLFLOW_GPU_ENGINES", " ".join(ENGINES)).split())


@pytest.fixture(scope="module")
def cuda_results(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    out = tmp_path_factory.mktemp("engine_cuda")
    spawn(cuda_suite, 1, model_path, out, GPU_ENGINES, backend="nccl")
    return load_results(out, "cuda.pt")


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_log_probs_on_the_gpu_match_transformers(engine: str, cuda_results: dict[Any, Any]) -> None:
    ref_log_probs, ref_entropy = cuda_results["reference_stats"]
    run = cuda_results[engine]
    torch.testing.assert_close(run["log_probs"], ref_log_probs, rtol=0, atol=TOKEN_TOL)
    torch.testing.assert_close(run["entropy"], ref_entropy, rtol=0, atol=TOKEN_TOL)
    assert run["state_devices"] == {"cuda"}  # it really ran there


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_three_steps_on_the_gpu_match_plain_pytorch(engine: str, cuda_results: dict[Any, Any]) -> None:
    reference, run = cuda_results["reference"], cuda_results[engine]
    assert run["lrs"] == pytest.approx(REFERENCE_LRS, rel=1e-12)
    assert run["losses"] == pytest.approx(reference["losses"], abs=TOKEN_TOL)
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
    diff = sum(((run["params"][n] - p) ** 2).sum() for n, p in reference["params"].items()).sqrt()
    norm = sum((p**2).sum() for p in reference["params"].values()).sqrt()
    assert (diff / norm).item() <= 1e-4
    assert reference["losses"][2] < reference["losses"][0]


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_offload_frees_the_gpu_and_trains_the_same(engine: str, cuda_results: dict[Any, Any]) -> None:
    run, plain = cuda_results[(engine, "offload")], cuda_results[engine]
    assert run["offloaded_optimizer_devices"] == {"cpu"}  # AdamW's moments in host memory between steps
    # what stays on the GPU while offloaded is far below the parameters alone (weights + grads + 2 moments
    # would be 4x): a gradient buffer left behind is 1x and fails this; onload brings the weights back
    assert run["held_while_offloaded"] < run["param_bytes"] / 2, run
    assert run["held_after_onload"] >= run["param_bytes"] and run["onloaded_param_devices"] == {"cuda"}, run
    assert run["losses"] == pytest.approx(plain["losses"], abs=TOKEN_TOL)


@pytest.mark.parametrize("engine", engines_with(Capability.MIXED_PRECISION, among=GPU_ENGINES))
def test_bf16_compute_on_the_gpu_keeps_fp32_master_weights(engine: str, cuda_results: dict[Any, Any]) -> None:
    run, fp32_loss = cuda_results[(engine, "bf16")], cuda_results["reference"]["losses"][0]
    assert run["master_dtypes"] == {torch.float32}
    assert run["loss"] == pytest.approx(fp32_loss, abs=5e-2) and run["loss"] != fp32_loss
    assert not run["step"]["skipped"] and run["step"]["grad_norm"] > 0


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_a_micro_batch_reaches_the_gpu_without_waiting_for_it(remove_padding: bool) -> None:
    """The layout is computed on the host and copied without a stream synchronisation, so the host can queue
    the next micro-batch while the GPU runs this one (forward_backward.py). A blocking copy or a ``nonzero``
    on the device raises under torch's sync debug mode."""
    micro = probe_batch()
    busy = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            busy = busy @ busy / 64  # queued device work the host must not wait for
        stream = make_token_stream(micro.batch["input_ids"], micro.batch["attention_mask"],
                                   micro.batch["position_ids"], remove_padding=remove_padding).to(torch.device("cuda"))
        on_device = micro.copy().to("cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host = make_token_stream(micro.batch["input_ids"], micro.batch["attention_mask"], micro.batch["position_ids"],
                             remove_padding=remove_padding)
    assert torch.equal(stream.input_ids.cpu(), host.input_ids) and torch.equal(stream.source_index.cpu(), host.source_index)
    assert all(torch.equal(on_device.batch[key].cpu(), micro.batch[key]) for key in micro.batch)
