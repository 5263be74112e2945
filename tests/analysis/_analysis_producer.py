"""A producer that is killed mid-run (run as a script by the crash fixture, never imported).

usage: _analysis_producer.py TELEMETRY_DIR RUN_ID

Emits round 0 of the scripted stream, flushes it (durable), prints how many events
are durable, emits round 1 without flushing (the flush interval is long), then
SIGKILLs itself: the manifest stays ``running`` and there is no run_finished event.
"""

from __future__ import annotations

import os
import signal
import sys

from _analysis_support import CONFIG_HASH, Script, scripted_events

from esper.core.enums import TelemetryLevel
from esper.telemetry.hub import open_run

FLUSH_INTERVAL_S = 60.0


def main() -> None:
    root, run_id = sys.argv[1:3]
    hub = open_run(
        root,
        run_id,
        level=TelemetryLevel.NORMAL,
        config_hash=CONFIG_HASH,
        flush_interval_s=FLUSH_INTERVAL_S,
    )
    script = Script()
    durable = 0
    for event in scripted_events(script, rounds=range(0, 1)):
        hub.emit(event)
        durable += 1
    hub.flush()
    print(durable, flush=True)
    for event in scripted_events(script, rounds=range(1, 2)):
        hub.emit(event)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
