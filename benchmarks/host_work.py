"""Host work per env-step of the real trainer: Python calls, per-env loops, CPU outside
the capturable bodies, syncs, launches and transfers (issue 47's device-free acceptance).

Why: a GPU waits on the host's per-env Python, so a step's host work, counted on a CPU,
says whether the step can feed a GPU and be captured in CUDA graphs. Workload: ``train``
as a user calls it (PPO, telemetry ``normal``, seed 0) on the ``digits_tiny`` preset of
:mod:`_trainer`, variants ``batched`` (``run.batch_envs``) and ``trainer``. Round 0 warms
up; the *measured window* is each later call of :data:`ROUND_FUNCTION` (env reset,
steps, PPO update; not the checkpoint between rounds). The warm-up round's summary, sent
to train()'s ``progress`` callback, arms the instrument, which finds the round function
by its code object: nothing is patched but in the timing pass. One run per figure:

1. **Python calls into src/esper per env-step**: ``sys.setprofile`` 'call' events of
   frames whose code lies in the esper package (a generator's resumption counts), main
   thread. Deterministic. The top functions say where they go. Also counted: the
   Python calls into torch's own package (``torch calls``: vmap's input handling,
   ``functional_call``'s tensor swaps, module traversals, the optimizers' step) and all
   Python calls (``all calls``, any package): on a GPU the host runs those too.
2. **Per-env loops**, from ``sys.settrace`` line events. A loop is a backward jump of
   the bytecode, its header the lowest line it spans; a header line event is an entry
   (from a line above) or an iteration (from a line below, or the same line for a
   one-line loop). Traced at n_envs and n_envs / 2, a site is a **per-env loop** when
   its trip count (iterations per entry) grows :data:`GROWS`-fold or more as n_envs
   doubles and is at least n_envs * :data:`MIN_TRIP_SHARE`; *per-env loops per step*
   sums their entries. *Loop iterations per env-step* sums the iterations of every site
   whose iterations per step grow that much (per-env loops and the loops they run per
   env), over n_envs. A loop left by ``break`` counts one iteration less.
3. **Share of the round's main-thread CPU outside the capturable bodies**
   (:data:`CAPTURABLE`: host passes' forward/backward/step, the model's forward, the
   policy network's call, the PPO update): those functions and the round function are
   wrapped with ``time.thread_time`` for that run (a profiler hook would add its cost to
   every Python call, the very thing measured: +45 % of the round). The outermost body
   on the stack counts; garbage collections count outside (they start wherever the
   allocation count crosses a threshold). Median of ``--repeats`` runs.
4. **Host syncs and kernel launches per env-step** from
   :class:`esper.training.launch_count.LaunchCounter` (as ``launches.py``), and
   **host-device transfers per step**: calls of :data:`TRANSFER_FUNCTION`.
5. **Where the outside share goes**: a run with the functions of :data:`SITES` (the
   step's work outside the capturable bodies) wrapped with ``time.thread_time``
   (:class:`_host_probes.SiteClock`), each site's main-thread CPU, inclusive of what it
   calls, as a share of the round's. Sites nest (``HostEnvs.step`` holds
   ``execute_action``), so the shares do not add up. (A stack sampler in a thread was
   tried first: waiting for the GIL, it charged time to the code after long C calls,
   e.g. the reward normaliser five times its clocked share.)

``--ref GITREF`` also measures that commit, exported with ``git archive``; every run is
a subprocess with ``PYTHONPATH=<tree>/src:<tree>/analysis`` and that tree's
``benchmarks/_trainer.py``, and the trees take turns.

    python benchmarks/host_work.py                        # 16 and 64 envs, both variants
    python benchmarks/host_work.py --n-envs 16 --ref HEAD~3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
from _host_probes import (
    WARMUP_ROUNDS,
    BodyClock,
    LoopTracer,
    RoundGate,
    RoundProfile,
    SiteClock,
    code_of,
    resolve,
    wrapped,
)

PRESET = "digits_tiny"
VARIANTS = ("batched", "trainer")
DEFAULT_N_ENVS = [16, 64]
DEFAULT_REPEATS = 3
#: The round loop's body: the measured window is each call of it after the warm-up.
ROUND_FUNCTION = (  # the rooms' name first, the earlier trees' after it (--ref)
    "esper.training.loop.trainer:VectorizedTrainer.run_round",
    "esper.training.trainer:VectorizedTrainer.run_round",
)
#: The one sanctioned device-to-host transfer (its calls are the transfers).
TRANSFER_FUNCTION = "esper.core.transfer:host_copy"
LAUNCH_COUNTER = "esper.training.launch_count:LaunchCounter"
#: Work a CUDA graph can capture ("module:qualname"). Names that do not resolve in a
#: tree are skipped and listed in the results, so old and new names can stand together.
CAPTURABLE = (
    "esper.training.passes.slot_groups:HostBatch.train_batch",  # batched train step
    "esper.training.passes.slot_groups:HostBatch.forward",  # batched forward
    "esper.training.passes.host_batching:_validate_rows",  # batched validation (loss, hits)
    "esper.training.passes.batch_ops:train_batch",  # per-env train step
    "esper.model.morphogenetic:MorphogeneticModel.forward",  # per-env validation
    "esper.model.morphogenetic:MorphogeneticModel.fused_forward",  # + counterfactuals
    "esper.policy.network:FactoredActorCritic.act",  # the policy network's call
    "esper.training.learning.ppo:PPOUpdater.update",  # the PPO update
    # The same bodies in trees before training/ had rooms (--ref):
    "esper.training.slot_groups:HostBatch.train_batch",
    "esper.training.slot_groups:HostBatch.forward",
    "esper.training.batch_ops:train_batch",
    "esper.training.ppo:PPOUpdater.update",
)
#: A loop site scales with n_envs when doubling n_envs multiplies its count by this.
GROWS = 1.5
#: Loops are compared with a run at n_envs // LOOP_REFERENCE.
LOOP_REFERENCE = 2
#: A per-env loop runs at least n_envs * this many times per entry (a loop over the
#: envs, or over those with a seed; not one over the few seed kinds present).
MIN_TRIP_SHARE = 0.25
TOP_FUNCTIONS = 15
TOP_LOOPS = 10
#: Where the step's time outside the capturable bodies goes ("module:qualname"; names
#: that do not resolve in a tree are skipped, as for CAPTURABLE).
SITES = (
    "esper.training.envs.env_factory:EnvFactory.create_round",  # the round's envs
    "esper.training.envs.host_envs:HostEnvs.step",  # actions and rewards
    "esper.training.envs.action_execution:execute_action",  # the acting envs' operations
    "esper.training.envs.action_execution:sync_seed_optimizers",
    "esper.training.envs.host_envs:HostEnvs.observe",  # features and masks
    "esper.training.envs.host_envs:HostEnvs._govern",  # governor checks and snapshots
    "esper.model.ticks:tick_slots",  # lifecycle ticks
    "esper.training.envs.counterfactual:ablations",  # validation's configurations
    "esper.training.passes.slot_groups:HostBatch.__init__",  # kind grouping
    "esper.training.passes.slot_groups:HostBatch.set_modes",
    "esper.training.passes.host_batching:_adopt",  # new seeds into the store
    "esper.training.learning.learner:Learner.record_step",  # the rollout buffer
    "esper.training.learning.normalizers:RewardNormalizer.update",
    "esper.training.loop.recorder:Recorder.epoch",  # events
    "esper.training.loop.recorder:Recorder.actions",
    "esper.training.loop.recorder:Recorder.env_steps",
)
#: A worker run gets this long (a hang, not a slow machine, should stop the script).
WORKER_TIMEOUT_S = 3600
#: Parts of a tree an export needs (src is required).
TREE_PARTS = ("src", "analysis", "benchmarks", "configs")
#: The summary table: (heading, path into a result row).
COLUMNS = (
    ("variant", ("variant",)),
    ("tree", ("tree",)),
    ("n_envs", ("n_envs",)),
    ("calls/env-step", ("calls_per_env_step",)),
    ("torch calls/env-step", ("torch_calls_per_env_step",)),
    ("all calls/env-step", ("all_calls_per_env_step",)),
    ("per-env loops/step", ("loops", "per_env_loops_per_step")),
    ("loop it./env-step", ("loops", "loop_iterations_per_env_step")),
    ("outside share", ("outside_share",)),
    ("syncs/env-step", ("launches", "syncs_per_env_step")),
    ("launches/env-step", ("launches", "launches_per_env_step")),
    ("transfers/step", ("transfers_per_step",)),
)
CALL_KEYS = ("calls_per_env_step", "torch_calls_per_env_step", "all_calls_per_env_step",
             "transfers_per_step", "top_functions")  # fmt: skip
LOOP_COLUMNS = ("site", "per_env_loop", "entries_per_step", "trip", "trip_at_half")


# ---------------------------------------------------------------------- worker side
@dataclass
class Run:
    """One worker's workload: the config, its data, and how to call train()."""

    cfg: Any
    data: Any
    prefix: str  # the esper package directory, with a trailing separator

    def train(self, arm: Callable[[], None]) -> None:
        from esper.config import with_overrides
        from esper.training.run import train

        with tempfile.TemporaryDirectory(prefix="esper-host-work-") as tmp:
            cfg = with_overrides(self.cfg, {"telemetry.dir": tmp, "run.run_id": "host-work"})
            train(cfg, data=self.data, progress=RoundGate(arm))

    def measured(self, rounds: int) -> tuple[int, int]:
        """(steps, env-steps) of ``rounds`` measured rounds; an error if a round was missed."""
        expected = self.cfg.run.rounds - WARMUP_ROUNDS
        if rounds != expected:
            raise RuntimeError(f"measured {rounds} rounds, expected {expected}")
        steps = rounds * self.cfg.run.episode_length
        return steps, steps * self.cfg.run.n_envs

    def where(self, code: CodeType) -> str:
        return f"{code.co_filename.removeprefix(self.prefix)}:{code.co_qualname}"


def pass_calls(run: Run) -> dict[str, Any]:
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    hook = RoundProfile(code_of(ROUND_FUNCTION), run.prefix, torch_dir)
    try:
        run.train(lambda: sys.setprofile(hook))
    finally:
        sys.setprofile(None)
    steps, env_steps = run.measured(hook.rounds)
    by_name: Counter[str] = Counter()
    for code, n in hook.calls.items():
        by_name[run.where(code)] += n
    ranked = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FUNCTIONS]
    return {
        "calls_per_env_step": hook.calls.total() / env_steps,
        "torch_calls_per_env_step": hook.torch_calls / env_steps,
        "all_calls_per_env_step": hook.all_calls / env_steps,
        "transfers_per_step": hook.calls[code_of(TRANSFER_FUNCTION)] / steps,
        "top_functions": [{"function": k, "per_env_step": n / env_steps} for k, n in ranked],
    }


def pass_loops(run: Run) -> dict[str, Any]:
    tracer = LoopTracer(code_of(ROUND_FUNCTION), run.prefix)
    try:
        run.train(lambda: sys.settrace(tracer))
    finally:
        sys.settrace(None)
    steps, _ = run.measured(tracer.rounds)
    sites: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for code, line in tracer.entries.keys() | tracer.iterations.keys():
        site = sites[run.where(code).replace(":", f":{line} ", 1)]
        site[0] += tracer.entries[code, line] / steps
        site[1] += tracer.iterations[code, line] / steps
    return {"sites": dict(sorted(sites.items()))}


def pass_launches(run: Run) -> dict[str, Any]:
    counter = resolve(LAUNCH_COUNTER)[2](device="cpu")
    hook = RoundProfile(code_of(ROUND_FUNCTION))
    hook.enter, hook.leave = counter.__enter__, lambda: counter.__exit__(None, None, None)
    try:
        run.train(lambda: sys.setprofile(hook))
    finally:
        sys.setprofile(None)
    steps, env_steps = run.measured(hook.rounds)
    tally = counter.tally
    return {
        "launches_per_env_step": tally.total() / env_steps,
        "syncs_per_env_step": tally.total("syncs") / env_steps,
        "host_copy_reads_per_step": tally.total("transfers") / steps,
        "launches_by_phase": {p: n / env_steps for p, n in tally.launches.items()},
    }


def _clocked(run: Run, clock: BodyClock, wrappers: dict[str, Any]) -> list[str]:
    """Train with the round function and ``wrappers``' functions wrapped by ``clock``;
    the names that did not resolve."""
    rounds = {name: clock.round for name in ROUND_FUNCTION}
    with wrapped({**rounds, **wrappers}) as missing:
        if all(name in missing for name in ROUND_FUNCTION):
            raise LookupError(f"{ROUND_FUNCTION}: no such function")
        run.train(clock.arm)
    return missing


def pass_timing(run: Run) -> dict[str, Any]:
    clock = BodyClock()
    gc.callbacks.append(clock.collecting)
    try:
        missing = _clocked(run, clock, {name: clock.body for name in CAPTURABLE})
    finally:
        gc.callbacks.remove(clock.collecting)
    _, env_steps = run.measured(clock.rounds)
    inside = sum(clock.bodies.values()) - clock.gc_in_bodies_s
    return {
        "outside_share": 1 - inside / clock.round_s if clock.round_s > 0 else None,
        "round_cpu_us_per_env_step": clock.round_s / env_steps * 1e6,
        "gc_us_per_env_step": clock.gc_s / env_steps * 1e6,
        "gc_in_bodies_us_per_env_step": clock.gc_in_bodies_s / env_steps * 1e6,
        "bodies_us_per_env_step": {k: v / env_steps * 1e6 for k, v in clock.bodies.items()},
        "unresolved": missing,
    }


def pass_sites(run: Run) -> dict[str, Any]:
    clock = SiteClock()
    gc.callbacks.append(clock.collecting)
    try:
        missing = _clocked(run, clock, {name: clock.site for name in SITES})
    finally:
        gc.callbacks.remove(clock.collecting)
    _, env_steps = run.measured(clock.rounds)
    return {
        "round_cpu_us_per_env_step": clock.round_s / env_steps * 1e6,
        "gc_us_per_env_step": clock.gc_s / env_steps * 1e6,  # in no site's share
        "shares": {k: v / clock.round_s for k, v in sorted(clock.sites.items())},
        "unresolved": [name for name in missing if name in SITES],
    }


PASSES = {
    "calls": pass_calls,
    "loops": pass_loops,
    "launches": pass_launches,
    "timing": pass_timing,
    "sites": pass_sites,
}


def worker(args: argparse.Namespace) -> int:
    """One pass on one tree (the esper on PYTHONPATH); its results as JSON to a file."""
    import esper
    from esper.config import with_overrides

    package = Path(esper.__file__).resolve().parent
    tree = args.tree.resolve()
    if not package.is_relative_to(tree):
        raise SystemExit(f"host_work: esper imported from {package}, not from {tree}/src")
    sys.path.insert(0, str(tree / "benchmarks"))  # the tree's own workload (its presets)
    import _trainer as T

    n_envs, quick = args.n_envs[0], args.quick
    cfg = T.bench_config(PRESET, n_envs=n_envs, level="normal", threads=1, quick=quick)
    rounds = args.rounds or max(cfg.run.rounds, WARMUP_ROUNDS + 1)
    cfg = with_overrides(cfg, {"run.batch_envs": args.variant == "batched", "run.rounds": rounds})
    run = Run(cfg, T.load_data(cfg), str(package) + os.sep)
    t0 = time.perf_counter()
    result = PASSES[args.worker](run)
    result.update(config=T.describe(cfg), seconds=time.perf_counter() - t0)
    args.worker_out.write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------- parent side
@dataclass(frozen=True)
class Tree:
    label: str
    root: Path
    commit: str
    dirty: bool  # the measured parts differ from the commit


def _git(*args: str, usage: str = "") -> str:
    """git's output; on failure, ``usage`` as a usage error (exit 2) or git's message."""
    cmd = ["git", "-C", str(C.REPO_ROOT), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and usage:
        print(f"host_work: {usage}", file=sys.stderr)
        raise SystemExit(2)
    if proc.returncode != 0:
        raise SystemExit(f"host_work: git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def working_tree() -> Tree:
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--", *TREE_PARTS))
    except (SystemExit, OSError):
        commit, dirty = "unknown", True
    return Tree("working", C.REPO_ROOT, commit, dirty)


def export_tree(ref: str, into: Path) -> Tree:
    """``ref``'s src, analysis, benchmarks and configs (the workloads' base), extracted
    from ``git archive`` into ``into``."""
    bad = f"--ref {ref}: not a commit of {C.REPO_ROOT}"
    commit = _git("rev-parse", "--verify", "--short", f"{ref}^{{commit}}", usage=bad)
    present = _git("ls-tree", "--name-only", commit).split()
    archive = into / "tree.tar"
    _git("archive", "-o", str(archive), commit, *(p for p in TREE_PARTS if p in present))
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return Tree(ref, into / "tree", commit, False)


@dataclass(frozen=True)
class Job:
    kind: str
    variant: str
    n_envs: int


def run_job(tree: Tree, job: Job, args: argparse.Namespace) -> dict[str, Any]:
    """One worker process: ``job`` on ``tree``."""
    with tempfile.TemporaryDirectory(prefix="esper-host-work-") as tmp:
        out = Path(tmp) / "result.json"
        flags = {"--worker": job.kind, "--tree": tree.root, "--variant": job.variant,
                 "--n-envs": job.n_envs, "--worker-out": out, "--rounds": args.rounds}  # fmt: skip
        cmd = [sys.executable, __file__, *(str(x) for kv in flags.items() if kv[1] for x in kv)]
        path = os.pathsep.join(str(tree.root / part) for part in ("src", "analysis"))
        env = {**os.environ, "PYTHONPATH": path}
        cmd += ["--quick"] if args.quick else []
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True,
                              timeout=WORKER_TIMEOUT_S, check=False)  # fmt: skip
        if proc.returncode != 0:
            hint = " (--ref X --ref-only measures X alone)" if tree.label == "working" else ""
            raise SystemExit(f"host_work: {job} on {tree.label} failed{hint}:\n"
                             f"{proc.stderr[-4000:]}")  # fmt: skip
        result: dict[str, Any] = json.loads(out.read_text())
    seconds = result["seconds"]
    print(
        f"  {tree.label:>10} {job.variant} n_envs={job.n_envs} {job.kind}: {seconds:.0f} s",
        flush=True,
    )
    return result


def plan(args: argparse.Namespace) -> list[Job]:
    """The deterministic passes (once each), then the timing runs (``--repeats`` each)."""
    each = [(v, n) for v in args.variants for n in args.n_envs]
    jobs = [Job(kind, v, n) for v, n in each for kind in ("calls", "launches", "sites")]
    loop_n = sorted({m for n in args.n_envs for m in (n, n // LOOP_REFERENCE)})
    jobs += [Job("loops", v, n) for v in args.variants for n in loop_n]
    return jobs + [Job("timing", v, n) for _ in range(args.repeats) for v, n in each]


def per_env_loops(
    at_n: dict[str, list[float]], at_ref: dict[str, list[float]], n_envs: int
) -> dict[str, Any]:
    """The loop figures of the module docstring, from loop sites at n and n / 2."""
    loops = iterations = 0.0
    sites: list[dict[str, Any]] = []
    for site, (entries, its) in at_n.items():
        ref_entries, ref_its = at_ref.get(site, (0.0, 0.0))
        trip = its / entries if entries else 0.0
        ref_trip = ref_its / ref_entries if ref_entries else None
        per_env = ref_trip is not None and trip >= max(GROWS * ref_trip, MIN_TRIP_SHARE * n_envs)
        scales = its > 0 and its >= GROWS * ref_its
        loops += entries if per_env else 0.0
        iterations += its / n_envs if scales else 0.0
        if per_env or scales:
            values = (site, per_env, entries, trip, ref_trip)
            sites.append({**dict(zip(LOOP_COLUMNS, values, strict=True)),
                          "iterations_per_env_step": its / n_envs})  # fmt: skip
    sites.sort(key=lambda s: (-s["iterations_per_env_step"], s["site"]))
    return {
        "per_env_loops_per_step": loops,
        "loop_iterations_per_env_step": iterations,
        "all_loop_iterations_per_env_step": sum(its for _, its in at_n.values()) / n_envs,
        "top_sites": sites[:TOP_LOOPS],
        "per_env_sites": sorted(
            (s for s in sites if s["per_env_loop"]), key=lambda s: -s["entries_per_step"]
        ),
    }


def summarize(tree: Tree, variant: str, n: int, got: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """One (tree, variant, n_envs) row of the results from its workers' outputs."""
    calls, loops = got["calls", n], got["loops", n]["sites"]
    shares = [t["outside_share"] for t in got["timing", n]]
    return {
        "variant": variant,
        "tree": tree.label,
        "commit": tree.commit,
        "n_envs": n,
        "config": calls["config"],
        **{k: calls[k] for k in CALL_KEYS},
        "loops": per_env_loops(loops, got["loops", n // LOOP_REFERENCE]["sites"], n),
        "outside_share": C.median(shares),
        "outside_share_samples": shares,
        "timing": got["timing", n],
        "launches": got["launches", n],
        "sites": got["sites", n],
    }


def _cell(row: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = row
    for key in path:
        value = value.get(key, "-") if isinstance(value, dict) else "-"
    return "-" if value is None else value


def print_details(r: dict[str, Any]) -> None:
    where = f"{r['variant']}, {r['tree']}, n_envs {r['n_envs']}"
    C.print_table(
        f"Top functions by calls per env-step ({where})",
        ["function", "calls"],
        [[f["function"], f["per_env_step"]] for f in r["top_functions"]],
    )
    keys = (*LOOP_COLUMNS, "iterations_per_env_step")
    C.print_table(
        f"Top loop sites growing with n_envs ({where}; trip = iterations per entry)",
        ["site", "per-env loop", "entries/step", "trip", "trip at n/2", "it./env-step"],
        [[_cell(s, (k,)) for k in keys] for s in r["loops"]["top_sites"]],
    )
    sites = r["sites"]["shares"]
    C.print_table(
        f"Outside the capturable bodies, by site ({where}; share of the round's CPU, "
        "inclusive: sites nest)",
        ["site", "share"],
        [[k, v] for k, v in sorted(sites.items(), key=lambda kv: -kv[1])],
    )


def measure(trees: list[Tree], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every job on every tree, by turns (the first tree alternates per job)."""
    got: dict[tuple[str, str], dict[tuple[str, int], Any]] = {}
    for i, job in enumerate(plan(args)):
        for tree in C.alternate(trees, i):
            result = run_job(tree, job, args)
            slot = got.setdefault((tree.label, job.variant), {})
            if job.kind == "timing":
                slot.setdefault(("timing", job.n_envs), []).append(result)
            else:
                slot[job.kind, job.n_envs] = result
    each = [(v, n, t) for v in args.variants for n in args.n_envs for t in trees]
    return [summarize(t, v, n, got[t.label, v]) for v, n, t in each]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = C.base_parser(__doc__.splitlines()[0])
    p.add_argument("--n-envs", type=C.csv_list(int), default=DEFAULT_N_ENVS)
    p.add_argument("--variants", type=C.csv_list(str), default=list(VARIANTS))
    p.add_argument("--rounds", type=int, help="rounds per run, the first a warm-up")
    p.add_argument("--ref", help="also measure this git commit, by turns")
    p.add_argument("--ref-only", action="store_true", help="measure the --ref commit alone")
    p.add_argument("--worker", choices=list(PASSES), help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick and not args.worker:
        args.n_envs = [2]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {list(VARIANTS)}")
    if not args.worker and (not args.n_envs or min(args.n_envs) < LOOP_REFERENCE):
        p.error(f"--n-envs: each at least {LOOP_REFERENCE} (loops are compared at n / 2)")
    if args.rounds is not None and args.rounds <= WARMUP_ROUNDS:
        p.error(f"--rounds {args.rounds}: at least {WARMUP_ROUNDS + 1} (the first warms up)")
    if args.ref_only and args.ref is None:
        p.error("--ref-only needs --ref GITREF")
    args.repeats = args.repeats or (1 if args.quick else DEFAULT_REPEATS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    with tempfile.TemporaryDirectory(prefix="esper-host-work-ref-") as tmp:
        trees = [] if args.ref_only else [working_tree()]
        if args.ref is not None:
            trees.append(export_tree(args.ref, Path(tmp)))
        results = measure(trees, args)
    for r in results:
        print_details(r)
    C.print_table(
        f"Host work per env-step, {PRESET}, rounds after the first, telemetry normal "
        f"(outside share: median of {args.repeats})",
        [heading for heading, _ in COLUMNS],
        [[_cell(r, path) for _, path in COLUMNS] for r in results],
    )
    payload = {
        "benchmark": "host_work",
        "machine": info,
        "quick": args.quick,
        "preset": "quick" if args.quick else PRESET,
        "repeats": args.repeats,
        "capturable": list(CAPTURABLE),
        "trees": [{"label": t.label, "commit": t.commit, "dirty": t.dirty} for t in trees],
        "results": results,
    }
    C.write_results(args.out, "host_work", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
