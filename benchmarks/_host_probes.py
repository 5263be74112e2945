"""The instruments of ``host_work.py``: call counting, loop tracing, body and site
clocks.

Kept apart from the script so each file reads in one sitting; ``host_work.py``'s
docstring defines what each instrument counts. They run inside the worker process, on
whichever tree it measures (they only read code objects and frames).
"""

from __future__ import annotations

import contextlib
import dis
import functools
import importlib
import inspect
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from types import CodeType, FrameType
from typing import Any

#: Rounds before the measured ones (their summary arms the instruments).
WARMUP_ROUNDS = 1


def resolve(name: str) -> tuple[Any, str, Any]:
    """(owner, attribute, object) of ``"module:Qual.name"``; LookupError if absent."""
    module_name, _, qualname = name.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"{name}: {exc}") from None
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    if owner is None or attr not in vars(owner):
        raise LookupError(f"{name}: no such function")
    return owner, attr, vars(owner)[attr]


def code_of(name: str | tuple[str, ...]) -> CodeType:
    """The code of a function, or of the first of several names that resolves."""
    names = (name,) if isinstance(name, str) else name
    for candidate in names[:-1]:
        try:
            return code_of(candidate)
        except LookupError:
            continue
    code: CodeType = inspect.unwrap(resolve(names[-1])[2]).__code__
    return code


class RoundGate:
    """train()'s ``progress`` callback: arms an instrument once the warm-up rounds'
    summaries are in (a progress item without a ``step`` is a round's summary)."""

    def __init__(self, arm: Callable[[], None]) -> None:
        self.arm, self.summaries = arm, 0

    def __call__(self, item: Any) -> None:
        if not hasattr(item, "step"):
            self.summaries += 1
            if self.summaries == WARMUP_ROUNDS:
                self.arm()


class RoundProfile:
    """``sys.setprofile`` hook: opens the window on the round function's call, closes
    it on its return; inside, counts calls of esper code (``prefix``), all Python calls
    and those into torch's Python (``torch_prefix``: vmap, functional_call, module
    traversal, the optimizers), and runs ``enter``/``leave`` at the edges."""

    def __init__(
        self, round_code: CodeType, prefix: str | None = None, torch_prefix: str | None = None
    ) -> None:
        self.round_code, self.prefix, self.torch_prefix = round_code, prefix, torch_prefix
        self.enter: Callable[[], object] = lambda: None
        self.leave: Callable[[], object] = lambda: None
        self.frame: FrameType | None = None
        self.rounds = 0
        self.calls: Counter[CodeType] = Counter()
        self.all_calls = 0
        self.torch_calls = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if self.frame is None:
                if code is not self.round_code:
                    return
                self.frame, self.rounds = frame, self.rounds + 1
                self.enter()
            self.all_calls += 1
            if self.prefix is not None and code.co_filename.startswith(self.prefix):
                self.calls[code] += 1
            elif self.torch_prefix is not None and code.co_filename.startswith(self.torch_prefix):
                self.torch_calls += 1
        elif event == "return" and frame is self.frame:
            self.frame = None
            self.leave()


def loop_headers(code: CodeType) -> dict[int, bool]:
    """Header line of each loop compiled into ``code`` -> whether the loop is on that one
    line. A loop is a backward jump; its header, the lowest line between target and jump."""
    line_at = {i.offset: i.positions.lineno for i in dis.get_instructions(code) if i.positions}
    out: dict[int, bool] = {}
    for ins in dis.get_instructions(code):
        target = ins.argval
        if ins.opcode in dis.hasjrel and isinstance(target, int) and target < ins.offset:
            span = {line for off, line in line_at.items() if target <= off <= ins.offset}
            lines = {line for line in span if line is not None}
            header = min(lines)
            out[header] = out.get(header, True) and len(lines) == 1
    return out


@functools.cache
def _start(code: CodeType) -> int:
    """Offset where a fresh call of ``code`` starts (its first RESUME)."""
    return next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)


class _FrameLoops:
    """The local trace function of one frame: entries and iterations at its headers."""

    def __init__(self, owner: LoopTracer, frame: FrameType, headers: dict[int, bool]) -> None:
        self.owner, self.headers, self.code = owner, headers, frame.f_code
        #: A resumed generator goes on from its last line (a fresh call is at RESUME 0).
        resumed = frame.f_lasti > _start(self.code)
        self.last: int | None = frame.f_lineno if resumed else None

    def event(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            line = frame.f_lineno
            one_line = self.headers.get(line)
            if one_line is not None:
                last = self.last
                if last is None or last < line:
                    self.owner.entries[self.code, line] += 1
                elif last > line or one_line:
                    self.owner.iterations[self.code, line] += 1
            self.last = line
        elif event == "return" and frame is self.owner.frame:
            self.owner.frame = None
        return self.event


class LoopTracer:
    """``sys.settrace`` hook: per (code, header line) of esper code, loop entries and
    iterations inside the measured window (line events only in frames with loops)."""

    def __init__(self, round_code: CodeType, prefix: str) -> None:
        self.round_code, self.prefix = round_code, prefix
        self.frame: FrameType | None = None
        self.rounds = 0
        self.entries: Counter[tuple[CodeType, int]] = Counter()
        self.iterations: Counter[tuple[CodeType, int]] = Counter()
        self._headers: dict[CodeType, dict[int, bool]] = {}

    def headers(self, code: CodeType) -> dict[int, bool]:
        if code not in self._headers:
            ours = code.co_filename.startswith(self.prefix)
            self._headers[code] = loop_headers(code) if ours else {}
        return self._headers[code]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if self.frame is None:
            if code is not self.round_code:
                return None
            self.frame, self.rounds = frame, self.rounds + 1
        headers = self.headers(code)
        if not headers and frame is not self.frame:
            return None
        return _FrameLoops(self, frame, headers).event


class BodyClock:
    """Main-thread CPU of the measured rounds and, within them, of the outermost
    capturable body on the stack (per body), less the garbage collections that start
    inside one: a collection runs wherever the allocation count happens to cross its
    threshold (the writer thread's allocations count too), so it is charged outside."""

    def __init__(self) -> None:
        self.armed = self.in_round = False
        self.rounds, self.depth = 0, 0
        self.round_s = self.gc_s = self.gc_in_bodies_s = self._gc_t0 = 0.0
        self.bodies: dict[str, float] = defaultdict(float)
        self.main = threading.main_thread().ident

    def arm(self) -> None:
        self.armed = True

    def collecting(self, phase: str, _info: dict[str, int]) -> None:
        """A ``gc.callbacks`` hook: main-thread collections inside the rounds."""
        if not self.in_round or threading.get_ident() != self.main:
            return
        if phase == "start":
            self._gc_t0 = time.thread_time()
            return
        spent = time.thread_time() - self._gc_t0
        self.gc_s += spent
        self.gc_in_bodies_s += spent if self.depth else 0.0

    def round(self, fn: Callable[..., Any], _name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed_round(*args: Any, **kwargs: Any) -> Any:
            if not self.armed:
                return fn(*args, **kwargs)
            self.in_round, t0 = True, time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.round_s += time.thread_time() - t0
                self.in_round, self.rounds = False, self.rounds + 1

        return timed_round

    def body(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed_body(*args: Any, **kwargs: Any) -> Any:
            if not self.in_round or self.depth or threading.get_ident() != self.main:
                return fn(*args, **kwargs)
            self.depth, t0 = 1, time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.bodies[name] += time.thread_time() - t0
                self.depth = 0

        return timed_body


class SiteClock(BodyClock):
    """Main-thread CPU of the measured rounds and of named functions inside them (the
    sites where the time outside the capturable bodies goes), each site inclusive of
    what it calls, less the garbage collections that ran inside it (they run wherever
    the allocation count crosses its threshold: one landing in a germination made that
    site look twice its cost): sites may nest, so their times do not add up. A separate
    run from the body clocks, so these wrappers do not add to the outside share measured
    there."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[str, float] = defaultdict(float)
        self._open: set[str] = set()  # sites on the stack (a recursive call counts once)

    def site(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed_site(*args: Any, **kwargs: Any) -> Any:
            if not self.in_round or name in self._open or threading.get_ident() != self.main:
                return fn(*args, **kwargs)
            self._open.add(name)
            t0, gc0 = time.thread_time(), self.gc_s
            try:
                return fn(*args, **kwargs)
            finally:
                self.sites[name] += time.thread_time() - t0 - (self.gc_s - gc0)
                self._open.discard(name)

        return timed_site


def _holders(owner: Any, attr: str, fn: Any) -> list[tuple[Any, str]]:
    """Where calls find ``fn``: its class, or every esper module holding it (by any name)."""
    if isinstance(owner, type):
        return [(owner, attr)]
    esper = [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "esper" and m]
    return [(m, key) for m in esper for key, value in vars(m).items() if value is fn]


@contextlib.contextmanager
def wrapped(wrappers: Mapping[str, Callable[[Any, str], Any]]) -> Iterator[list[str]]:
    """Each named function replaced by ``wrapper(function, name)`` wherever calls find
    it, restored on exit. Yields the names that do not resolve."""
    undo: list[tuple[Any, str, Any]] = []
    missing: list[str] = []
    try:
        for name, wrap in wrappers.items():
            try:
                owner, attr, fn = resolve(name)
            except LookupError:
                missing.append(name)
                continue
            new = wrap(fn, name)
            for holder, key in _holders(owner, attr, fn):
                undo.append((holder, key, fn))
                setattr(holder, key, new)
        yield missing
    finally:
        for holder, key, fn in reversed(undo):
            setattr(holder, key, fn)
