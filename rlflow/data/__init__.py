"""Datasets for RL and SFT (verl's parquet/jsonl formats) and synthetic verifiable tasks."""
