"""The optional C accelerator(s): which are built, and the switch that turns them off.

``setup.py`` builds them where a C compiler is present; without one the install skips
them and pure-Python code computes the same results (tests compare the two). Setting
``ESPER_NATIVE=0`` makes every caller take the pure-Python path (to compare, or to rule
an accelerator out when hunting a bug).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Final

#: Environment variable: "0" turns every accelerator off.
NATIVE_ENV: Final = "ESPER_NATIVE"
#: Every accelerator module, by import name.
MODULES: Final = (
    "esper.telemetry._columns",
    "esper.telemetry._emit",
    "esper_analysis._grouped",
    "esper_analysis._rle",
)


def native_enabled() -> bool:
    """False when ``ESPER_NATIVE=0`` is set."""
    return os.environ.get(NATIVE_ENV, "1") != "0"


def load_native(name: str) -> ModuleType | None:
    """Accelerator module ``name``, or None where it was not built or is turned off."""
    if not native_enabled():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def native_status() -> dict[str, bool]:
    """Whether each accelerator is in use (built and not turned off), without importing it."""
    on = native_enabled()
    return {name: on and importlib.util.find_spec(name) is not None for name in MODULES}
