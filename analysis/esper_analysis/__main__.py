"""``python -m esper_analysis ...``: the analysis CLI without the ``esper`` entry point."""

from __future__ import annotations

import sys

from esper_analysis.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m esper_analysis"))
