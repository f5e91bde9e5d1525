"""Forward and loss: the forward module of each model kind (HF loading, LoRA adapters, the chunked log-prob
head), one micro-batch through it, the micro-batch loop of ``forward_backward`` and its loss scaling."""
