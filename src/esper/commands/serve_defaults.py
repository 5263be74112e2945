"""``esper serve``'s defaults, apart from the server: every command's parser shows them,
and building the parser must not import the analysis layer (polars), which a training
machine need not have."""

from __future__ import annotations

from typing import Final

#: Only this machine can connect.
HOST: Final = "127.0.0.1"
#: The default port (``--port 0``: any free port).
DEFAULT_PORT: Final = 8049
#: Seconds between reloads of a page while a run is running.
DEFAULT_REFRESH_S: Final = 5
