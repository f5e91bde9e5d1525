"""Command line: ``python -m rlflow.data.presets --out DIR [--preset tiny] [--seed 0] [--overwrite]``.

Builds a model preset (``rlflow.models.presets.PRESETS``) with its tokenizer trained on the
synthetic-task corpus (``rlflow.data.tasks.corpus``). It lives in the data layer because the
corpus does: ``rlflow.models`` sits below ``rlflow.data`` and takes the corpus as an argument.
"""

from __future__ import annotations

import argparse
import sys

from rlflow.data.tasks.corpus import tokenizer_corpus
from rlflow.models.presets import PRESETS, build_preset, count_saved_parameters


def main(argv: list[str] | None = None) -> int:
    """Build a preset and print its architecture, layer count, parameter count and path."""
    parser = argparse.ArgumentParser(prog="python -m rlflow.data.presets", description="Build a model preset.")
    parser.add_argument("--out", required=True, help="output folder (a Hugging Face checkpoint folder)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="which preset (docs/quickstart.md)")
    parser.add_argument("--seed", type=int, default=0, help="weight-init seed")
    parser.add_argument("--overwrite", action="store_true", help="rebuild even if the folder exists")
    args = parser.parse_args(argv)
    try:
        path = build_preset(args.out, tokenizer_corpus(), preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    preset = PRESETS[args.preset]
    print(f"preset {args.preset} ({preset.architecture}, {preset.num_hidden_layers} layers) seed={args.seed} "
          f"params={count_saved_parameters(path):,} path={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
