"""End-to-end learning: a CNN with a seed in every slot learns digits; the transformer
host overfits a tiny text. Both in a few seconds on a CPU."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from _model_support import TEXT_SPEC, TINY_TRANSFORMER, drive_to, germinate, host_config

from esper.config import TaskConfig
from esper.core.constants import HOST_LR, HOST_MOMENTUM, HOST_WEIGHT_DECAY, SEED_LR
from esper.core.enums import GerminationStyle, SeedStage
from esper.data.iterator import SharedBatchIterator, val_batches
from esper.data.tasks import load_task
from esper.data.text import windows
from esper.model import build_model

DIGITS_EPOCHS = 6
MIN_DIGITS_ACC = 85.0
CNN_PLAN = [
    ("conv_heavy", GerminationStyle.LINEAR_ADD, SeedStage.FOSSILIZED),
    ("attention", GerminationStyle.LINEAR_MULTIPLY, SeedStage.HOLDING),
    ("bottleneck", GerminationStyle.GATED_GATE, SeedStage.BLENDING),
    ("depthwise", GerminationStyle.SIGMOID_ADD, SeedStage.TRAINING),
    ("conv_light", GerminationStyle.LINEAR_ADD, SeedStage.BLENDING),
]


def _evaluate(model, batches) -> float:
    model.eval()
    correct = total = 0
    with torch.inference_mode():
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
            total += y.numel()
    return 100.0 * correct / total


def test_cnn_with_a_seed_in_every_slot_learns_digits() -> None:
    data = load_task(TaskConfig(), seed=0)
    model = build_model(host_config(max_seeds=5), data.spec, seed=0)
    for slot, (bp, style, stage) in zip(model.slot_ids, CNN_PLAN, strict=True):
        germinate(model, slot, bp, style, tempo=3)
        drive_to(model, slot, stage, acc=10.0)
    host_opt = torch.optim.SGD(
        model.host_parameters(), lr=HOST_LR, momentum=HOST_MOMENTUM, weight_decay=HOST_WEIGHT_DECAY
    )
    seed_opts = [
        torch.optim.SGD(model.seed_parameters(s), lr=SEED_LR, momentum=HOST_MOMENTUM)
        for s in model.slot_ids
    ]
    before = {s: [p.detach().clone() for p in model.seed_parameters(s)] for s in model.slot_ids}
    it = SharedBatchIterator(data.train_x, data.train_y, n_envs=1, batch_size=32, seed=0)
    val = val_batches(data.val_x, data.val_y, 256)
    acc = 0.0
    for epoch in range(DIGITS_EPOCHS):
        model.train()
        for [(x, y)] in it.epoch(epoch):
            loss = F.cross_entropy(model(x), y)
            for opt in (host_opt, *seed_opts):
                opt.zero_grad(set_to_none=True)
            loss.backward()
            norms = model.grad_norms()
            for opt in (host_opt, *seed_opts):
                opt.step()
        acc = _evaluate(model, val)
        model.apply_grad_norms(norms.reshape(-1))
        model.tick(acc)
    assert acc >= MIN_DIGITS_ACC, acc
    for slot in model.slot_ids:  # every seed trained (TRAINING ones through the STE)
        after = model.seed_parameters(slot)
        assert any(not torch.equal(a, b) for a, b in zip(after, before[slot], strict=True)), slot
        rep = model.slot_reports()[model.slot_ids.index(slot)]
        assert math.isfinite(rep.grad_health), slot


TINY_TEXT = (b"the quick brown fox jumps over the lazy dog. " * 3)[:128]
OVERFIT_STEPS = 150
MAX_OVERFIT_LOSS = 0.3


def test_transformer_host_overfits_a_tiny_text() -> None:
    seq = TEXT_SPEC.input_shape[0]
    x, y = windows(TINY_TEXT, seq, 4)
    model = build_model(TINY_TRANSFORMER, TEXT_SPEC, seed=0)
    germinate(model, model.slot_ids[0], "lora")
    drive_to(model, model.slot_ids[0], SeedStage.TRAINING)
    germinate(model, model.slot_ids[2], "mlp_small", GerminationStyle.GATED_GATE)
    drive_to(model, model.slot_ids[2], SeedStage.HOLDING)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    model.train()
    loss = torch.tensor(math.inf)
    for _ in range(OVERFIT_STEPS):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    final = float(loss.detach())
    assert final < MAX_OVERFIT_LOSS, final
