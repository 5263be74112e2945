"""``esper serve DIR`` (issue 49): the catalogue and each run's report on 127.0.0.1,
reloading while a run is live, nothing outside DIR reachable; read in headless Chromium
like the report."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _analysis_support import run_started
from conftest import Crashed
from esper_analysis.serve import HOST, make_server
from test_analysis_report import _chromium

from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry.hub import Hub, open_run


@pytest.fixture(scope="module")
def served_dir(
    scripted_run: Path, crashed: Crashed, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(scripted_run, root / "scripted")
    shutil.copytree(crashed.path, root / "crashed")
    (root / "off-s0").mkdir()
    (root / "off-s0" / "checkpoint.pt").write_bytes(b"x")
    secret = root.parent / "secret-run"  # a run outside DIR, and a symlink to it inside
    shutil.copytree(scripted_run, secret, dirs_exist_ok=True)
    (root / "linked").symlink_to(secret, target_is_directory=True)
    return root


@pytest.fixture
def server(served_dir: Path) -> Iterator[str]:
    srv = make_server(served_dir, port=0, refresh_s=2)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = srv.server_address[:2]
        assert host == HOST == "127.0.0.1"  # localhost only
        yield f"{host}:{port}"
    finally:
        srv.shutdown()
        srv.server_close()


def _get(address: str, path: str) -> tuple[int, str]:
    """GET ``path`` exactly as given (no client-side normalisation of ``..``)."""
    conn = http.client.HTTPConnection(address, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        conn.close()


def test_catalogue_and_reports(server: str) -> None:
    status, page = _get(server, "/")
    assert status == 200
    assert "<a href='/run/scripted/'>scripted</a>" in page
    assert "crashed" in page and "no events, only checkpoint.pt" in page
    assert "http-equiv" not in page  # nothing is running: no reloads
    assert "linked" not in page  # a symlink to a run outside DIR is not listed
    status, report = _get(server, "/run/scripted/")
    assert status == 200 and "<h1>Esper run scripted</h1>" in report
    assert "<h2>What was run</h2>" in report and "http-equiv" not in report


@pytest.mark.parametrize(
    "path",
    [
        "/run/../../etc/passwd",
        "/run/..%2F..%2Fetc%2Fpasswd/",
        "/run/%2Fetc/",
        "/run/linked/",  # a symlink to a run outside DIR
        "/run/off-s0/",  # no events to report
        "/run/nope/",
        "/etc/passwd",
        "/run/scripted/../../../etc/passwd",
    ],
)
def test_nothing_outside_the_directory_is_served(server: str, path: str) -> None:
    status, page = _get(server, path)
    assert status == 404, path
    assert "root:" not in page and "secret" not in page


def test_a_live_run_reloads_until_it_closes(server: str, served_dir: Path) -> None:
    hub: Hub = open_run(served_dir, "live", level=TelemetryLevel.NORMAL, flush_interval_s=0.05)
    try:
        hub.emit(run_started())
        hub.flush()
        _, page = _get(server, "/")
        assert '<meta http-equiv="refresh" content="2">' in page and "running" in page
        status, report = _get(server, "/run/live/")
        assert status == 200 and '<meta http-equiv="refresh" content="2">' in report
        assert "Live: this page reloads every 2 s" in report
    finally:
        hub.close(RunStatus.FINISHED)
    _, report = _get(server, "/run/live/")  # its files changed: built again, finished
    assert "http-equiv" not in report and "status: finished" in report
    shutil.rmtree(served_dir / "live")


@pytest.mark.browser
def test_served_pages_render_in_headless_chromium(server: str, tmp_path: Path) -> None:
    dom = _chromium(tmp_path, "--dump-dom", f"http://{server}/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r'<a href="/run/scripted/">scripted</a>', dom.stdout)
    dom = _chromium(tmp_path, "--dump-dom", f"http://{server}/run/scripted/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-plot="learning-reward"' in dom.stdout and "What was run" in dom.stdout
    shot = tmp_path / "served.png"
    result = _chromium(
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1400,1600",
        f"http://{server}/run/scripted/",
    )
    assert result.returncode == 0 and shot.stat().st_size > 10_000


def test_esper_serve_command_prints_its_address_and_refuses_a_missing_dir(
    served_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "esper", "serve", str(served_dir), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"at http://(127\.0\.0\.1:\d+)/", line)
        assert found, line
        status, page = _get(found.group(1), "/run/scripted/")
        assert status == 200 and "Esper run scripted" in page
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    missing = subprocess.run(
        [sys.executable, "-m", "esper", "serve", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr
