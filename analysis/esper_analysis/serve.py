"""``esper serve DIR``: the run catalogue and each run's report in a browser, on localhost.

A standard-library HTTP server bound to 127.0.0.1 only. ``/`` lists the runs under
DIR (the catalogue of ``esper runs``), ``/run/<name>/`` is that run's report, built from
its directory when asked for (and kept until the run's files change). While a run is
running its report, and the catalogue while any run is, reload themselves every few
seconds (a ``<meta http-equiv="refresh">``; the report itself stays script-free).

A name in a URL is never joined to a path: it must be the name of one of the run
directories listed directly under DIR, so nothing outside DIR can be read (``..``,
``%2F``, absolute paths and symlinked directories pointing elsewhere are 404s).
"""

from __future__ import annotations

import html
import re
import threading
import urllib.parse
import warnings
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

from esper.commands.serve_defaults import DEFAULT_PORT, DEFAULT_REFRESH_S, HOST
from esper_analysis.catalogue import RunEntry, catalogue, run_dirs
from esper_analysis.errors import AnalysisError
from esper_analysis.loader import is_run_dir, load_run
from esper_analysis.report import build_report
from esper_analysis.tables import format_value

#: A run's report: ``/run/<directory name>/``.
_RUN_PATH: Final = re.compile(r"/run/(?P<name>[^/]+)/?")
#: The status a live run has in the catalogue.
RUNNING: Final = "running"
_CATALOGUE_COLUMNS: Final = (
    ("status", "status"),
    ("task", "task"),
    ("policy", "policy"),
    ("seed", "seed"),
    ("envs", "envs"),
    ("rounds", "rounds"),
    ("final_mean_reward", "final mean reward"),
    ("final_accuracy", "final acc %"),
    ("lineage", "lineage"),
    ("started", "started (UTC)"),
)
_STYLE: Final = (
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222}"
    "table{border-collapse:collapse;font-size:13px}"
    "th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}"
    ".note{color:#777;font-size:12px}.live{color:#07620e;font-weight:600}"
)


def _refresh(seconds: int) -> str:
    return f'<meta http-equiv="refresh" content="{seconds}">'


def _page(title: str, body: str, *, refresh_s: int | None) -> str:
    meta = _refresh(refresh_s) if refresh_s else ""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>{meta}<style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def _state_key(run_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a run writes: every file's name, size and modification time."""
    return tuple(
        sorted(
            (str(p.relative_to(run_dir)), st.st_size, st.st_mtime_ns)
            for p in run_dir.rglob("*")
            if p.is_file() and not p.name.startswith(".") and (st := p.stat())
        )
    )


class RunServer:
    """The pages of one telemetry directory; ``page(path)`` -> (status, HTML)."""

    def __init__(self, root: Path, *, refresh_s: int = DEFAULT_REFRESH_S) -> None:
        self.root = root
        self.refresh_s = refresh_s
        self._reports: dict[Path, tuple[object, str]] = {}
        self._lock = threading.Lock()

    def runs(self) -> dict[str, Path]:
        """The run directories directly under the root, by name (what URLs may name)."""
        root = self.root.resolve()
        return {
            p.name: p
            for p in run_dirs(self.root)
            if is_run_dir(p) and p.resolve().parent == root  # no symlink to elsewhere
        }

    def page(self, raw_path: str) -> tuple[HTTPStatus, str]:
        """The page at a request's path: ``/``, ``/run/<name>/``, else 404."""
        path = urllib.parse.urlsplit(raw_path).path
        if path in ("", "/"):
            return HTTPStatus.OK, self.catalogue_page()
        found = _RUN_PATH.fullmatch(path)
        if found:
            run_dir = self.runs().get(urllib.parse.unquote(found["name"]))
            if run_dir is not None:  # only a listed run's name: never a path from the URL
                return self.report_page(run_dir)
        body = "<p>Not found. <a href='/'>All runs</a></p>"
        return HTTPStatus.NOT_FOUND, _page("not found", body, refresh_s=None)

    def catalogue_page(self) -> str:
        root = self.root.resolve()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            entries = [  # a symlink to a run elsewhere is not shown either
                e for e in catalogue([self.root]) if Path(e.path).resolve().parent == root
            ]
        live = any(e.status == RUNNING for e in entries)
        head = "".join(f"<th>{html.escape(t)}</th>" for _, t in _CATALOGUE_COLUMNS)
        rows = "".join(_catalogue_row(e) for e in entries)
        note = (
            f"<p class='live'>A run is running: this page reloads every {self.refresh_s} s.</p>"
            if live
            else ""
        )
        body = (
            f"<h1>Runs under {html.escape(str(self.root))}</h1>{note}"
            f"<table><thead><tr><th>run</th>{head}</tr></thead><tbody>{rows}</tbody></table>"
            + ("" if entries else "<p class='note'>no runs yet</p>")
        )
        return _page("Esper runs", body, refresh_s=self.refresh_s if live else None)

    def report_page(self, run_dir: Path) -> tuple[HTTPStatus, str]:
        key = _state_key(run_dir)
        with self._lock:
            cached = self._reports.get(run_dir)
        if cached is not None and cached[0] == key:
            return HTTPStatus.OK, cached[1]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run = load_run(run_dir)
                text = build_report(run)
                live = run.status.value == RUNNING
        except (AnalysisError, OSError) as exc:
            body = f"<p>error: {html.escape(str(exc))}</p><p><a href='/'>The runs</a></p>"
            return HTTPStatus.INTERNAL_SERVER_ERROR, _page("error", body, refresh_s=None)
        back = "<p class='note'><a href='/'>← all runs</a></p>"
        if live:
            banner = f"<p class='note'>Live: this page reloads every {self.refresh_s} s.</p>"
            text = text.replace("<head>", f"<head>{_refresh(self.refresh_s)}", 1)
            back += banner
        text = text.replace("<body>", f"<body>{back}", 1)
        with self._lock:
            self._reports[run_dir] = (key, text)
        return HTTPStatus.OK, text


def _catalogue_row(e: RunEntry) -> str:
    name = Path(e.path).name
    link = f"<a href='/run/{urllib.parse.quote(name)}/'>{html.escape(e.run_id)}</a>"
    if e.status in ("unreadable", "no telemetry"):
        link = html.escape(e.run_id)
    cells = []
    for key, _ in _CATALOGUE_COLUMNS:
        value = getattr(e, key)
        if key == "rounds" and e.rounds_planned is not None:
            value = f"{format_value(e.rounds_total)}/{e.rounds_planned}"
        cells.append(f"<td>{html.escape(format_value(None if value == '' else value))}</td>")
    error = f" <span class='note'>{html.escape(e.error)}</span>" if e.error else ""
    return f"<tr><td>{link}{error}</td>{''.join(cells)}</tr>"


def make_server(
    root: str | Path, *, port: int = DEFAULT_PORT, refresh_s: int = DEFAULT_REFRESH_S
) -> ThreadingHTTPServer:
    """An HTTP server for ``root`` on 127.0.0.1:``port`` (0: a free port); call
    ``serve_forever`` on it (and ``shutdown``/``server_close`` to stop)."""
    pages = RunServer(Path(root), refresh_s=refresh_s)
    handler = _handler(pages.page)
    return ThreadingHTTPServer((HOST, port), handler)


def _handler(page: Callable[[str], tuple[HTTPStatus, str]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "esper-serve"

        def do_GET(self) -> None:
            status, text = page(self.path)
            data = text.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: one line per page load would bury the URL

    return Handler
