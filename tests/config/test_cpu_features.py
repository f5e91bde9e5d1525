"""Detecting native bf16/fp16 from /proc/cpuinfo text, and this machine's verdict against its measured speed."""

from __future__ import annotations

import pytest
import torch
from cpuinfo_samples import AMX_SAPPHIRE_RAPIDS, ARM_NEOVERSE_V1, AVX2_EPYC, AVX512_BF16_COOPER_LAKE, AVX512_CASCADE_LAKE

from rlflow.utils.cpu_features import measure_slowdown, parse_cpuinfo, read_cpu_features


@pytest.mark.parametrize(("text", "model", "bf16", "fp16", "avx512", "amx"), [
    (AVX2_EPYC, "AMD EPYC", False, False, False, False),
    (AVX512_CASCADE_LAKE, "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", False, False, True, False),
    (AVX512_BF16_COOPER_LAKE, "Intel(R) Xeon(R) Platinum 8380H CPU @ 2.90GHz", True, False, True, False),
    (AMX_SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8480+", True, True, True, True),
], ids=["avx2_epyc", "avx512_cascade_lake", "avx512_bf16_cooper_lake", "amx_sapphire_rapids"])
def test_x86_samples(text, model, bf16, fp16, avx512, amx):
    cpu = parse_cpuinfo(text)
    assert cpu.model == model
    assert (cpu.has_native(torch.bfloat16), cpu.has_native(torch.float16), cpu.has_avx512, cpu.has_amx) == (bf16, fp16, avx512, amx)
    assert cpu.has_native(torch.float32)
    yes_no = {True: "yes", False: "no"}
    assert cpu.describe() == (f"{model}; native bf16 {yes_no[bf16]}, fp16 {yes_no[fp16]}, "
                              f"avx512 {yes_no[avx512]}, amx {yes_no[amx]}")


def test_arm_features_line_and_no_cpuinfo_at_all():
    arm = parse_cpuinfo(ARM_NEOVERSE_V1)
    assert arm.has_native(torch.bfloat16) and arm.has_native(torch.float16) and not arm.has_avx512
    unknown = parse_cpuinfo("")
    assert unknown.flags == frozenset() and unknown.model
    assert not unknown.has_native(torch.bfloat16) and unknown.has_native(torch.float32)


def test_this_machines_verdict_matches_its_measured_bf16_speed():
    """Flags say no native bf16 -> bf16 matmuls measure > 2x slower than fp32 here; flags say yes -> < 2x."""
    slowdown = measure_slowdown(torch.bfloat16)
    assert (slowdown > 2.0) != read_cpu_features().has_native(torch.bfloat16), (read_cpu_features().describe(), slowdown)
