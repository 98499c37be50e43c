"""Box offsets for the detectors (SSD, Faster R-CNN) without host data in the training step.

torchvision's BoxCoder builds its weights with ``torch.as_tensor(tuple, device=...)`` on every
encode and the constant 0.5 with ``torch.tensor(0.5, device=...)`` on every decode: on a GPU each
is a copy from pageable host memory, which waits for everything queued on the device (pytorch
issue 120996). DeviceBoxCoder keeps the weights on each device it has seen and decodes with a
Python 0.5 (multiplying by 0.5 is exact, so nothing rounds differently). The arithmetic is the
standard R-CNN box coding (Girshick et al. 2014, appendix C), the same as torchvision's, bit for
bit (tests/test_gpu_hazards.py).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection._utils import BoxCoder, encode_boxes


class DeviceBoxCoder(BoxCoder):
    def __init__(self, weights: tuple[float, float, float, float], **kwargs):
        super().__init__(weights, **kwargs)
        self._on: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def encode_single(self, reference_boxes: Tensor, proposals: Tensor) -> Tensor:
        """Offsets (dx, dy, dw, dh) x weights of `reference_boxes` relative to `proposals`."""
        key = (reference_boxes.device, reference_boxes.dtype)
        if key not in self._on:  # once per device and dtype, not once per step
            self._on[key] = torch.as_tensor(self.weights, dtype=key[1], device=key[0])
        return encode_boxes(reference_boxes, proposals, self._on[key])

    def decode_single(self, rel_codes: Tensor, boxes: Tensor) -> Tensor:
        """Boxes (x1, y1, x2, y2) from offsets `rel_codes` [N, 4k] relative to `boxes` [N, 4]."""
        boxes = boxes.to(rel_codes.dtype)
        widths = boxes[:, 2] - boxes[:, 0]
        heights = boxes[:, 3] - boxes[:, 1]
        centre_x = boxes[:, 0] + 0.5 * widths
        centre_y = boxes[:, 1] + 0.5 * heights
        wx, wy, ww, wh = self.weights
        # exp() of a clamped log-size: no overflow from a wild prediction
        dw = torch.clamp(rel_codes[:, 2::4] / ww, max=self.bbox_xform_clip)
        dh = torch.clamp(rel_codes[:, 3::4] / wh, max=self.bbox_xform_clip)
        x = rel_codes[:, 0::4] / wx * widths[:, None] + centre_x[:, None]
        y = rel_codes[:, 1::4] / wy * heights[:, None] + centre_y[:, None]
        half_w = 0.5 * (torch.exp(dw) * widths[:, None])
        half_h = 0.5 * (torch.exp(dh) * heights[:, None])
        corners = torch.stack((x - half_w, y - half_h, x + half_w, y + half_h), dim=2)
        return corners.flatten(1)
