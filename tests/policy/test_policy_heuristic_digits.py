"""End to end: the heuristic grows seeds on the digits task through the model API.

A real (small) host trains for real; contributions are measured by the counterfactual
the trainer uses (accuracy with the seed's alpha forced to 0), so fossilize-or-prune is
decided by the seed's actual effect. Deterministic: two runs give the same decisions.
"""

from __future__ import annotations

import msgspec
import torch
import torch.nn.functional as F
from _machinery import machinery_config

from esper.config import PolicyConfig, TaskConfig
from esper.core.constants import HOST_LR, HOST_MOMENTUM, HOST_WEIGHT_DECAY, SEED_LR
from esper.core.enums import Initiator, LifecycleOp, PruneReason, SeedStage
from esper.data.tasks import TaskData, load_task
from esper.model import MorphogeneticModel, build_model
from esper.policy.actions import ActionSpace, DecodedAction, decode_action
from esper.policy.features import build_features
from esper.policy.heuristic import HeuristicPolicy
from esper.policy.masks import compute_masks
from esper.policy.protocol import PolicyInput
from esper.policy.signals import SignalTracker

MAX_EPOCHS = 50
BATCH = 64
#: The 16-channel CNN host of the whole action space; learns digits in a few epochs.
HOST = msgspec.structs.replace(machinery_config().host, max_seeds=2)
BLENDED = (SeedStage.BLENDING, SeedStage.HOLDING, SeedStage.FOSSILIZED)


def execute(model: MorphogeneticModel, a: DecodedAction, seed_id: str, acc: float) -> bool:
    who = Initiator.HEURISTIC
    if a.op == LifecycleOp.WAIT:
        return True
    assert a.slot_id is not None
    if a.op == LifecycleOp.GERMINATE:
        assert a.blueprint is not None
        return model.germinate(
            a.slot_id,
            a.blueprint,
            a.style,
            a.tempo,
            a.alpha_target,
            seed_id=seed_id,
            current_acc=acc,
            initiator=who,
        )
    if a.op == LifecycleOp.ADVANCE:
        return model.advance(a.slot_id, initiator=who)
    if a.op == LifecycleOp.FOSSILIZE:
        return model.fossilize(a.slot_id, initiator=who)
    if a.op == LifecycleOp.PRUNE:
        return model.prune(
            a.slot_id,
            speed=a.alpha_speed,
            curve=a.alpha_curve,
            reason=PruneReason.POLICY,
            initiator=who,
        )
    return model.set_alpha_target(
        a.slot_id, a.alpha_target, a.alpha_speed, a.alpha_curve, initiator=who
    )


def train_epoch(model, data: TaskData, host_opt, seed_opts, gen: torch.Generator) -> None:
    model.train()
    order = torch.randperm(len(data.train_x), generator=gen)
    for i in range(0, len(order), BATCH):
        idx = order[i : i + BATCH]
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        host_opt.step()
        for opt in seed_opts.values():
            opt.step()
    model.apply_grad_norms(model.grad_norms())


@torch.no_grad()
def validate(model: MorphogeneticModel, data: TaskData) -> tuple[float, float]:
    """(val loss, val acc %), and each blended seed's measured contribution in pp."""
    model.eval()
    logits = model(data.val_x)
    acc = (logits.argmax(1) == data.val_y).float().mean().item() * 100
    alphas = model.current_alphas()
    for j, rep in enumerate(model.slot_reports()):
        if rep.stage in BLENDED and rep.alpha > 0:
            off = alphas.clone()
            off[j] = 0.0
            acc_off = (model(data.val_x, off).argmax(1) == data.val_y).float().mean().item() * 100
            model.record_contribution(rep.slot_id, acc - acc_off)
    return F.cross_entropy(logits, data.val_y).item(), acc


def run_episode(seed: int) -> list[tuple[int, LifecycleOp, str | None, bool]]:
    data = load_task(TaskConfig(), seed=0)
    model = build_model(HOST, data.spec, seed=seed)
    space = ActionSpace(model.slot_ids, model.topology)
    policy = HeuristicPolicy(space, PolicyConfig(plateau_patience=2))
    tracker = SignalTracker()
    host_opt = torch.optim.SGD(
        model.host_parameters(), lr=HOST_LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY
    )
    seed_opts: dict[str, torch.optim.Optimizer] = {}
    gen = torch.Generator().manual_seed(seed)
    hidden = policy.initial_hidden(1, "cpu")
    last_op, last_ok, log = 0, True, []
    for epoch in range(MAX_EPOCHS):
        train_epoch(model, data, host_opt, seed_opts, gen)
        val_loss, val_acc = validate(model, data)
        model.tick(val_acc)
        tracker.update(val_loss, val_acc)
        reports = [model.slot_reports()]
        obs, bp = build_features(
            trackers=[tracker],
            reports=reports,
            epoch=epoch,
            max_epochs=MAX_EPOCHS,
            last_ops=[last_op],
            last_success=[last_ok],
            device="cpu",
        )
        masks = compute_masks(reports, space, max_seeds=HOST.max_seeds, device="cpu")
        step = policy.act(PolicyInput(obs, bp, masks, reports, [tracker]), hidden)
        hidden = step.hidden
        action = decode_action(step.actions[0].tolist(), space)
        ok = execute(model, action, f"seed{epoch}", val_acc)
        for slot_id in model.slot_ids:  # one SGD per live seed
            params = model.seed_parameters(slot_id)
            if params and slot_id not in seed_opts:
                seed_opts[slot_id] = torch.optim.SGD(params, lr=SEED_LR)
            elif not params:
                seed_opts.pop(slot_id, None)
        last_op, last_ok = int(action.op), ok
        if action.op != LifecycleOp.WAIT:
            log.append((epoch, action.op, action.slot_id, ok))
        if ok and action.op in (LifecycleOp.FOSSILIZE, LifecycleOp.PRUNE):
            break
    return log


def test_heuristic_grows_and_resolves_a_seed_on_digits() -> None:
    log = run_episode(seed=0)
    executed = [op for _, op, _, ok in log if ok]
    assert executed[0] == LifecycleOp.GERMINATE, log
    # GERMINATED -> TRAINING -> BLENDING -> HOLDING, each through its gate.
    assert executed.count(LifecycleOp.ADVANCE) >= 3, log
    assert executed[-1] in (LifecycleOp.FOSSILIZE, LifecycleOp.PRUNE), log
    # The heuristic only acts when the gate can pass: no failed lifecycle calls.
    assert all(ok for *_, ok in log), log
    assert run_episode(seed=0) == log  # deterministic
