"""Producer process for the crash and exit tests (run as a script, never imported).

usage: _telemetry_producer.py MODE TELEMETRY_DIR RUN_ID [SIDE_CHANNEL]

- ``stream``: emit forever; after each emit append ``<seq> <monotonic_ns>`` to the side
  channel (one ``write`` per line, so a SIGKILL leaves only whole lines behind).
- ``exit``: emit 10 events and return without closing the hub (atexit must close it).
- ``raise``: emit 10 events and die of an uncaught exception.
"""

from __future__ import annotations

import os
import sys
import time

from esper.core.enums import TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.hub import open_run

FLUSH_INTERVAL_S = 0.5
PACE_EVERY = 20
PACE_S = 0.001


def _step(i: int) -> ev.EnvStep:
    nan = float("nan")
    return ev.EnvStep(
        step=i, env=i % 4, round=i // 100, train_loss=1.0 / (i + 1), train_acc=nan,
        val_loss=nan, val_acc=50.0, active_seeds=i % 3, host_params=1000, seed_params=i,
        train_ms=1.0, val_ms=1.0, features_ms=0.1, policy_ms=0.2,
    )  # fmt: skip


def main() -> None:
    mode, telemetry_dir, run_id = sys.argv[1:4]
    hub = open_run(
        telemetry_dir, run_id, level=TelemetryLevel.NORMAL, flush_interval_s=FLUSH_INTERVAL_S
    )
    if mode == "stream":
        fd = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        i = 0
        while True:
            event = _step(i)
            hub.emit(event)
            os.write(fd, f"{event.seq} {time.monotonic_ns()}\n".encode())
            i += 1
            if i % PACE_EVERY == 0:
                time.sleep(PACE_S)
    for i in range(10):
        hub.emit(_step(i))
    if mode == "raise":
        raise RuntimeError("producer failed on purpose")


if __name__ == "__main__":
    main()
