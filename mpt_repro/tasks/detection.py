"""Object detection (the paper's Table 2: SSD300 and Faster R-CNN, VGG-16, PASCAL VOC): VOC07 mAP.

A batch is (images [B, 3, H, W] padded to the largest, their sizes [B, 2], targets: per image
boxes/labels/difficult in input pixels). The model returns its loss as named FP32 parts (SSD:
localisation + confidence; Faster R-CNN: RPN objectness + RPN boxes + classification + boxes);
their sum is the training loss, scaled once by the precision policy. In evaluation the model
returns detections in input pixels, mapped back to the original image and scored against the
original annotations (difficult boxes ignored) by mpt_repro/metrics/voc_eval.py.

Metrics: ``map`` (VOC2007 11-point AP at IoU 0.5, percent: the paper's numbers), ``map_area``
(the VOC2010+ area under the curve); per-class APs in ``self.metrics_detail`` after each
evaluation, for run.json ``metrics_detail``. Both rest on the evaluation images' ground-truth
objects (not difficult), the count run.json's ``evaluation`` block states; with none they are
null, not 0.
"""

from __future__ import annotations

from typing import Any

import torch

from mpt_repro import distributed
from mpt_repro.data.detection import build_detection_data
from mpt_repro.data.detection_transforms import detection_collate
from mpt_repro.data.sampling import build_epoch_loaders
from mpt_repro.errors import ConfigError
from mpt_repro.evidence import Evaluation
from mpt_repro.metrics.voc_eval import IOU_THRESHOLD, evaluate_detections
from mpt_repro.optim import optimizer_factory
from mpt_repro.tasks.base import Loss, SampledTask

# The input geometry each detector expects from the data pipeline (see the models' docstrings).
GEOMETRY = {"ssd300": "warp", "faster_rcnn_vgg16": "shorter_side"}
LOSS_PARTS = {
    "ssd300": ["loss_loc", "loss_conf"],
    "faster_rcnn_vgg16": ["loss_objectness", "loss_rpn_box_reg", "loss_cls", "loss_bbox"],
}
# Both originals' prototxts give biases twice the learning rate (lr_mult 2); SSD's also exempts
# them from weight decay (decay_mult 0), py-faster-rcnn's does not (decay_mult left at 1).
BIAS_LR_MULT = 2.0
BIAS_DECAY_MULT = {"ssd300": 0.0, "faster_rcnn_vgg16": 1.0}


def caffe_param_groups(factory: Any, name: str) -> Any:
    """Wrap an optimizer factory so that biases get Caffe's lr_mult/decay_mult: the weights
    make the optimizer (group 0, the LR the trainer logs), the biases join as group 1. The
    precision policy hands the factory [(name, param), ...] (FP32 masters under the model's
    names when there are masters)."""

    def make(named_params: Any) -> torch.optim.Optimizer:
        named = list(named_params)
        weights = [(n, p) for n, p in named if not n.endswith("bias")]
        biases = [p for n, p in named if n.endswith("bias")]
        opt = factory(weights)
        if biases:
            base = opt.param_groups[0]
            opt.add_param_group(
                {
                    "params": biases,
                    "lr": base["lr"] * BIAS_LR_MULT,
                    "weight_decay": base["weight_decay"] * BIAS_DECAY_MULT[name],
                }
            )
        return opt

    make.takes_named_params = True
    return make


class Detection(SampledTask):
    primary_metric = "map"

    def __init__(self, cfg: Any, device: torch.device, policy: Any):
        super().__init__(cfg, device, policy)
        d, name = cfg.data, cfg.model.name
        if name not in GEOMETRY:
            raise ConfigError(
                f"model.name={name!r} is not a detector; task=detection takes {sorted(GEOMETRY)}"
            )
        batch, global_batch = distributed.batch_sizes(cfg)
        self.data = build_detection_data(d, GEOMETRY[name])
        self.metric_names = ["map", "map_area", *LOSS_PARTS[name]]  # eval metrics + train parts
        self.metrics_detail: dict[str, Any] = {}
        model = self.new_model(num_classes=self.data.num_classes, image_size=d.image_size)
        self.backbone_source = getattr(model, "backbone_source", None)
        factory = caffe_param_groups(optimizer_factory(cfg.optim, global_batch), name)
        self.model, self.optimizer, self.train_model = self.add_model("model", model, factory)
        # variable numbers of boxes per image: batches are collated by detection_collate
        self.use_loaders(
            build_epoch_loaders(
                self.data.train,
                self.data.eval,
                d,
                batch,
                cfg.seed,
                device,
                collate_fn=detection_collate,
            )
        )

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
        images, sizes, targets = batch
        images = self.policy.cast_inputs(images.to(self.device, non_blocking=True))
        on_device = [
            {k: t[k].to(self.device, non_blocking=True) for k in ("boxes", "labels")}
            for t in targets
        ]
        return images, sizes, on_device

    def loss(self, batch: Any) -> Loss:
        """The sum of the model's FP32 loss parts (computed with autocast off); backward scales
        it once, so every part carries the same loss scale (Caffe's iter_size accumulates the
        same way). The parts are logged."""
        images, sizes, targets = self._to_device(batch)
        parts = self.train_model(images, sizes, targets)
        return Loss(sum(parts.values()), samples=len(targets), logs=parts)

    def eval_totals(self) -> dict[str, Any]:
        return {"detections": []}

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Each image's detections, mapped back to the original image's pixels (on the host)."""
        images, sizes, targets = batch
        outputs = self.model(
            self.policy.cast_inputs(images.to(self.device, non_blocking=True)), sizes
        )
        found = []
        for out, t in zip(outputs, targets):
            sx, sy = t["scale"].tolist()  # input pixels per original pixel
            to_original = torch.tensor([sx, sy, sx, sy])
            found.append(
                (
                    int(t["index"]),
                    {
                        "boxes": out["boxes"].float().cpu() / to_original,
                        "scores": out["scores"].float().cpu(),
                        "labels": out["labels"].cpu(),
                    },
                )
            )
        return {"detections": found}

    def evaluation_of(self, totals: dict[str, Any]) -> Evaluation:
        """VOC07 AP over every rank's detections (the AP needs all of them together), resting
        on the ground-truth objects (not difficult) of the evaluation images: none, and mAP is
        undefined (null), not 0. No per-item columns: an AP is no sum over images, so the
        report cannot resample it by image yet (a bootstrap would recompute the AP per
        resample from kept detections)."""
        by_index = dict(totals["detections"])
        n = len(self.data.eval)
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0)}
        detections = [by_index.get(i, empty) for i in range(n)]
        truths = [self.data.eval.ground_truth(i) for i in range(n)]
        result = evaluate_detections(detections, truths, self.data.class_names)
        self.metrics_detail = {
            "per_class_ap": result.per_class_ap,
            "per_class_ap_area": result.per_class_ap_area,
            "num_positives": result.num_positives,
            "eval_images": n,
            "detections": result.num_detections,
            "iou_threshold": IOU_THRESHOLD,
            "map_method": "VOC2007 11-point interpolated AP (map); VOC2010+ area (map_area)",
        }
        # what an AP recalls: the ground-truth objects (difficult ones are ignored)
        objects = sum(result.num_positives.values())
        names = ("map", "map_area")
        why = f"no ground-truth object (not difficult) in the {n} evaluation images"
        found = {"map": result.map, "map_area": result.map_area}
        return Evaluation(
            metrics=found if objects else dict.fromkeys(names),
            counts=dict.fromkeys(names, objects),
            units=dict.fromkeys(names, "objects"),
            items=n,
            unit="images",
            undefined={} if objects else dict.fromkeys(names, why),
            dropped={},
            columns=None,
            formulas=None,
            data_items=n,
        )

    def describe_data(self) -> dict:
        return super().describe_data(classes=list(self.data.class_names))

    def describe_model(self) -> dict:
        return {**super().describe_model(), "backbone_weights": self.backbone_source}
