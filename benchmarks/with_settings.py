"""Run another benchmark script with process-wide settings the trainer does not expose.

For experiments on a lent GPU: ``--cudnn-benchmark`` turns on cuDNN's autotuner
(``torch.backends.cudnn.benchmark``), ``--no-channels-last`` sets
``task.channels_last = false`` in every preset of ``_trainer.PRESETS``. The script after
``--`` then runs as if called directly (``runpy``, same process).

    python benchmarks/with_settings.py --cudnn-benchmark -- benchmarks/eps.py --device cuda
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _trainer as T
import torch


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--no-channels-last", action="store_true")
    opts = p.parse_args(args[:split])
    rest = args[split + 1 :]
    if not rest:
        p.error("name the script to run after --")
    torch.backends.cudnn.benchmark = opts.cudnn_benchmark
    if opts.no_channels_last:
        for preset in T.PRESETS.values():
            preset["task.channels_last"] = False
    sys.argv = rest
    runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
