"""classification_loss: label smoothing (TF's definition) and weighted auxiliary heads."""

from __future__ import annotations

import math
from collections import namedtuple

import pytest
import torch

from mpt_repro.models.losses import classification_loss


def test_plain_logits_are_cross_entropy():
    logits, y = torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0])
    expected = -math.log(math.exp(2) / (math.exp(2) + 2))
    assert classification_loss(logits, y).item() == pytest.approx(expected)


def test_label_smoothing_is_tfs_one_hot_mix():
    """TF: target = (1 - s) one-hot + s / K. With s = 0.1, K = 3: (0.9333, 0.0333, 0.0333)."""
    logits, y = torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0])
    logp = torch.log_softmax(logits, 1)[0]
    target = torch.tensor([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3])
    expected = -(target * logp).sum().item()
    got = classification_loss(logits, y, label_smoothing=0.1).item()
    assert got == pytest.approx(expected) and got != pytest.approx(-logp[0].item())


def test_aux_heads_are_weighted_and_smoothed_too():
    torch.manual_seed(0)
    main, a1, a2 = torch.randn(3, 4, 5).unbind(0)
    y = torch.tensor([0, 1, 2, 3])

    def ce(x):
        return torch.nn.functional.cross_entropy(x, y, label_smoothing=0.1)

    got = classification_loss((main, a1, a2), y, label_smoothing=0.1, aux_weights=0.3)
    assert got.item() == pytest.approx((ce(main) + 0.3 * ce(a1) + 0.3 * ce(a2)).item())
    per_head = classification_loss((main, a1, a2), y, label_smoothing=0.1, aux_weights=[0.3, 0.5])
    assert per_head.item() == pytest.approx((ce(main) + 0.3 * ce(a1) + 0.5 * ce(a2)).item())


def test_torchvision_named_tuples_with_missing_heads():
    Out = namedtuple("Out", "logits aux_logits2 aux_logits1")
    torch.manual_seed(0)
    main, aux = torch.randn(2, 2, 3).unbind(0)
    y = torch.tensor([0, 2])
    got = classification_loss(Out(main, aux, None), y, aux_weights=0.4)
    ce = torch.nn.functional.cross_entropy
    assert got.item() == pytest.approx((ce(main, y) + 0.4 * ce(aux, y)).item())


def test_weight_count_must_match_the_heads():
    with pytest.raises(ValueError, match="2 auxiliary outputs but 1"):
        classification_loss(torch.randn(3, 2, 4).unbind(0), torch.tensor([0, 1]), aux_weights=[0.3])
