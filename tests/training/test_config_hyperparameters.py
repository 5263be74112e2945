"""Every training hyperparameter is reachable from Config, and the code reads it (issue 15).

Each test sets a non-default value and checks that the component really uses it; with
a module-level constant instead of the key, the value would be silently ignored.
"""

from __future__ import annotations

import math
import re

import msgspec
import pytest
import torch
from _machinery import machinery_config
from _reward_support import reward_inputs as _inputs
from msgspec.structs import replace

from esper.config import GovernorConfig, HostConfig, RewardConfig, TelemetryConfig
from esper.core.enums import AnomalyKind, LifecycleOp, SeedStage, TaskName, Topology
from esper.core.records import SlotReport
from esper.data.tasks import TaskSpec
from esper.model import build_model
from esper.telemetry.events import PpoUpdate
from esper.training.envs.env_state import make_host_optimizer, make_seed_optimizer
from esper.training.envs.governor import Governor
from esper.training.envs.rewards import compute_reward
from esper.training.learning.normalizers import RewardNormalizer
from esper.training.loop.anomaly import detect_anomalies

GAMMA = 0.99


def test_host_optimizer_settings_come_from_the_host_section() -> None:
    cfg = HostConfig(lr=0.05, momentum=0.5, weight_decay=0.0, seed_lr=0.2)
    spec = TaskSpec(
        name=TaskName.DIGITS,
        topology=Topology.CNN,
        input_shape=(1, 8, 8),
        num_classes=10,
        random_guess_loss=math.log(10),
    )
    model = build_model(HostConfig(base_channels=4), spec, seed=0)
    group = make_host_optimizer(model, cfg).param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.05, 0.5, 0.0)
    seed_group = make_seed_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg).param_groups[0]
    assert (seed_group["lr"], seed_group["momentum"]) == (0.2, 0.5)


@pytest.mark.parametrize(
    ("key", "value", "inputs", "component"),
    [
        ("germinate_cost", -0.7, {"op": LifecycleOp.GERMINATE, "executed": True}, "germinate_cost"),
        ("invalid_action_penalty", -0.4, {"op": LifecycleOp.PRUNE, "executed": False},
         "invalid_penalty"),
        ("alpha_shock_weight", 2.0, {"alpha_change": 0.75}, "alpha_shock"),
    ],
)  # fmt: skip
def test_reward_weights_come_from_the_reward_section(
    key: str, value: float, inputs: dict[str, object], component: str
) -> None:
    spec = machinery_config().reward  # the contribution family, with per-op shaping
    default = compute_reward(_inputs(**inputs), spec, gamma=GAMMA)
    custom = compute_reward(_inputs(**inputs), replace(spec, **{key: value}), gamma=GAMMA)
    assert getattr(custom, component) != getattr(default, component)
    if key == "alpha_shock_weight":
        assert custom.alpha_shock == pytest.approx(-2.0 * (0.75 - 0.25))
    else:
        assert getattr(custom, component) == value


def test_attribution_weights_come_from_the_reward_section() -> None:
    seed = SlotReport(slot_id="s0", stage=SeedStage.BLENDING, seed_id="x", alpha=1.0)
    inp = _inputs(slot_after=seed, contribution_pp=2.0, progress_pp=5.0)
    spec = machinery_config().reward
    br = compute_reward(inp, replace(spec, attribution_weight=0.5), gamma=GAMMA)
    assert br.attribution == pytest.approx(1.0)
    harm = _inputs(slot_after=seed, contribution_pp=-2.0, progress_pp=5.0)
    assert compute_reward(harm, replace(spec, harm_weight=1.0), gamma=GAMMA).attribution == -2.0


def test_reward_normaliser_clip_is_configurable() -> None:
    norm = RewardNormalizer(gamma=GAMMA, clip=RewardConfig(normalize_clip=0.5).normalize_clip)
    assert float(norm.normalize(torch.tensor([1e6])).abs().max()) == pytest.approx(0.5)


def test_governor_statistics_and_penalty_cap_come_from_the_governor_section() -> None:
    gov = Governor(
        GovernorConfig(penalty=-50.0, penalty_cap=20.0, history_window=4), random_guess_loss=2.3
    )
    assert gov.penalty == -20.0
    for loss in [1.0] * 10:
        gov.check(0, loss)
    assert len(gov.history) == 4
    late = Governor(GovernorConfig(min_history=8), random_guess_loss=2.3)
    for step, loss in enumerate([0.1, 0.1, 0.1, 0.1]):
        assert late.check(step, loss) is None
    # with 4 healthy losses far below random guessing, a loss back at it is a lobotomy
    # only once min_history checks have been seen
    assert late.check(4, 2.3) is None
    early = Governor(GovernorConfig(min_history=3), random_guess_loss=2.3)
    for step, loss in enumerate([0.1, 0.1, 0.1, 0.1]):
        early.check(step, loss)
    assert early.check(4, 2.3) is not None


def _metrics(**kw: float) -> PpoUpdate:
    """A healthy update (one value per field type), with ``kw`` overriding."""
    filler: dict[object, object] = {float: 0.5, int: 1, bool: False, str: ""}
    fields = {f.name: filler[f.type] for f in msgspec.structs.fields(PpoUpdate)}
    fields.update(explained_variance=0.5, approx_kl=0.001, ratio_max=1.1, entropy_op=1.0)
    fields.update(kw)
    return PpoUpdate(**fields)


def test_anomaly_thresholds_come_from_the_telemetry_section() -> None:
    m = _metrics(ratio_max=2.0)
    assert detect_anomalies(m, TelemetryConfig(), target_kl=0.015) == []
    found = detect_anomalies(m, TelemetryConfig(anomaly_ratio_max=1.5), target_kl=0.015)
    assert [a.kind for a in found] == [AnomalyKind.RATIO_EXPLOSION]


@pytest.mark.parametrize("tf32", [True, False])
def test_tf32_follows_the_config_on_cuda_and_is_left_alone_on_cpu(tf32: bool) -> None:
    from esper.config import Config, with_overrides
    from esper.training.loop.run_setup import configure_torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    threads = torch.get_num_threads()
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32
        configure_torch(with_overrides(Config(), {"run.tf32": tf32, "run.torch_threads": 0}))
        assert torch.backends.cuda.matmul.allow_tf32 is not tf32  # CPU run: untouched
        cuda = with_overrides(
            Config(), {"run.tf32": tf32, "run.device": "cuda", "run.torch_threads": 0}
        )
        configure_torch(cuda)  # sets flags only; needs no GPU
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("heuristic_blueprints", [], "at least one"),
        ("heuristic_blueprints", ["conv_heavy", "wide"], "heuristic_blueprints[1]: unknown"),
        ("heuristic_blueprints", ["norm", "norm"], "heuristic_blueprints[1]: 'norm' listed twice"),
        ("blueprints", ["conv_heavy", "wide"], "$.policy.blueprints[1]: unknown blueprint 'wide'"),
        ("blueprints", ["mlp", "mlp"], "$.policy.blueprints[1]: 'mlp' listed twice"),
        ("heuristic_tempo", 4, "heuristic_tempo: must be one of [3, 5, 8]"),
        ("heuristic_alpha_target", 0.6, "heuristic_alpha_target: must be one of"),
        ("alpha_targets", [1.0, 0.6], "$.policy.alpha_targets[1]: must be one of [0.5, 0.7, 1.0]"),
        ("alpha_targets", [0.7, 0.7], "$.policy.alpha_targets[1]: 0.7 listed twice"),
        ("alpha_targets", [0.5], "heuristic_alpha_target: 1.0 is not in policy.alpha_targets"),
        ("tempos", [5, 4], "$.policy.tempos[1]: must be one of [3, 5, 8], got 4"),
        ("tempos", [5, 5], "$.policy.tempos[1]: 5 listed twice"),
        ("tempos", [3], "heuristic_tempo: 5 is not in policy.tempos [3]"),
        ("styles", ["linear_add", "linear_add"], "$.policy.styles[1]: 'linear_add' listed twice"),
        ("styles", ["gated_gate"], "heuristic_style: 'linear_add' is not in policy.styles"),
    ],
)
def test_bad_heuristic_settings_are_named(key: str, value: object, message: str) -> None:
    from esper.config import config_from_dict
    from esper.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict({"policy": {"kind": "heuristic", **FULL_MENUS, key: value}})


@pytest.mark.parametrize(
    ("eager", "menus", "message"),
    [
        ({"blueprints": []}, {}, "$.policy.eager.blueprints: must name at least one"),
        ({"blueprints": ["wide"]}, {}, "$.policy.eager.blueprints[0]: unknown blueprint 'wide'"),
        ({"tempo": 4}, {}, "$.policy.eager.tempo: must be one of [3, 5, 8], got 4"),
        ({"alpha_target": 0.6}, {}, "$.policy.eager.alpha_target: must be one of"),
        ({"slot_order": ["r0c0", "r0c0"]}, {}, "$.policy.eager.slot_order[1]: 'r0c0' listed"),
        ({}, {"tempos": [3]}, "$.policy.eager.tempo: 5 is not in policy.tempos [3]"),
        ({"style": "sigmoid_add"}, {"styles": ["linear_add"]}, "$.policy.eager.style: "),
    ],
)
def test_bad_eager_settings_are_named(
    eager: dict[str, object], menus: dict[str, object], message: str
) -> None:
    from esper.config import config_from_dict
    from esper.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict({"policy": {"kind": "eager", "eager": eager, **FULL_MENUS, **menus}})


def test_a_menu_binds_only_the_policy_that_runs() -> None:
    """PPO with a narrowed style menu needs no heuristic or eager style to match it."""
    from esper.config import config_from_dict
    from esper.errors import ConfigError

    narrowed = {"styles": ["sigmoid_add"], "tempos": [8]}
    assert config_from_dict({"policy": narrowed}).policy.styles == ["sigmoid_add"]
    for kind in ("heuristic", "eager"):
        with pytest.raises(ConfigError, match="is not in policy"):
            config_from_dict({"policy": {"kind": kind, **narrowed}})


def test_signal_thresholds_reach_every_env_tracker() -> None:
    from esper.config import Config
    from esper.data.tasks import task_spec
    from esper.training.envs.env_factory import EnvFactory

    cfg = msgspec.convert(
        {"policy": {"plateau_gain_pp": 2.0, "stabilise_gain_pp": 0.25, "stabilise_epochs": 4}},
        Config,
    )
    tracker = EnvFactory(cfg, task_spec(cfg.task)).create_round(0)[0].tracker
    assert (tracker.plateau_gain_pp, tracker.stabilise_gain_pp, tracker.stabilise_epochs) == (
        2.0,
        0.25,
        4,
    )


def test_torch_threads_zero_shares_the_usable_cores_among_local_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from esper.training.loop.run_setup import intra_op_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert intra_op_threads(3) == 3  # an explicit count is kept
    assert intra_op_threads(0) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert intra_op_threads(0) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert intra_op_threads(0) == 1


#: Every blueprint, style, tempo and alpha target (the defaults narrow them).
FULL_MENUS = {"blueprints": [], "styles": [], "tempos": [], "alpha_targets": []}


def test_unset_slots_and_blueprints_are_the_host_topologys_recommended_ones() -> None:
    """Unset: a CNN offers r0c0 and r1c0 and conv_heavy, a transformer every slot and
    blueprint; ``[]``: everything the host offers."""
    from esper.config import config_from_dict
    from esper.core.constants import CNN_BLUEPRINTS, RECOMMENDED_SLOTS
    from esper.data.tasks import load_task
    from esper.training.loop.run_setup import action_space_for

    cfg = config_from_dict({})
    assert cfg.host.slots is None and cfg.policy.blueprints is None
    data = load_task(cfg.task, seed=0)
    space = action_space_for(cfg, data)
    assert space.slot_ids == RECOMMENDED_SLOTS[Topology.CNN] == ("r0c0", "r1c0")
    assert space.blueprints == ("conv_heavy",) and sum(space.blueprint_valid) == 1
    every = action_space_for(
        config_from_dict({"host": {"slots": []}, "policy": {"blueprints": []}}), data
    )
    assert len(every.slot_ids) == 5 and sum(every.blueprint_valid) == len(CNN_BLUEPRINTS)
    text = TaskSpec(
        name=TaskName.TEXT, topology=Topology.TRANSFORMER, input_shape=(8,), num_classes=256,
        random_guess_loss=math.log(256), is_lm=True,
    )  # fmt: skip
    small = HostConfig(d_model=16, n_heads=2, n_layers=3)
    assert build_model(small, text, seed=0).slot_ids == ("r0c0", "r0c1", "r0c2")


def test_policy_blueprints_mask_the_blueprint_head_for_every_policy() -> None:
    """The menu reaches the action space (masks, hence PPO, heuristic and random)."""
    from esper.config import config_from_dict
    from esper.core.constants import ALL_BLUEPRINTS
    from esper.data.tasks import load_task
    from esper.errors import ConfigError
    from esper.training.loop.run_setup import action_space_for

    cfg = config_from_dict({"policy": {"blueprints": ["conv_heavy", "norm"]}})
    data = load_task(cfg.task, seed=0)
    space = action_space_for(cfg, data)
    offered = {name for name, ok in zip(ALL_BLUEPRINTS, space.blueprint_valid, strict=True) if ok}
    assert offered == {"conv_heavy", "norm"}
    full = action_space_for(config_from_dict({"policy": FULL_MENUS}), data)
    assert sum(full.blueprint_valid) > len(offered)
    transformer_only = config_from_dict({"policy": {"blueprints": ["lora"]}})
    with pytest.raises(ConfigError, match=re.escape("$.policy.blueprints: none of the blueprints")):
        action_space_for(transformer_only, data)


def test_a_germination_deadline_longer_than_the_episode_is_refused() -> None:
    from esper.config import config_from_dict
    from esper.errors import ConfigError

    with pytest.raises(
        ConfigError, match=re.escape("$.policy.mask_late_germination: run.episode_length 12")
    ):
        config_from_dict({"policy": {"mask_late_germination": True}, "run": {"episode_length": 12}})
    config_from_dict({"policy": {"mask_late_germination": True}, "run": {"episode_length": 13}})


def test_policy_alpha_targets_mask_the_alpha_head() -> None:
    """The alpha menu reaches the masks every policy samples from (one packed transfer)."""
    from esper.config import config_from_dict
    from esper.data.tasks import load_task
    from esper.model import build_model
    from esper.policy.masks import compute_masks
    from esper.training.loop.run_setup import action_space_for

    cfg = config_from_dict({"policy": {**FULL_MENUS, "alpha_targets": [1.0]}})
    data = load_task(cfg.task, seed=0)
    space = action_space_for(cfg, data)
    assert space.alpha_target_valid == (False, False, True)
    reports = [build_model(cfg.host, data.spec, seed=0).slot_reports()] * 2
    masks = compute_masks(reports, space, max_seeds=3, device="cpu")
    assert masks.alpha_target.tolist() == [[False, False, True]] * 2
    assert masks.blueprint.shape[0] == 2 and masks.tempo.all()
    full = action_space_for(config_from_dict({"policy": FULL_MENUS}), data)
    assert compute_masks(reports, full, max_seeds=3, device="cpu").alpha_target.all()


def test_policy_style_and_tempo_menus_mask_their_heads() -> None:
    """The style and tempo menus reach the masks every policy samples from."""
    from esper.config import config_from_dict
    from esper.core.enums import GerminationStyle
    from esper.data.tasks import load_task
    from esper.model import build_model
    from esper.policy.masks import compute_masks
    from esper.training.loop.run_setup import action_space_for

    menus = {"styles": ["linear_add", "gated_gate"], "tempos": [5]}
    cfg = config_from_dict({"policy": {**FULL_MENUS, **menus}})
    data = load_task(cfg.task, seed=0)
    space = action_space_for(cfg, data)
    assert space.styles == (GerminationStyle.LINEAR_ADD, GerminationStyle.GATED_GATE)
    reports = [build_model(cfg.host, data.spec, seed=0).slot_reports()] * 2
    masks = compute_masks(reports, space, max_seeds=3, device="cpu")
    assert masks.style.tolist() == [[True, False, False, True]] * 2
    assert masks.tempo.tolist() == [[False, True, False]] * 2
    assert masks.alpha_target.all() and masks.alpha_speed.all()
    full = compute_masks(
        reports,
        action_space_for(config_from_dict({"policy": FULL_MENUS}), data),
        max_seeds=3,
        device="cpu",
    )
    assert full.style.all() and full.tempo.all()


BATCH_ENVS_CASES = [
    ({}, False),  # CPU: the per-env path, faster there
    ({"run.device": "cuda"}, True),
    ({"run.device": "cuda:1"}, True),
    ({"run.device": "cuda", "run.amp": "bf16"}, False),  # batching unmeasured with AMP
    # a family batches member by member when asked; "auto" leaves it per env (unmeasured)
    ({"run.device": "cuda", "family.members": [{"name": "a", "block_channels": [4]}]}, False),
    ({"run.batch_envs": True}, True),  # explicit settings win everywhere
    ({"run.batch_envs": False, "run.device": "cuda"}, False),
]


@pytest.mark.parametrize(("overrides", "batched"), BATCH_ENVS_CASES)
def test_batch_envs_auto_batches_float32_cuda_runs_only(
    overrides: dict[str, object], batched: bool
) -> None:
    from esper.config import Config, with_overrides

    assert with_overrides(Config(), overrides).batches_envs() is batched


def test_batch_envs_takes_true_false_or_auto_and_names_the_choices() -> None:
    from esper.config import Config, with_overrides
    from esper.errors import ConfigError

    assert Config().run.batch_envs == "auto"
    with pytest.raises(ConfigError, match=r"\$\.run\.batch_envs.*true, false, auto.*'auto'"):
        with_overrides(Config(), {"run.batch_envs": "aut"})


def test_a_checkpoint_resumes_whether_or_not_the_envs_are_batched() -> None:
    """Batching is how envs execute (equal up to float summation order), like the
    device: a run checkpointed per env may continue batched on a GPU."""
    from esper.config import Config, with_overrides
    from esper.training.loop.checkpoint import compat_fingerprint

    per_env = with_overrides(Config(), {"run.batch_envs": False})
    assert compat_fingerprint(per_env) == compat_fingerprint(Config())
    assert compat_fingerprint(per_env) != compat_fingerprint(
        with_overrides(per_env, {"run.episode_length": 7})
    )
