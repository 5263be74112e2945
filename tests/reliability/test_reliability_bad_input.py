"""Bad input: each mistake is ONE ``error:`` line naming the problem, exit 2, no traceback.

Every case runs through :func:`esper.cli.main` in-process (the CLI's whole code path;
an escaping exception would fail the test, as a traceback would), and a representative
subset also through the real ``esper`` program in a subprocess, which adds what only a
process shows: the exit status and stderr as a user sees them.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _reliability_support import (
    assert_user_error,
    in_process,
    run_esper,
    train_args,
    write_small_config,
)

from esper.cli import main as esper_main
from esper.config import Config, with_overrides
from esper.core.enums import RunStatus, TelemetryLevel
from esper.telemetry import events as ev
from esper.telemetry.events import SCHEMA_VERSION
from esper.telemetry.hub import open_run

NEWER = SCHEMA_VERSION + 1
#: Byte positions flipped (evenly spaced) in the checkpoint-integrity test.
FLIP_POSITIONS = 400


def _config_file(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


CONFIG_CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # id: (file name, content, needles of the error line)
    "unknown-key": ("c.toml", "[run]\nbogus = 1\n", ("unknown field", "bogus", "$.run")),
    "unknown-section": ("c.toml", "[runn]\nseed = 1\n", ("unknown field", "runn")),
    "wrong-type": ("c.toml", '[run]\nn_envs = "four"\n', ("expected `int`", "$.run.n_envs")),
    "wrong-type-json": ("c.json", '{"ppo": {"lr": "fast"}}', ("expected `float`", "$.ppo.lr")),
    "zero-size": ("c.toml", "[task]\nbatch_size = 0\n", (">= 1", "$.task.batch_size")),
    "negative-size": ("c.toml", "[run]\nepisode_length = -4\n", ("$.run.episode_length",)),
    "infinite-lr": ("c.toml", "[ppo]\nlr = inf\n", ("finite", "$.ppo.lr")),
    "bad-level": ("c.toml", '[telemetry]\nlevel = "loud"\n', ("$.telemetry.level", "loud")),
    "bad-device": ("c.toml", '[run]\ndevice = "cuda:x"\n', ("$.run.device", "cuda:x")),
    "not-toml": ("c.toml", "this is = = not toml", ("not valid toml",)),
    "not-a-table": ("c.json", "[1, 2]", ("top level",)),
    "yaml": ("c.yaml", "run: {}", ("unsupported config format",)),
}


#: Cases also run as real subprocesses (the rest only in-process).
SUBPROCESS_CASES = frozenset(
    {"unknown-key", "wrong-type", "zero-envs", "fault-unknown-kind", "run-id-traversal"}
)


def _run(
    case: str, args: list[str], capsys: pytest.CaptureFixture[str], subprocess_too: bool
) -> list[subprocess.CompletedProcess[str]]:
    procs = [in_process(args, capsys)]
    if subprocess_too and case in SUBPROCESS_CASES:
        procs.append(run_esper(args))
    return procs


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    name, text, needles = CONFIG_CASES[case]
    path = _config_file(tmp_path, name, text)
    args = ["train", "--config", str(path), "--telemetry-dir", str(tmp_path / "t")]
    for proc in _run(case, args, capsys, subprocess_too=True):
        assert_user_error(proc, str(path), *needles)
    assert not (tmp_path / "t").exists(), "nothing written for a rejected config"


FLAG_CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "missing-config": (["--config", "nope.toml"], ("config file not found", "nope.toml")),
    "zero-envs": (["--envs", "0"], ("$.run.n_envs", ">= 1")),
    "zero-rounds": (["--rounds", "0"], ("$.run.rounds",)),
    "negative-episode": (["--episode-length", "-3"], ("$.run.episode_length",)),
    "zero-batch": (["--batch-size", "0"], ("$.task.batch_size",)),
    "huge-seed": (["--seed", str(2**70)], ("$.run.seed",)),
    "unknown-task": (["--task", "imagenet"], ("imagenet", "$.task.name")),
    "cifar-without-path": (["--task", "cifar10"], ("$.task.data_path", "cifar10")),
    "fault-unknown-kind": (["--inject-fault", "boom:round=1"], ("boom", "unknown kind")),
    "fault-bad-int": (["--inject-fault", "nan:env=x,round=0,step=0"], ("env", "'x'")),
    "fault-missing-field": (["--inject-fault", "nan:round=1"], ("missing step",)),
    "fault-negative": (["--inject-fault", "nan:env=-1,round=0,step=0"], ("env must be >= 0",)),
    "fault-bad-field": (["--inject-fault", "nan:when=3"], ("bad field", "when")),
    "run-id-traversal": (["--run-id", "../evil"], ("invalid run id", "../evil")),
    "run-id-absolute": (["--run-id", "/tmp/evil"], ("invalid run id",)),
    "run-id-separator": (["--run-id", "a/../../b"], ("invalid run id",)),
    "run-id-dotdot": (["--run-id", ".."], ("invalid run id",)),
    "run-id-hidden": (["--run-id", ".hidden"], ("invalid run id",)),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_bad_command_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    flags, needles = FLAG_CASES[case]
    tel = tmp_path / "tel"
    monkeypatch.chdir(tmp_path)  # relative paths in the flags resolve here
    args = ["train", "--telemetry-dir", str(tel), "--no-progress", *flags]
    for proc in _run(case, args, capsys, subprocess_too=True):
        assert_user_error(proc, *needles)
    assert not tel.exists() and not (tmp_path / "evil").exists()
    assert not Path("/tmp/evil").exists()


# --- in-process through esper.cli.main (torch needed to find the problem) --------------


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, str]:
    code = esper_main(args)
    err = capsys.readouterr().err
    return code, err


def _assert_one_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "\x1b[" not in err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), (needle, lines[0])


def _small_args(tmp: Path, *extra: str) -> list[str]:
    config = write_small_config(tmp)
    return train_args(config, tmp / "tel", "bad", *extra, rounds=1)


def _write_cifar(directory: Path, records: int = 4) -> None:
    from esper.data.cifar10 import CIFAR_TEST_FILE, CIFAR_TRAIN_FILES, write_cifar10_batch

    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for name in (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE):
        images = rng.integers(0, 256, size=(records, 3, 32, 32), dtype=np.uint8)
        write_cifar10_batch(directory / name, images, rng.integers(0, 10, size=records))


def test_missing_dataset_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-cifar"
    args = _small_args(tmp_path, "--task", "cifar10", "--data-path", str(missing))
    _assert_one_error(*_cli(capsys, args), "CIFAR-10 directory not found", str(missing))


def test_reused_run_id_is_refused_before_the_data_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run-directory check comes first: the dataset named here does not even exist."""
    with open_run(tmp_path / "tel", "bad", level=TelemetryLevel.NORMAL):
        pass
    missing = tmp_path / "no-such-cifar"
    args = _small_args(tmp_path, "--task", "cifar10", "--data-path", str(missing))
    _assert_one_error(*_cli(capsys, args), "already has telemetry", "choose another run id")


def test_telemetry_dir_under_a_file_is_refused_before_the_data_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plain-file").write_text("")
    args = _small_args(tmp_path, "--task", "cifar10", "--data-path", str(tmp_path / "none"))
    args[args.index("--telemetry-dir") + 1] = str(tmp_path / "plain-file" / "tel")
    _assert_one_error(*_cli(capsys, args), "cannot create the run directory", "not a directory")
    assert not (tmp_path / "tel").exists()


def test_unknown_host_slot_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_small_config(tmp_path)
    config.write_text(config.read_text() + '\n[host]\nslots = ["r9c9"]\n')
    args = train_args(config, tmp_path / "tel", "bad", rounds=1)
    _assert_one_error(*_cli(capsys, args), "host", "unknown slot", "r9c9", "r0c0")
    assert not (tmp_path / "tel" / "bad" / "checkpoint.pt").exists()


def test_dataset_directory_missing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "cifar"
    _write_cifar(data)
    (data / "data_batch_4.bin").unlink()
    args = _small_args(tmp_path, "--task", "cifar10", "--data-path", str(data))
    _assert_one_error(*_cli(capsys, args), "missing", "data_batch_4.bin")


def test_truncated_cifar10_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "cifar"
    _write_cifar(data)
    victim = data / "data_batch_3.bin"
    victim.write_bytes(victim.read_bytes()[:5000])
    args = _small_args(tmp_path, "--task", "cifar10", "--data-path", str(data))
    _assert_one_error(*_cli(capsys, args), str(victim), "truncated")


def test_cifar10_file_with_bad_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "cifar"
    _write_cifar(data)
    victim = data / "test_batch.bin"
    raw = bytearray(victim.read_bytes())
    raw[0] = 200  # label byte of record 0
    victim.write_bytes(bytes(raw))
    args = _small_args(tmp_path, "--task", "cifar10", "--data-path", str(data))
    _assert_one_error(*_cli(capsys, args), str(victim), "label 200")


def _checkpoint_for(tmp: Path, cfg: Config, name: str = "ckpt.pt", **extra: Any) -> Path:
    """A checkpoint written by the real writer for ``cfg`` (learner state left empty)."""
    from esper.training.loop.checkpoint import compat_fingerprint, save_checkpoint

    path = tmp / name
    state: dict[str, Any] = {
        "run_id": "other",
        "next_round": 1,
        "seq_position": 10,
        "config": cfg.to_json(),
        "compat": compat_fingerprint(cfg),
        "learner": {},
    }
    state.update(extra)
    save_checkpoint(path, state)
    return path


def _cli_config(tmp: Path) -> Config:
    """The Config the CLI builds from :func:`_small_args` (before the run id is set)."""
    from esper.config import load_config

    return with_overrides(
        load_config(write_small_config(tmp)),
        {
            "run.n_envs": 2,
            "run.episode_length": 4,
            "run.rounds": 1,
            "run.seed": 0,
            "telemetry.dir": str(tmp / "tel"),
            "run.run_id": "bad",
            "run.device": "cpu",
            "task.name": "digits",
        },
    )


def test_checkpoint_from_another_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = with_overrides(_cli_config(tmp_path), {"run.n_envs": 3, "ppo.lr": 1e-3})
    ckpt = _checkpoint_for(tmp_path, other)
    args = _small_args(tmp_path, "--resume", str(ckpt))
    _assert_one_error(
        *_cli(capsys, args), str(ckpt), "another configuration", "$.run.n_envs", "$.ppo.lr"
    )
    assert not (tmp_path / "tel").exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "not-a-checkpoint"])
def test_damaged_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    import torch

    ckpt = _checkpoint_for(tmp_path, _cli_config(tmp_path))
    raw = ckpt.read_bytes()
    if damage == "truncated":
        ckpt.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        ckpt.write_bytes(random.Random(0).randbytes(4096))  # the same bytes every run
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:
        torch.save({"weight": torch.zeros(3)}, ckpt)
    args = _small_args(tmp_path, "--resume", str(ckpt))
    needle = "not an esper checkpoint" if damage == "not-a-checkpoint" else "corrupt"
    _assert_one_error(*_cli(capsys, args), str(ckpt), needle)


def test_no_single_flipped_byte_resumes_a_different_run(tmp_path: Path) -> None:
    """A flip anywhere is refused, or loads exactly the saved state (padding bytes).

    torch's zip reader does not verify tensor data; the checkpoint's own SHA-256 does.
    """
    import torch

    from esper.errors import CheckpointError
    from esper.training.loop.checkpoint import load_checkpoint

    cfg = _cli_config(tmp_path)
    weights = {"w": torch.arange(4096, dtype=torch.float32)}
    ckpt = _checkpoint_for(tmp_path, cfg, learner=weights)
    original = load_checkpoint(ckpt, cfg)
    raw = ckpt.read_bytes()
    step = max(1, len(raw) // FLIP_POSITIONS)
    loaded_intact = 0
    for position in range(0, len(raw), step):
        damaged = bytearray(raw)
        damaged[position] ^= 0xFF
        ckpt.write_bytes(bytes(damaged))
        try:
            state = load_checkpoint(ckpt, cfg)
        except CheckpointError as exc:
            assert str(ckpt) in str(exc)
            continue
        loaded_intact += 1
        assert torch.equal(state["learner"]["w"], original["learner"]["w"]), position
        assert {k: v for k, v in state.items() if k != "learner"} == {
            k: v for k, v in original.items() if k != "learner"
        }
    assert loaded_intact < len(range(0, len(raw), step)) // 2  # most flips are caught


def test_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _small_args(tmp_path, "--resume", str(tmp_path / "nope.pt"))
    _assert_one_error(*_cli(capsys, args), "checkpoint not found", "nope.pt")


# --- the analysis layer -----------------------------------------------------------------


def _finished_run(tmp: Path, run_id: str = "done") -> Path:
    """A small, cleanly closed run written by the real telemetry hub (no torch)."""
    with open_run(tmp, run_id, level=TelemetryLevel.NORMAL, flush_interval_s=0.05) as hub:
        for rnd in range(2):
            hub.emit(
                ev.RoundStarted(round=rnd, n_envs=1, episode_length=3, entropy_coef=0.05, lr=3e-4)
            )
            for step in range(3):
                hub.emit(
                    ev.EnvStep(
                        round=rnd,
                        env=0,
                        step=step,
                        train_loss=1.0,
                        train_acc=50.0,
                        val_loss=1.0,
                        val_acc=50.0,
                        active_seeds=0,
                        host_params=100,
                        seed_params=0,
                        train_ms=1.0,
                        val_ms=1.0,
                        features_ms=1.0,
                        policy_ms=1.0,
                    )
                )
    return tmp / run_id


def test_corrupt_parquet_footer(tmp_path: Path) -> None:
    run_dir = _finished_run(tmp_path)
    part = next((run_dir / "events" / "type=env_step").rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:200])
    proc = run_esper(["analyze", "counts", str(run_dir)])
    assert_user_error(proc, "corrupt parquet", str(part.relative_to(tmp_path)))


def test_corrupt_parquet_data_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _finished_run(tmp_path)
    part = next((run_dir / "events" / "type=env_step").rglob("*.parquet"))
    raw = bytearray(part.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little") + 8  # footer, its length, "PAR1"
    raw[4 : len(raw) - footer] = bytes(len(raw) - footer - 4)  # every data page zeroed
    part.write_bytes(bytes(raw))
    proc = in_process(["analyze", "throughput", str(run_dir)], capsys)
    assert_user_error(proc, "corrupt parquet", "env_step")


def test_corrupt_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _finished_run(tmp_path)
    (run_dir / "manifest.json").write_text('{"run_id": "done", "status": ')
    proc = in_process(["analyze", "counts", str(run_dir)], capsys)
    assert_user_error(proc, "manifest", "manifest.json")


def test_run_directory_from_a_newer_schema_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _finished_run(tmp_path)
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text())
    data["schema_version"] = NEWER
    path.write_text(json.dumps(data))
    proc = in_process(["analyze", "counts", str(run_dir)], capsys)
    assert_user_error(proc, f"schema version {NEWER}", "upgrade")


def test_part_file_from_a_newer_schema_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _finished_run(tmp_path)
    part = next((run_dir / "events" / "type=round_started").rglob("*.parquet"))
    table = pq.read_table(part)
    meta = dict(table.schema.metadata or {})
    meta[b"esper.schema_version"] = str(NEWER).encode()
    pq.write_table(table.replace_schema_metadata(meta), part)
    proc = in_process(["analyze", "rewards", str(run_dir)], capsys)
    assert_user_error(proc, f"schema version {NEWER}", part.name)


def test_missing_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = in_process(["analyze", "counts", str(tmp_path / "nope")], capsys)
    assert_user_error(proc, "does not exist", "nope")


def test_not_a_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "stuff").mkdir()
    args = ["analyze", "report", str(tmp_path / "stuff"), "-o", str(tmp_path / "r")]
    proc = in_process(args, capsys)
    assert_user_error(proc, "not a run directory")


def test_telemetry_survives_a_foreign_table_in_a_crashed_run(tmp_path: Path) -> None:
    """A crashed run is read tolerantly: an unreadable part is skipped and reported."""
    run_dir = _finished_run(tmp_path)
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text())
    data.update(status=RunStatus.RUNNING.value, pid=2**22 + 7, heartbeat_ns=0)
    path.write_text(json.dumps(data))
    bad = run_dir / "events" / "type=env_step" / "rank=0" / "part-999999.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    foreign = run_dir / "events" / "type=zzz_unknown" / "rank=0" / "part-000000.parquet"
    foreign.parent.mkdir(parents=True)
    pq.write_table(pa.table({"seq": ["x"]}), foreign)
    proc = run_esper(["analyze", "counts", str(run_dir), "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["run"]["status"] == "crashed"
    skipped = out["run"]["recovery"]["files_skipped"]
    assert [s["path"] for s in skipped] == ["events/type=env_step/rank=0/part-999999.parquet"]
    assert "zzz_unknown" in proc.stderr  # named in a warning, then ignored
    assert "Traceback" not in proc.stderr


def test_checkpoint_with_a_policy_state_that_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _checkpoint_for(tmp_path, _cli_config(tmp_path), learner={"policy": {}})
    # --rounds 2: a round is left after the checkpoint's next round (1) to run.
    args = _small_args(tmp_path, "--resume", str(ckpt), "--rounds", "2")
    _assert_one_error(*_cli(capsys, args), str(ckpt), "does not fit this configuration")
    assert not (tmp_path / "tel").exists()
