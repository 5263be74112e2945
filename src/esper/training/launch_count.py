"""Kernel launches and host syncs, counted on any device under a ``TorchDispatchMode``.

Why: the hosts are a few thousand parameters, so on a GPU the trainer is bound by how
many kernels it launches and how often it waits for the device, not by arithmetic. Both
can be counted on a CPU, which makes GPU efficiency measurable (and testable) without a
GPU: every aten op that reaches the dispatcher is one kernel launch on a GPU, except

- views and aliases (``aten.view``, ``select``, ``detach``, ``lift_fresh``, ...: the
  op's schema says it returns an alias) and metadata-only ops (:data:`NOT_LAUNCHES`:
  ``empty``, ``empty_strided``, ``set_``, ``resize_``, size queries), which launch
  nothing;
- ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)`` and library
  checks such as ``F.one_hot``'s), which is counted as a **host sync**, as are
  ``.tolist()`` / ``.numpy()`` (seen at the Python level: on a CPU they never reach the
  dispatcher) and, on a GPU, copies from the device to the host.

On a CUDA run only ops that touch a CUDA tensor count as launches (CPU-side tensor math
launches nothing there). Every op and sync is attributed to a *phase* (the innermost
function of :data:`PHASES` on the call stack) and, on request, to its call site.

:func:`esper.core.transfer.host_copy` is the one sanctioned device-to-host transfer;
:class:`SyncGuard` (the tests' runtime check) fails on any host read made elsewhere.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from esper.core.transfer import host_array, host_copy

#: Ops that reach the dispatcher but launch no kernel (allocation and metadata only).
NOT_LAUNCHES = frozenset(
    {
        "empty.memory_format",
        "empty_strided.default",
        "empty_like.default",
        "new_empty.default",
        "new_empty_strided.default",
        "set_.source_Storage",
        "set_.source_Storage_storage_offset",
        "set_.source_Tensor",
        "resize_.default",
        "sym_size.int",
        "sym_stride.int",
        "sym_numel.default",
        "sym_storage_offset.default",
        "is_same_size.default",
        "_unsafe_view.default",
        "record_stream.default",
        "_record_function_enter_new.default",
        "_record_function_exit._RecordFunction",
        "_has_compatible_shallow_copy_type.default",
    }
)
SCALAR_READ = "_local_scalar_dense.default"
#: Python-level tensor methods that read device data on the host.
HOST_READ_METHODS = frozenset({"tolist", "numpy"})

#: Phase of an op: the innermost of these functions on its call stack (module, qualname).
PHASES: tuple[tuple[str, str, str], ...] = (
    ("esper.training.passes.batch_ops", "train_epoch", "train"),
    ("esper.training.passes.host_batching", "train_epoch_batched", "train"),
    ("esper.training.passes.batch_ops", "validate_fused", "validation"),
    ("esper.training.passes.host_batching", "validate_batched", "validation"),
    ("esper.training.passes.batch_ops", "gather_step_stats", "validation"),
    ("esper.training.envs.host_envs", "HostEnvs._ablation_plan", "validation"),
    ("esper.training.envs.host_envs", "HostEnvs.observe", "policy"),
    ("esper.training.learning.learner", "Learner.decide", "policy"),
    ("esper.training.envs.host_envs", "HostEnvs.step", "action"),
    ("esper.training.learning.learner", "Learner.record_step", "action"),
    ("esper.training.learning.learner", "Learner.end_round", "ppo"),
)
PHASE_NAMES = ("train", "validation", "policy", "action", "ppo", "other")
#: Frames of these packages name an op's call site (the first one below torch).
SITE_PACKAGES = ("esper.", "_trainer", "__main__")


def _is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False))


def _device_types(args: Any, kwargs: Any, out: Any) -> set[str]:
    return {t.device.type for obj in (args, kwargs, out) for t in _tensors(obj)}


def _touches_cuda(args: Any, kwargs: Any, out: Any) -> bool:
    for obj in (args, kwargs, out):
        for t in _tensors(obj):
            if t.device.type == "cuda":
                return True
    return False


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class _Stack:
    """Phase and call site of the current op, from the Python stack (cached per code)."""

    def __init__(self) -> None:
        by_name = {(m, q): p for m, q, p in PHASES}
        self._phase_of: dict[CodeType, str | None] = {}
        self._by_name = by_name
        self._host_copy = host_copy.__code__
        self._host_array = host_array.__code__  # host-resident tensors: no read at all
        #: The main thread's phase: on CUDA the backward pass runs on autograd's device
        #: thread, whose stack holds no Python frame of ours; its ops belong to the
        #: phase that called ``backward``.
        self._main = threading.main_thread()
        self._last_phase = "other"

    def _phase(self, frame: FrameType) -> str | None:
        code = frame.f_code
        if code not in self._phase_of:
            module = frame.f_globals.get("__name__", "")
            self._phase_of[code] = self._by_name.get((module, code.co_qualname))
        return self._phase_of[code]

    def describe(self, want_site: bool, want_copy: bool = False) -> tuple[str, str, str]:
        """(phase, call site or "", the reader on the stack: "copy" for :func:`host_copy`,
        "host" for :func:`host_array`, else "")."""
        frame: FrameType | None = sys._getframe(2)
        phase, site, reader = "", "", ""
        while frame is not None:
            if frame.f_code is self._host_copy:
                reader = "copy"
            elif frame.f_code is self._host_array:
                reader = "host"
            if not phase:
                phase = self._phase(frame) or ""
            if want_site and not site:
                module = frame.f_globals.get("__name__", "")
                if module.startswith(SITE_PACKAGES) and module != __name__:
                    site = f"{module.removeprefix('esper.')}.{frame.f_code.co_qualname}"
            if phase and (site or not want_site) and (reader or not want_copy):
                break
            frame = frame.f_back
        if threading.current_thread() is self._main:
            self._last_phase = phase or "other"
        elif not phase:
            phase, site = self._last_phase, site or "(autograd thread)"
        return phase or "other", site, reader


@dataclass
class Tally:
    """What a :class:`LaunchCounter` saw."""

    launches: Counter[str] = field(default_factory=Counter)  # by phase
    syncs: Counter[str] = field(default_factory=Counter)  # by phase, outside host_copy
    transfers: Counter[str] = field(default_factory=Counter)  # host_copy reads, by phase
    sites: Counter[str] = field(default_factory=Counter)  # launches by call site
    sync_sites: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)  # launches by aten op
    phase_ops: Counter[str] = field(default_factory=Counter)  # "phase: op" (with sites)

    def total(self, counter: str = "launches") -> int:
        return sum(getattr(self, counter).values())


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner: LaunchCounter) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.owner._saw_op(func, args, kwargs, out)
        return out


class _Function(TorchFunctionMode):
    def __init__(self, owner: LaunchCounter) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        # On CUDA the dispatcher sees the copy; on a CPU the read never reaches it.
        if name in HOST_READ_METHODS and isinstance(first, torch.Tensor) and not first.is_cuda:
            self.owner._saw_read(name)
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    """Counts launches and host syncs inside ``with counter:`` (see the module doc).

    ``device``: the run's device type; on ``"cuda"`` only ops on CUDA tensors count.
    ``sites``: also attribute every launch to its call site (slower).
    """

    def __init__(self, *, device: str = "cpu", sites: bool = False) -> None:
        self.cuda = device == "cuda"
        self.want_sites = sites
        self.tally = Tally()
        self._stack = _Stack()
        self._modes: contextlib.ExitStack | None = None

    def __enter__(self) -> LaunchCounter:
        self._modes = contextlib.ExitStack()
        self._modes.enter_context(_Function(self))
        self._modes.enter_context(_Dispatch(self))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._modes is not None
        self._modes.close()
        self._modes = None

    def _saw_op(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        if name == SCALAR_READ:
            self._saw_read("item")
            return
        if self.cuda and self._is_device_to_host(name, args, kwargs, out):
            self._saw_read("copy to host")
            return
        if _is_view(func) or name in NOT_LAUNCHES:
            return
        devices = _device_types(args, kwargs, out)
        if "meta" in devices or (self.cuda and "cuda" not in devices):
            return  # shape-only work (meta tensors), or host-side math on a GPU run
        phase, site, _ = self._stack.describe(self.want_sites)
        self.tally.launches[phase] += 1
        self.tally.ops[name] += 1
        if self.want_sites:
            self.tally.sites[f"{phase}: {site or '?'}"] += 1
            self.tally.phase_ops[f"{phase}: {name}"] += 1

    @staticmethod
    def _is_device_to_host(name: str, args: Any, kwargs: Any, out: Any) -> bool:
        if name.startswith("_to_copy") and isinstance(out, torch.Tensor):
            src = args[0] if args else None
            return out.device.type == "cpu" and isinstance(src, torch.Tensor) and src.is_cuda
        if name.startswith("copy_") and len(args) >= 2:
            dst, src = args[0], args[1]
            return (
                isinstance(dst, torch.Tensor)
                and isinstance(src, torch.Tensor)
                and dst.device.type == "cpu"
                and src.is_cuda
            )
        return False

    def _saw_read(self, what: str) -> None:
        phase, site, reader = self._stack.describe(True, want_copy=True)
        if reader == "host":  # a host-resident tensor (host_array refuses device ones)
            return
        if reader == "copy":
            self.tally.transfers[phase] += 1
            return
        self.tally.syncs[phase] += 1
        self.tally.sync_sites[f"{site or '?'} ({what})"] += 1


class HostSyncError(AssertionError):
    """A host read outside :func:`host_copy` (or too many transfers in one phase)."""


class SyncGuard(LaunchCounter):
    """Fails on any host sync outside :func:`host_copy` (the tests' runtime guard).

    ``max_transfers``: how many :func:`host_copy` reads each phase may make in all.
    """

    def __init__(self, *, max_transfers: dict[str, int] | None = None) -> None:
        super().__init__(device="cpu", sites=False)
        self.max_transfers = max_transfers

    def _saw_read(self, what: str) -> None:
        super()._saw_read(what)
        if self.tally.syncs:
            raise HostSyncError(f"host sync outside host_copy: {dict(self.tally.sync_sites)}")
        if self.max_transfers is not None:
            for phase, n in self.tally.transfers.items():
                if n > self.max_transfers.get(phase, 0):
                    raise HostSyncError(
                        f"{n} host transfers in phase {phase!r} "
                        f"(at most {self.max_transfers.get(phase, 0)})"
                    )
