"""The analysis layer never imports torch: proven in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_PROBE = """
import sys, io, pkgutil, importlib
import esper_analysis
for mod in pkgutil.iter_modules(esper_analysis.__path__):
    importlib.import_module(f"esper_analysis.{mod.name}")
from esper_analysis.cli import main
run, out = sys.argv[1], sys.argv[2]
for argv in (["counts", run], ["rewards", run], ["rollbacks", run], ["lifecycles", run],
             ["actions", run], ["ppo", run], ["throughput", run],
             ["baseline", "capture", run, "-o", out + ".json"],
             ["baseline", "check", run, "--baseline", out + ".json"],
             ["report", run, "-o", out + ".html"]):
    assert main(argv, stdout=io.StringIO()) == 0, argv
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("TORCH:" + ",".join(loaded))
"""


def test_every_analysis_command_runs_without_importing_torch(
    scripted_run: Path, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(scripted_run), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "TORCH:", proc.stdout[-500:]
    assert (tmp_path / "out.html").stat().st_size > 0
