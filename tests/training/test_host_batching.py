"""The batched host path (``run.batch_envs``) against the per-env path, on CPU.

Two identical sets of envs get the same lifecycle script (germinations in the same and
in different slots, blends at different alphas, a prune, a rollback); one set trains
per env, the other with same-structure envs stacked. After every epoch parameters,
buffers, momentum, train sums and gradient norms must agree up to float summation
order, a NaN loss in one env must leave the others of its group untouched, and the
batched validation pass must give the fused per-env pass's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from _machinery import machinery_config

from esper.config import Config, with_overrides
from esper.core.enums import (
    AmpMode,
    GerminationStyle,
    Initiator,
    PruneReason,
    RollbackReason,
    SeedStage,
    TelemetryLevel,
)
from esper.data.iterator import SharedBatchIterator, val_batches
from esper.data.tasks import TaskData, load_task
from esper.telemetry.events import event_tag
from esper.telemetry.memory_hub import MemoryHub
from esper.training.envs.action_execution import sync_seed_optimizers
from esper.training.envs.env_factory import EnvFactory
from esper.training.envs.env_state import EnvState
from esper.training.loop.faults import Fault, FaultKind, FaultPlan
from esper.training.passes.batch_ops import PassOptions, train_epoch, validate_fused
from esper.training.passes.host_batching import (
    Batch,
    round_stores,
    train_epoch_batched,
    validate_batched,
    widest_activation,
)
from esper.training.passes.host_store import HostStore
from esper.training.passes.slot_groups import HostBatch
from esper.training.run import train

N_ENVS = 4
SAMPLES_PER_ENV = 96
BATCH = 32
TOL = {"atol": 1e-5, "rtol": 1e-4}
#: A clip small enough to be active, so per-env clip coefficients are compared too.
OPTS = PassOptions(amp=AmpMode.OFF, channels_last=False, grad_clip=0.1)
#: Event fields that differ between identical runs (clocks; the reward normaliser's
#: running std, shared by all envs by design, in ``normalized``).
VOLATILE = {"ts_ns", "run_id", "seq", "normalized"} | {
    f"{phase}_ms" for phase in ("train", "val", "features", "policy", "action", "ppo")
}
#: A healthy [seed, host] gradient norm per slot, so G2's gradient check passes.
HEALTHY_NORM = 0.5


@pytest.fixture(scope="module")
def digits() -> tuple[Config, TaskData]:
    cfg = machinery_config({"run.n_envs": N_ENVS, "task.name": "digits"})
    return cfg, load_task(cfg.task, seed=0)


def _envs(digits: tuple[Config, TaskData], dtype: torch.dtype = torch.float32) -> list[EnvState]:
    cfg, data = digits
    envs = EnvFactory(cfg, data.spec).create_round(0)
    for env in envs:
        env.model.to(dtype)  # seeds are built in the host's dtype
    return envs


def _epoch(it: SharedBatchIterator, epoch: int, dtype: torch.dtype) -> list[list[Batch]]:
    return [[(x.to(dtype), y) for x, y in per_env] for per_env in it.epoch(epoch)]


def _stacked(it: SharedBatchIterator, epoch: int, dtype: torch.dtype) -> list[Batch]:
    return [(x.to(dtype), y) for x, y in it.epoch_stacked(epoch)]


def _iterator(data: TaskData) -> SharedBatchIterator:
    return SharedBatchIterator(
        data.train_x,
        data.train_y,
        n_envs=N_ENVS,
        batch_size=BATCH,
        seed=0,
        samples_per_env=SAMPLES_PER_ENV,
    )


def _germinate(env: EnvState, slot: str, blueprint: str, tempo: int) -> None:
    assert env.model.germinate(
        slot,
        blueprint,
        GerminationStyle.LINEAR_ADD,
        tempo,
        1.0,
        seed_id=env.next_seed_id(),
        current_acc=50.0,
        initiator=Initiator.POLICY,
    )
    sync_seed_optimizers(env)


def _drive(env: EnvState, slot: str, stage: SeedStage) -> None:
    """Through the gates to ``stage``, ticking with healthy gradients where a gate waits."""
    model = env.model
    for step in range(50):
        if model.slot(slot).stage == stage:
            return
        if not model.advance(slot, initiator=Initiator.POLICY):
            model.apply_grad_norms([HEALTHY_NORM] * (2 * len(model.slot_ids)))
            model.tick(50.0 + step)
    raise AssertionError(f"{slot} did not reach {stage}")


def _rollback(env: EnvState) -> None:
    env.governor.rollback(
        0,
        env.model,
        reason=RollbackReason.NON_FINITE_LOSS,
        loss=float("nan"),
        threshold=0.0,
        clear_optimizers=env.clear_optimizers,
        transitions_affected=0,
    )
    sync_seed_optimizers(env)


def _script(envs: list[EnvState], epoch: int) -> None:
    """The lifecycle operations before ``epoch`` (applied to both sets alike)."""
    s0, s1 = envs[0].model.slot_ids[:2]
    if epoch == 1:
        _germinate(envs[0], s0, "conv_heavy", tempo=2)
        _germinate(envs[1], s0, "conv_heavy", tempo=4)
        _germinate(envs[2], s1, "conv_light", tempo=2)
        for env in envs[:2]:
            _drive(env, s0, SeedStage.TRAINING)
    if epoch == 2:
        for env in envs[:2]:
            _drive(env, s0, SeedStage.BLENDING)
            env.model.tick(60.0)  # mid-ramp: env 0 at alpha 1/2, env 1 at 1/4
    if epoch == 3:
        assert envs[2].model.prune(s1, reason=PruneReason.POLICY, initiator=Initiator.POLICY)
        sync_seed_optimizers(envs[2])
        _rollback(envs[3])


def _state(env: EnvState, results: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An env's parameters, buffers, momentum and its row of a pass's results."""
    if env.store is not None:
        env.store.expose_momentum()  # the batched path's momentum, as per-env state
    out = {f"p.{n}": p.detach() for n, p in env.model.named_parameters()}
    out |= {f"b.{n}": b.float() for n, b in env.model.named_buffers()}
    for opt in (env.host_optimizer, *env.seed_optimizers.values()):
        for p, state in opt.state.items():
            out[f"m.{_name(env, p)}"] = state["momentum_buffer"]
    accum, norms = results
    out["accum"] = accum[env.row]
    out["grad_norms"] = norms[env.row]
    return out


def _name(env: EnvState, param: torch.Tensor) -> str:
    return next(n for n, p in env.model.named_parameters() if p is param)


Results = tuple[torch.Tensor, torch.Tensor]


def _assert_close(
    a: list[EnvState], b: list[EnvState], epoch: int, ra: Results, rb: Results
) -> None:
    for ea, eb in zip(a, b, strict=True):
        sa, sb = _state(ea, ra), _state(eb, rb)
        assert sa.keys() == sb.keys(), (epoch, ea.index)
        for key in sa:
            assert torch.allclose(sa[key], sb[key], **TOL), (epoch, ea.index, key)


def _store(envs: list[EnvState]) -> HostStore:
    stores = round_stores(envs)
    assert stores is not None and len(stores) == 1
    return stores[0]


def _kinds(envs: list[EnvState]) -> dict[str, list[int]]:
    """Per slot, the sizes of the seed kinds one batch would run (empty: passes through)."""
    batch = HostBatch(_store(envs))
    return {slot: [len(k.rows) for k in kinds] for slot, kinds in batch.kinds.items() if kinds}


def _run_both(
    digits: tuple[Config, TaskData],
    epochs: int,
    script: Callable[[list[EnvState], int], None],
    nan_at: dict[int, frozenset[int]] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[list[EnvState], list[EnvState], list[dict[str, list[int]]]]:
    per_env, batched = _envs(digits, dtype), _envs(digits, dtype)
    it = _iterator(digits[1])
    groups: list[dict[str, list[int]]] = []
    for epoch in range(epochs):
        script(per_env, epoch)
        script(batched, epoch)
        nan_envs = (nan_at or {}).get(epoch, frozenset())
        ra = train_epoch(per_env, _epoch(it, epoch, dtype), OPTS, nan_envs=nan_envs)
        rb = train_epoch_batched(batched, _stacked(it, epoch, dtype), OPTS, nan_envs=nan_envs)
        groups.append(_kinds(batched))
        if not nan_at:
            _assert_close(per_env, batched, epoch, ra, rb)
    return per_env, batched, groups


def test_batched_epochs_match_the_per_env_path(digits) -> None:
    _, batched, groups = _run_both(digits, 5, _script)
    # All four hosts train as one batch every epoch. Slot r0c0 runs one seed kind for
    # envs 0 and 1 (TRAINING, then BLENDING at different alphas); env 2's GERMINATED
    # seed in r1c0 passes through until it is pruned.
    s0 = batched[0].model.slot_ids[0]
    assert groups == [{}, {s0: [2]}, {s0: [2]}, {s0: [2]}, {s0: [2]}]
    assert [e.model.slot(e.model.slot_ids[0]).alpha.alpha for e in batched[:2]] == [0.5, 0.25]


def test_a_nan_loss_poisons_only_its_own_env(digits) -> None:
    def nothing(_envs: list[EnvState], _epoch: int) -> None:
        pass

    per_env, batched, groups = _run_both(digits, 2, nothing, nan_at={1: frozenset({1})})
    assert groups == [{}, {}]
    for ea, eb in zip(per_env, batched, strict=True):
        params = list(eb.model.parameters())
        if ea.index == 1:
            assert all(torch.isnan(p).all() for p in params)
            continue
        assert all(torch.isfinite(p).all() for p in params)
        for pa, pb in zip(ea.model.parameters(), params, strict=True):
            assert torch.allclose(pa, pb, **TOL)


def test_an_unbatchable_round_runs_per_env(digits) -> None:
    """A round whose hosts cannot be stacked (here a GradScaler, as fp16 gives every env)
    has no stores: the batched passes run the per-env ones, with the same results."""
    envs, alone = _envs(digits), _envs(digits)
    for env in envs:
        env.scaler = torch.amp.GradScaler("cpu")  # type: ignore[attr-defined]
    assert round_stores(envs) is None
    for env in alone:
        env.scaler = torch.amp.GradScaler("cpu")  # type: ignore[attr-defined]
    it = _iterator(digits[1])
    ra = train_epoch(alone, _epoch(it, 0, torch.float32), OPTS)
    rb = train_epoch_batched(envs, _stacked(it, 0, torch.float32), OPTS)
    for a, b in zip(ra, rb, strict=True):
        assert torch.equal(a, b)


def test_family_members_batch_in_groups_of_their_own() -> None:
    """Envs of one host shape share a store; another member's envs get their own."""
    from _family_support import family_config

    cfg = with_overrides(family_config(), {"run.n_envs": 6})
    data = load_task(cfg.task, seed=0)
    envs = EnvFactory(cfg, data.spec).create_round(0)
    stores = round_stores(envs)
    assert stores is not None
    members = [{e.host.name for e in store.envs if e.host is not None} for store in stores]
    assert all(len(m) == 1 for m in members) and len(stores) == len({e.host for e in envs})
    assert sorted(int(r) for store in stores for r in store.rows) == list(range(6))


@pytest.mark.parametrize("family", [False, True], ids=["one-host", "family"])
def test_a_stacked_round_renews_the_last_rounds_models_as_fresh_ones(digits, family) -> None:
    """A stacked round reuses the modules of the last one (per host member); renewed,
    each is exactly the model a fresh factory builds for that round: host values and
    buffers, no seeds, default slot state, and the same next seed."""
    from _family_support import family_config

    from esper.model.slot_table import COLUMNS

    cfg, data = digits
    if family:
        cfg = with_overrides(family_config(), {"run.n_envs": 6})
        data = load_task(cfg.task, seed=0)
    reused = EnvFactory(cfg, data.spec)
    before = reused.create_round(0, stacked=True)
    slot = before[0].model.slot_ids[0]
    _germinate(before[0], slot, "conv_heavy", 3)
    _drive(before[0], slot, SeedStage.TRAINING)
    after = reused.create_round(1, stacked=True)
    fresh = EnvFactory(cfg, data.spec).create_round(1, stacked=True)
    kept = {id(e.model) for e in before}
    assert any(id(e.model) in kept for e in after)
    if not family:  # one member: every model is reused
        assert all(id(e.model) in kept for e in after)
    for env, ref in zip(after, fresh, strict=True):
        mine, theirs = env.model.state_dict(), ref.model.state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        slots = env.model.slots_in_order
        assert all(s.seed is None and s.stage == SeedStage.DORMANT for s in slots)
        assert env.model.training and env.model.row == ref.model.row
    for name in COLUMNS:
        mine_c, theirs_c = getattr(after[0].table.slots, name), getattr(fresh[0].table.slots, name)
        assert np.array_equal(mine_c, theirs_c, equal_nan=mine_c.dtype.kind == "f"), name
    for env in (after[0], fresh[0]):
        _germinate(env, slot, "conv_heavy", 3)
    grown = [e.model.slot(slot).seed.state_dict() for e in (after[0], fresh[0])]
    assert all(torch.equal(grown[0][k], grown[1][k]) for k in grown[0])


def test_batched_runs_are_deterministic(digits) -> None:
    it = _iterator(digits[1])
    runs = []
    for _ in range(2):
        envs = _envs(digits)
        for epoch in range(3):
            _script(envs, epoch)
            results = train_epoch_batched(envs, _stacked(it, epoch, torch.float32), OPTS)
        runs.append([_state(e, results) for e in envs])
    for a, b in zip(*runs, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_batched_run_rolls_back_only_the_faulty_env(tmp_path: Path, digits) -> None:
    """End to end (``run.batch_envs``): a NaN in env 1 rolls back env 1 alone, and the
    other envs' transitions equal those of the clean batched run."""
    cfg = with_overrides(
        digits[0],
        {
            "run.n_envs": 3,
            "run.rounds": 1,
            "run.episode_length": 5,
            "run.batch_envs": True,
            "task.train_samples_per_env": 192,
            "task.val_samples": 192,
            "policy.feature_dim": 32,
            "policy.lstm_hidden": 32,
            "telemetry.dir": str(tmp_path),
        },
    )
    kinds = {"action_taken", "reward_computed", "env_step", "counterfactual_computed"}
    runs = []
    for name, faults in (("clean", FaultPlan()), ("nan", _nan_fault())):
        hub = MemoryHub(run_id=name, level=TelemetryLevel.NORMAL)
        result = train(cfg, data=digits[1], telemetry=hub, faults=faults, save=tmp_path / name)
        runs.append((result, hub))
    (clean, clean_hub), (faulty, hub) = runs
    assert (clean.rollbacks, faulty.rollbacks) == (0, 1)

    def per_env(events: MemoryHub, env: int) -> list[bytes]:
        """The env's events as JSON (NaN as null: a NaN equals a NaN)."""
        out = []
        for e in events.events:
            d = msgspec.to_builtins(e)
            if event_tag(type(e)) in kinds and d["env"] == env:
                out.append(msgspec.json.encode({k: v for k, v in d.items() if k not in VOLATILE}))
        return out

    for env in (0, 2):
        assert per_env(clean_hub, env) == per_env(hub, env)
    assert per_env(clean_hub, 1) != per_env(hub, 1)


def _nan_fault() -> FaultPlan:
    return FaultPlan([Fault(kind=FaultKind.NAN, round=0, step=3, env=1)])


def test_batched_validation_matches_the_fused_per_env_pass(digits) -> None:
    """Every env's K counterfactual configurations (real, leave-one-out, all-off), with
    blending seeds at different alphas in one group, match ``validate_fused``."""
    envs = _envs(digits)
    it = _iterator(digits[1])
    for epoch in range(3):
        _script(envs, epoch)
        train_epoch_batched(envs, _stacked(it, epoch, torch.float32), OPTS)
    s0 = envs[0].model.slot_ids[0]
    assert [e.model.slot(s0).stage for e in envs[:2]] == [SeedStage.BLENDING] * 2
    off = torch.zeros(len(envs[0].model.slot_ids))
    alphas = [
        torch.stack([e.model.current_alphas(), off]) if i < 2 else None for i, e in enumerate(envs)
    ]
    data = digits[1]
    val = val_batches(data.val_x, data.val_y, 128, limit=300)
    configs, first = _flat(envs, alphas)
    fused = validate_fused(envs, val, configs, first, OPTS)
    batched = validate_batched(envs, val, configs, first, OPTS)
    # One row per (env, configuration): no padding.
    assert batched[1].shape == (2 + 2 + 1 + 1,)
    for a, b in zip(fused, batched, strict=True):
        assert torch.allclose(a, b, atol=1e-3, rtol=1e-5), (a, b)


def test_validation_past_its_element_budget_runs_in_chunks_of_samples(digits, monkeypatch) -> None:
    """Rows x samples x the widest layer over ``max_elements``: each validation batch
    runs in pieces (here of 7 samples: 128 is no multiple of it), with the results of
    one piece (counts exact, loss sums to float order)."""
    envs = _envs(digits)
    it = _iterator(digits[1])
    for epoch in range(2):
        _script(envs, epoch)
        train_epoch_batched(envs, _stacked(it, epoch, torch.float32), OPTS)
    off = torch.zeros(len(envs[0].model.slot_ids))
    configs, first = _flat(envs, [torch.stack([e.model.current_alphas(), off]) for e in envs])
    data = digits[1]
    val = val_batches(data.val_x, data.val_y, 128, limit=300)  # 128 + 128 + 44 samples
    # No validation data (before any): nothing to measure or chunk, the per-env zeros.
    for a, b in zip(validate_batched(envs, [], configs, first, OPTS),
                    validate_fused(envs, [], configs, first, OPTS), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert _store(envs).widest is None
    whole = validate_batched(envs, val, configs, first, OPTS)
    widest = _store(envs).widest
    assert widest is not None and widest >= val[0][0][0].numel()
    forwards: list[int] = []
    original = HostBatch.forward

    def counted(self: HostBatch, x: torch.Tensor, host: torch.Tensor | None = None) -> torch.Tensor:
        forwards.append(x.shape[1])
        return original(self, x, host)

    monkeypatch.setattr(HostBatch, "forward", counted)
    chunked = validate_batched(
        envs, val, configs, first, OPTS, max_elements=len(configs) * widest * 7
    )
    assert forwards == [7] * 18 + [2] + [7] * 18 + [2] + [7] * 6 + [2]
    torch.testing.assert_close(chunked[0][:, 1], whole[0][:, 1], rtol=0, atol=0)  # counts
    torch.testing.assert_close(chunked[1], whole[1], rtol=0, atol=0)  # correct per row
    torch.testing.assert_close(chunked[0][:, 0], whole[0][:, 0], rtol=1e-5, atol=1e-3)


def test_widest_activation_is_the_largest_output_of_any_module() -> None:
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10),
    )  # fmt: skip
    assert widest_activation(net, torch.zeros(1, 3, 8, 8)) == 8 * 8 * 8
    assert not any(m._forward_hooks for m in net.modules())  # the hooks are removed


def _flat(envs: list[EnvState], alphas: list[torch.Tensor | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per-env configurations (None: its current alphas) as the passes' flat rows."""
    rows = [
        (a if a is not None else e.model.current_alphas()[None]).numpy()
        for e, a in zip(envs, alphas, strict=True)
    ]
    first = np.cumsum([0] + [len(r) for r in rows[:-1]])
    return np.concatenate(rows), first


def _eval_batch(envs: list[EnvState], alphas: np.ndarray | None = None) -> HostBatch:
    members = None if alphas is None else np.repeat(np.arange(len(envs)), len(alphas) // len(envs))
    batch = HostBatch(_store(envs), train=False, members=members, alphas=alphas)
    batch.set_modes()
    return batch


def test_validation_batches_envs_whose_seeds_differ(digits) -> None:
    """Envs with different seeds in a slot (two blueprints blending at different alphas,
    a TRAINING seed elsewhere, no seed at all) validate as one batch, per slot, and
    match ``validate_fused`` for every configuration."""
    envs = _envs(digits)
    s0, s1 = envs[0].model.slot_ids[:2]
    for env, slot, blueprint, tempo in (
        (envs[0], s0, "conv_heavy", 2),
        (envs[1], s0, "conv_light", 4),
        (envs[2], s1, "conv_heavy", 2),
    ):
        _germinate(env, slot, blueprint, tempo)
    for env in envs[:2]:
        _drive(env, s0, SeedStage.BLENDING)
        env.model.tick(60.0)  # mid-ramp: alpha 1/2 and 1/4
    _drive(envs[2], s1, SeedStage.TRAINING)
    train_epoch_batched(envs, _stacked(_iterator(digits[1]), 0, torch.float32), OPTS)
    assert len(round_stores(envs) or []) == 1  # one batch, though no two structures match
    for env in envs:
        env.model.eval()
    # Per slot, the blended seed kinds the batch runs; the TRAINING seed passes through.
    kinds = _eval_batch(envs).kinds
    assert {slot: len(k) for slot, k in kinds.items() if k} == {s0: 2}
    off = torch.zeros(len(envs[0].model.slot_ids))
    alphas: list[torch.Tensor | None] = [
        torch.stack([e.model.current_alphas(), off, off + 1.0]) for e in envs
    ]
    data = digits[1]
    val = val_batches(data.val_x, data.val_y, 128, limit=300)
    configs, first = _flat(envs, alphas)
    fused = validate_fused(envs, val, configs, first, OPTS)
    batched = validate_batched(envs, val, configs, first, OPTS)
    assert batched[1].shape == (3 * N_ENVS,)
    for a, b in zip(fused, batched, strict=True):
        assert torch.allclose(a, b, atol=1e-3, rtol=1e-5), (a, b)
    # The correct-counts are coarse: compare the logits too, per env and configuration,
    # and check the blending envs' configurations really change them.
    x = val[0][0]
    rows = torch.cat([a for a in alphas if a is not None])  # [N * 3, n_slots]
    with torch.no_grad():
        logits = _eval_batch(envs, rows.numpy()).forward(x.expand(len(rows), *x.shape))
        for r, alpha in enumerate(rows):
            assert torch.allclose(logits[r], envs[r // 3].model(x, alpha), **TOL), r
    # (env 1's light seed starts near zero output, so only env 0's is checked here)
    _, none, full = logits[:3]
    assert not torch.allclose(none, full, **TOL)


def test_one_seed_kind_in_every_env_matches_the_per_env_path(digits) -> None:
    """A slot where every env runs the same seed kind (at different alphas) skips the
    gather and scatter, and still matches the per-env path. In float64: in float32 the
    freshly blended seeds' last-layer gradients (about 1e-3, summed over a batch with
    cancellation) differ by up to 2 % between the two paths' summation orders; in float64
    below 1e-7, so a tight comparison still catches a wrong alpha or row."""

    def all_grow(envs: list[EnvState], epoch: int) -> None:
        if epoch == 1:
            for i, env in enumerate(envs):
                _germinate(env, env.model.slot_ids[0], "conv_heavy", tempo=2 + 2 * (i % 2))
                _drive(env, env.model.slot_ids[0], SeedStage.BLENDING)
                env.model.tick(60.0)  # alpha 1/2 or 1/4

    _, batched, groups = _run_both(digits, 3, all_grow, dtype=torch.float64)
    s0 = batched[0].model.slot_ids[0]
    assert groups == [{}, {s0: [N_ENVS]}, {s0: [N_ENVS]}]
    assert {e.model.slot(s0).alpha.alpha for e in batched} == {0.5, 0.25}


def test_several_seed_kinds_at_one_slot_train_as_the_per_env_path(digits) -> None:
    """One slot holding three seed kinds (two blueprints blending, one TRAINING, later
    one of them frozen by a scheduled prune) and rows that pass through (a GERMINATED
    seed, no seed): the kinds' seed tensors are gathered with one index, the slot's rows
    regrouped with one, the gradients put back and only the stepping seeds stepped,
    exactly as each env alone (float64, as above); kinds come in order of their first
    row."""

    def mixed(envs: list[EnvState], epoch: int) -> None:
        s0 = envs[0].model.slot_ids[0]
        if epoch == 1:
            blueprints = ("conv_light", "conv_heavy", "conv_light")
            for env, blueprint in zip(envs[1:], blueprints, strict=True):
                _germinate(env, s0, blueprint, tempo=2)
            _drive(envs[1], s0, SeedStage.BLENDING)
            _drive(envs[2], s0, SeedStage.TRAINING)
        if epoch == 2:
            _drive(envs[2], s0, SeedStage.BLENDING)
            _drive(envs[3], s0, SeedStage.TRAINING)
            envs[1].model.tick(60.0)  # alpha 1/2: env 1's seed learns, gains momentum
        if epoch == 3:  # env 1's seed ramps out, frozen: in the forward, not stepping
            while not envs[1].model.slot(s0).alpha.at_rest:
                envs[1].model.tick(60.0)
            assert envs[1].model.prune(
                s0, speed=4, reason=PruneReason.POLICY, initiator=Initiator.POLICY
            )

    _, batched, groups = _run_both(digits, 5, mixed, dtype=torch.float64)
    s0 = batched[0].model.slot_ids[0]
    # Epoch 1: env 1 blends, env 2 trains, env 3 is GERMINATED, env 0 has no seed.
    # Epoch 2 on: envs 1 and 2 blend different blueprints, env 3 trains.
    assert groups == [{}, {s0: [1, 1]}, *[{s0: [1, 1, 1]}] * 3]
    assert batched[1].model.slot(s0).life.scheduled_prune


def test_each_pass_runs_its_own_templates_in_its_own_mode(digits) -> None:
    """Training runs the first env's modules, evaluation the last's, so each keeps its
    mode between passes; every module a pass runs is in that pass's mode, and a seed
    germinated into a slot in eval mode starts in eval mode too."""
    envs = _envs(digits)
    s0, s1 = envs[0].model.slot_ids[:2]
    for env in (envs[0], envs[-1]):
        _germinate(env, s0, "conv_heavy", 2)
        _drive(env, s0, SeedStage.BLENDING)
    store = _store(envs)

    def modules(batch: HostBatch) -> list[torch.nn.Module]:
        kinds = [k.module for ks in batch.kinds.values() for k in ks]
        assert kinds, "the blending seeds run in both passes"
        return [m for root in (batch.template.host, *kinds) for m in root.modules()]

    for _ in range(2):
        train_batch, eval_batch = HostBatch(store), HostBatch(store, train=False)
        train_batch.set_modes()
        eval_batch.set_modes()
        assert all(m.training for m in modules(train_batch))
        assert not any(m.training for m in modules(eval_batch))
    assert train_batch.template is envs[0].model and eval_batch.template is envs[-1].model
    envs[-1].model.eval()
    _germinate(envs[-1], s1, "conv_light", 2)
    assert not any(m.training for m in envs[-1].model.slot(s1).modules())
