"""Models: the embedded presets (Qwen2, Qwen3, Llama), the value-head model, loaders for local HF folders."""
