"""Named layouts of the hot path's packed rows (issue 15): packer and unpacker share one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from esper.core.layout import Layout
from esper.policy.actions import N_HEADS, N_OPS
from esper.training.learning.learner import DECISION_ROW
from esper.training.learning.ppo import METRICS_LAYOUT
from esper.training.passes.batch_ops import VAL_HEAD, gather_step_stats


def test_layout_slices_follow_declaration_order() -> None:
    lay = Layout(("a", 2), ("b", 1), ("c", 3))
    row = [0, 1, 2, 3, 4, 5]
    assert lay.width == 6
    assert lay.get(row, "a") == [0, 1] and lay.one(row, "b") == 2 and lay.get(row, "c") == [3, 4, 5]
    assert torch.equal(torch.arange(6)[lay["c"]], torch.tensor([3, 4, 5]))


def test_layout_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="'a' declared twice"):
        Layout(("a", 1), ("a", 2))
    lay = Layout(("a", 2))
    with pytest.raises(KeyError, match="no field 'z'"):
        lay["z"]
    with pytest.raises(ValueError, match="'a' has width 2"):
        lay.one([1, 2], "a")
    with pytest.raises(ValueError, match="3 values, layout declares 2"):
        lay.check([1, 2, 3])


def test_decision_row_op_mask_width_is_n_ops_not_a_literal() -> None:
    assert DECISION_ROW["op_mask"] == slice(N_HEADS + 2 + N_OPS, N_HEADS + 2 + 2 * N_OPS)
    assert DECISION_ROW.width == N_HEADS + 2 + 2 * N_OPS


def test_ppo_metrics_layout_covers_every_packed_stat() -> None:
    assert METRICS_LAYOUT.names[-4:] == (
        "explained_variance",
        "value_mean",
        "return_mean",
        "inputs_finite",
    )
    assert METRICS_LAYOUT.width == 7 + 2 * N_HEADS + 4


def test_step_stats_unpack_by_layout() -> None:
    """Two envs with different config counts and extras unpack to their own numbers."""
    train = torch.tensor([[2.0, 3.0, 4.0], [6.0, 1.0, 2.0]])  # loss_sum, correct, count
    grads = torch.tensor([[[0.5, 0.25]], [[0.125, 0.75]]])  # [N, S=1, 2]
    head = torch.tensor([[10.0, 5.0], [8.0, 4.0]])  # VAL_HEAD: loss_sum, count
    correct = torch.tensor([4.0, 3.0, 1.0])  # env 0: K=1; env 1: K=2
    first = np.array([0, 1])
    st = gather_step_stats(train, grads, head, correct, first, [torch.zeros(0), torch.ones(1)])
    assert st.train_loss.tolist() == [2.0 / 4, 3.0] and st.train_acc.tolist() == [75.0, 50.0]
    assert st.val_loss.tolist() == [2.0, 2.0] and st.val_acc.tolist() == [80.0, 75.0]
    assert st.config_accs.tolist() == [80.0, 75.0, 25.0]
    assert st.grad_norms.tolist() == [[[0.5, 0.25]], [[0.125, 0.75]]]
    assert st.extra is not None and [e.tolist() for e in st.extra] == [[], [1.0]]
    assert VAL_HEAD.width == 2
