"""``python -m esper`` is the ``esper`` console script."""

from esper.cli import main

raise SystemExit(main())
