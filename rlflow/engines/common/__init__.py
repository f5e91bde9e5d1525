"""What the engines share, in rooms by concern (docs/engines.md, "Shared machinery").

* ``delegating_engine`` / ``module_engine``: the two bases an engine picks besides ``BaseEngine``;
* ``distributed``: the process group and small all-reduces;
* ``forward/``: the forward module, the micro-batch loop and the loss scaling, log-probs, LoRA adapters;
* ``batching/``: micro-batch planning, token streams (packing), prefix sharing, the ``sdpa_varlen`` kernel;
* ``checkpoint/``: DCP checkpoints, the offline reader, HF and peft exports;
* ``optim/``: AdamW, LR schedules, the optimizer step, host offload;
* ``fsdp/``: what the FSDP2 engines (fsdp2, torchtitan) share, and fsdp2's compiled layers.

The room packages import nothing themselves: import the module (``rlflow.engines.common.optim.offload``).
"""
