"""What fixed shapes for CUDA graphs would cost: the seed rows of the batched passes.

Why: capturing a batched pass as a CUDA graph needs shapes that do not change between
replays, and the seed kinds of a pass change at nearly every step (issue 47, items 3
and 6). Two ways to fix them are on the table, and a CPU can count what each costs
before a device measures what it saves:

- **sleepers**: every (env, slot, blueprint) present in the pass from the round's start,
  switched on by its alpha. The rows a pass runs become every env x slot x blueprint.
- **buckets**: each seed kind's rows padded to a power of two, one graph per
  (kind, bucket), captured on first use and replayed after.

For each batched pass (``HostBatch``: train and validation) of ``train`` as a user calls
it (PPO, telemetry ``normal``, seed 0, ``digits_tiny`` of :mod:`_trainer`, 3 rounds), the
run counts the seed rows that run, the rows with sleepers, the rows padded to buckets,
and the distinct (kind, bucket) pairs and whole-pass layouts (the kinds and buckets of
a pass, in order) seen in the run: a graph per whole layout would be captured about once
per pass. Deterministic: one run per figure.

    python benchmarks/seed_layouts.py                  # 16 and 64 envs
    python benchmarks/seed_layouts.py --n-envs 16 --rounds 6
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import _trainer as T
from _host_probes import wrapped

from esper.config import with_overrides
from esper.core.enums import SeedStage
from esper.model.slot_table import STAGE_CODE

PRESET = "digits_tiny"
DEFAULT_N_ENVS = [16, 64]
DEFAULT_ROUNDS = 3
BATCH_INIT = "esper.training.passes.slot_groups:HostBatch.__init__"
_TRAINING = STAGE_CODE[SeedStage.TRAINING]
PASSES = {True: "train", False: "validation"}


def bucket(rows: int) -> int:
    """The power of two a kind's ``rows`` are padded to."""
    return 1 << (rows - 1).bit_length()


class LayoutCount:
    """Counts the seed rows and layouts of every batched pass it sees."""

    def __init__(self) -> None:
        self.counts: dict[bool, Counter[str]] = {True: Counter(), False: Counter()}
        self.pairs: dict[bool, set[tuple[Any, ...]]] = {True: set(), False: set()}
        self.layouts: dict[bool, set[tuple[Any, ...]]] = {True: set(), False: set()}
        self.sleepers: dict[bool, int] = {True: 0, False: 0}

    def wrap(self, init: Any, _name: str) -> Any:
        def counted(batch: Any, store: Any, **kwargs: Any) -> None:
            init(batch, store, **kwargs)
            self.record(batch)

        return counted

    def record(self, batch: Any) -> None:
        model, table, train = batch.model, batch.store.table.slots, batch.train
        counts = self.counts[train]
        counts["passes"] += 1
        layout = []
        for slot_id, kinds in batch.kinds.items():
            col = model.slot_ids.index(slot_id)
            for kind in kinds:
                row = batch.store.rows[kind.store_rows[0]]
                training = bool(table.stage[row, col] == _TRAINING)
                blend = 0 if training else int(table.blend_op[row, col])
                key = (col, int(table.blueprint_id[row, col]), training, blend, kind.trainable)
                n, padded = len(kind.rows), bucket(len(kind.rows))
                counts["kinds"] += 1
                counts["rows"] += n
                counts["bucketed"] += padded
                self.pairs[train].add((key, padded))
                layout.append((key, padded))
        self.layouts[train].add(tuple(layout))
        kinds_possible = len(model.slot_ids) * len(model.registry.names(model.topology))
        counts["sleepers"] += len(batch.members) * kinds_possible
        self.sleepers[train] = kinds_possible

    def rows(self, n_envs: int) -> list[dict[str, Any]]:
        out = []
        for train, name in PASSES.items():
            c, passes = self.counts[train], max(self.counts[train]["passes"], 1)
            out.append(
                {
                    "n_envs": n_envs,
                    "pass": name,
                    "passes": c["passes"],
                    "kinds_per_pass": c["kinds"] / passes,
                    "seed_rows_per_pass": c["rows"] / passes,
                    "sleeper_rows_per_pass": c["sleepers"] / passes,
                    "sleeper_kinds": self.sleepers[train],
                    "bucketed_rows_per_pass": c["bucketed"] / passes,
                    "kind_buckets": len(self.pairs[train]),
                    "pass_layouts": len(self.layouts[train]),
                }
            )
        return out


def measure(n_envs: int, rounds: int, *, quick: bool) -> list[dict[str, Any]]:
    cfg = T.bench_config(PRESET, n_envs=n_envs, level="normal", threads=1, quick=quick)
    cfg = with_overrides(cfg, {"run.batch_envs": True, "run.rounds": rounds})
    counter = LayoutCount()
    with wrapped({BATCH_INIT: counter.wrap}) as missing:
        if missing:
            raise SystemExit(f"not found in this tree: {missing}")
        T.run_trainer(cfg, T.load_data(cfg))
    return counter.rows(n_envs)


COLUMNS = (
    ("n_envs", "n_envs"),
    ("pass", "pass"),
    ("passes", "passes"),
    ("kinds / pass", "kinds_per_pass"),
    ("seed rows / pass", "seed_rows_per_pass"),
    ("sleepers: rows / pass", "sleeper_rows_per_pass"),
    ("sleepers / seed rows", None),
    ("buckets: rows / pass", "bucketed_rows_per_pass"),
    ("buckets / seed rows", None),
    ("(kind, bucket) graphs", "kind_buckets"),
    ("pass layouts", "pass_layouts"),
)


def _cells(r: dict[str, Any]) -> list[Any]:
    seed = r["seed_rows_per_pass"]  # no seed ran: no ratio
    ratios = iter(
        [
            r[k] / seed if seed else math.nan
            for k in ("sleeper_rows_per_pass", "bucketed_rows_per_pass")
        ]
    )
    return [C.fmt(r[key]) if key else C.fmt(next(ratios)) for _, key in COLUMNS]


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=C.csv_list(int), default=DEFAULT_N_ENVS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    args = parser.parse_args(argv)
    info = C.machine_info(threads=1)
    C.print_machine(info)
    results = []
    for n in args.n_envs:
        results += measure(n, args.rounds, quick=args.quick)
        print(f"     n_envs={n}: done", flush=True)
    C.print_table(
        f"Seed rows of the batched passes, {PRESET}, {args.rounds} rounds "
        "(rows: per pass; graphs and layouts: distinct in the run)",
        [heading for heading, _ in COLUMNS],
        [_cells(r) for r in results],
    )
    payload = {
        "benchmark": "seed_layouts",
        "machine": info,
        "quick": args.quick,
        "preset": "quick" if args.quick else PRESET,
        "rounds": args.rounds,
        "results": results,
    }
    C.write_results(args.out, "seed_layouts", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
