"""The classification objective: cross-entropy with optional label smoothing, plus the weighted
losses of auxiliary classifiers (GoogLeNet, BN-Inception, Inception v3).

Label smoothing is TensorFlow's `softmax_cross_entropy(label_smoothing=s)` (the target
distribution is (1 - s) one-hot + s / classes), which is also torch's `label_smoothing`; as in
TF-slim's train_image_classifier.py it applies to the auxiliary heads too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F


def split_outputs(outputs: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(main logits, auxiliary logits) from a logits tensor or a (main, aux...) tuple, as the
    models return in training mode (None entries, e.g. torchvision's heads when switched off,
    are dropped)."""
    if isinstance(outputs, torch.Tensor):
        return outputs, []
    main, *aux = [o for o in outputs if o is not None]
    return main, aux


def classification_loss(
    outputs: Any,
    targets: torch.Tensor,
    *,
    label_smoothing: float = 0.0,
    aux_weights: float | Sequence[float] = (),
) -> torch.Tensor:
    """main CE + sum_i aux_weights[i] * aux CE_i (mean over the batch).

    aux_weights: one weight per auxiliary head in output order, or a single float for every head
    (model.aux_weight: 0.3 for the Caffe networks' heads, 0.4 for Inception v3's). The dtype
    follows the logits; under the precision policy's autocast cross_entropy runs in FP32.
    """
    main, aux = split_outputs(outputs)
    if isinstance(aux_weights, (int, float)):
        weights = [float(aux_weights)] * len(aux)
    else:
        weights = [float(w) for w in aux_weights]
        if aux and len(weights) != len(aux):
            raise ValueError(
                f"{len(aux)} auxiliary outputs but {len(weights)} aux_weights {weights}"
            )
    loss = F.cross_entropy(main, targets, label_smoothing=label_smoothing)
    for w, logits in zip(weights, aux):
        loss = loss + w * F.cross_entropy(logits, targets, label_smoothing=label_smoothing)
    return loss
