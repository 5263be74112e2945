"""Shared plumbing of the benchmark scripts: tables, JSON results, machine info, medians.

Every script prints a table for people and writes ``benchmarks/results/<name>.json`` for
machines. The machine block records what the figures depend on (CPU model, cores,
library versions, threads, load average) because this machine is shared and noisy: the
load average says whether absolute numbers can be trusted; ratios measured side by side
in one script run are what to compare. This module never imports torch, so the analysis
benchmark's peak RSS is not inflated by it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
CACHE_DIR = BENCH_DIR / ".cache"
#: A 1-minute load average above this many runnable tasks (on this 2-core machine) means
#: other work competed with the benchmark: absolute figures are then only indicative.
LOADED_MACHINE = 2.0
#: Libraries whose version changes the figures.
VERSIONED = ("torch", "msgspec", "polars", "pyarrow", "numpy", "esper")
PERCENTILE_99 = 0.99

T = TypeVar("T")


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (falls back to platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def machine_info(*, threads: int | None = None) -> dict[str, Any]:
    """What the figures were measured on (versions read without importing the libraries)."""
    load = load_average()
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {name: _version(name) for name in VERSIONED},
        "torch_threads": threads,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_average": load,
        "loaded": bool(load) and load[0] > LOADED_MACHINE,
        "gpu": gpu_info(),
    }


#: ``nvidia-smi`` gets this long to answer (it can hang on a broken driver).
NVIDIA_SMI_TIMEOUT_S = 10


def gpu_info() -> list[dict[str, str]] | None:
    """The machine's NVIDIA GPUs (name, memory, driver) from ``nvidia-smi``, or None.

    Asked of the driver rather than torch, so benchmarks that never import torch (the
    analysis ones) record the GPU too; None where there is no NVIDIA driver.
    """
    query = "name,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.strip().splitlines():
        name, memory, driver = (part.strip() for part in line.split(","))
        gpus.append({"name": name, "memory": memory, "driver": driver})
    return gpus or None


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of a non-empty sequence."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def alternate(items: Sequence[T], repeat: int) -> list[T]:
    """Order of the measurements in repeat ``repeat``: rotated, so that no variant is
    always measured first (or last) while the machine warms up or load changes."""
    k = repeat % len(items) if items else 0
    return [*items[k:], *items[:k]]


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 10 ** (-digits)):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def format_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table (no terminal features, so it reads the same in logs)."""
    cells = [[fmt(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    line = "  ".join("-" * w for w in widths)
    head = "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))
    body = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join([title, line, head, line, *body, line])


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(format_table(title, columns, rows), flush=True)


def print_machine(info: dict[str, Any]) -> None:
    load = ", ".join(str(v) for v in info["load_average"])
    note = "  (LOADED machine: absolute figures are indicative only)" if info["loaded"] else ""
    gpus = info.get("gpu") or []
    gpu = f", GPU {gpus[0]['name']}" + (f" x{len(gpus)}" if len(gpus) > 1 else "") if gpus else ""
    print(
        f"machine: {info['cpu_model']}, {info['cores']} cores{gpu}, torch "
        f"{info['versions']['torch']}, threads {info['torch_threads']}, load {load}{note}",
        flush=True,
    )


def _jsonable(value: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_results(
    out_dir: Path, name: str, payload: dict[str, Any], *, compact: bool = False
) -> Path:
    """Write ``<out_dir>/<name>.json`` atomically (tmp file + rename); ``compact``: one
    line, not announced (parts saved after every run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.json"
    tmp = out_dir / f".{name}.json.tmp"
    layout: dict[str, Any] = {"separators": (",", ":")} if compact else {"indent": 2}
    tmp.write_text(json.dumps(_jsonable(payload), **layout) + "\n")
    os.replace(tmp, target)
    if not compact:
        print(f"wrote {target}", flush=True)
    return target


def base_parser(description: str) -> argparse.ArgumentParser:
    """Flags every script shares: --quick, --repeats, --out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, for the smoke tests (seconds)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats (median is reported)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="directory for the JSON results"
    )
    return parser


def csv_list(convert: Callable[[str], T]) -> Callable[[str], list[T]]:
    """argparse type for comma-separated lists (``--n-envs 1,4,8``)."""

    def parse(text: str) -> list[T]:
        return [convert(part.strip()) for part in text.split(",") if part.strip()]

    return parse
