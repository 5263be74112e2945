"""Import boundaries: the CLI's help, the event catalogue, the config and the demo's
lifecycle code need no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def _torch_modules(body: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "body",
    [
        "import esper.telemetry.events",
        "import esper.config",
        "import esper.telemetry.hub, esper.telemetry.schemas, esper.telemetry.demo",
        # the lifecycle code the demo drives (esper.model's init loads its names lazily)
        "import esper.model.slot_state, esper.model.ticks, esper.policy.mask_rules",
        "from esper.cli import main\ncode = main(['--help'])\nassert code == 0, code",
        "from esper.cli import main\nassert main(['train', '--help']) == 0",
        "from esper.cli import main\nassert main(['analyze', '--help']) == 0",
    ],
)
def test_imports_without_torch(body: str) -> None:
    assert _torch_modules(body) == []


def test_console_script_and_module_are_the_same_program() -> None:
    script = Path(sys.executable).with_name("esper")
    assert script.exists(), "install with `pip install -e .` to get the console script"
    outputs = []
    for cmd in ([str(script), "--help"], [sys.executable, "-m", "esper", "--help"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert "telemetry-demo" in outputs[0] and "schemas" in outputs[0]


def test_help_does_not_import_torch_measured_with_importtime() -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "esper", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()]
    assert "torch" not in imported


#: Blocks polars for the probe: a training machine (a lent GPU, say) need not have it.
NO_POLARS = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "polars" or name.startswith("polars."):
            raise ImportError("polars is not installed here")
sys.meta_path.insert(0, _Block())
"""


def test_training_runs_without_the_analysis_layer(tmp_path: Path) -> None:
    """``esper train`` (parser, training, telemetry) never imports polars: only the
    analyses need it (the device check of issue 51 ran on a machine without it)."""
    body = (
        "from esper.cli import main\n"
        "code = main(['train', '--task', 'digits', '--envs', '2', '--rounds', '1',\n"
        "             '--episode-length', '2', '--no-progress', '--telemetry-dir',\n"
        f"             {str(tmp_path)!r}, '--run-id', 'r'])\n"
        "assert code == 0, code\n"
        "assert 'polars' not in sys.modules"
    )
    proc = subprocess.run(
        [sys.executable, "-c", NO_POLARS + body],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
