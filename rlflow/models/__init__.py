"""Models: the embedded tiny preset, the value-head model, and loaders for local HF checkpoint folders."""
