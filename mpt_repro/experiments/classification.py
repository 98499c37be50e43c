"""Image classification: the paper's ILSVRC networks (Table 1), the CIFAR-10 and digits
experiments, the constructed small-gradient task, your own classifier (model=custom), and the
image data sets they train on (made-up images included, which every image experiment can use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from mpt_repro.experiments._detection_data import DetectionData
from mpt_repro.registry import TaskReport, metric, option_schema, task
from mpt_repro.schema import (
    LOADER,
    ImageData,
    ModelSchema,
    formerly,
    honours,
    in_unit,
    missing_module,
    require,
    split_target,
)

task(
    "classification",
    "mpt_repro.tasks.classification:Classification",
    TaskReport(
        "Other classification experiments (primary metric)",
        "classification",
        "primary",
        # the paper's Table 1 beside the ILSVRC runs (its own columns quote the paper's values)
        paper_table="mpt_repro.experiments._classification_tables:table1",
    ),
)
# the trainer's settings it acts on: BN recalibration (recalibration_inputs) and a compiled
# forward (mpt_repro/tasks/classification.py)
honours("classification", "trainer.recalibrate_bn", "trainer.compile", "trainer.compile_mode")
# what its metrics are (mpt_repro/tasks/classification.py reports them): the report's axes and
# verdicts read these
metric("loss", higher_is_better=False)  # mean cross-entropy per image
metric("top1", "%", higher_is_better=True)  # images whose top class is the label
metric("top5", "%", higher_is_better=True)


# -- models ----------------------------------------------------------------------------------------
@dataclass
class Classifier(ModelSchema):
    """The settings every classifier's option carries: how its input is laid out and its loss."""

    # NHWC memory format for CNNs on CUDA (tensor-core convolutions without layout transposes);
    # ignored on the CPU and by models that are not CNNs
    channels_last: bool = True
    # TF's softmax_cross_entropy label_smoothing: the target is (1 - s) one-hot + s / classes,
    # on every head (Inception v3: 0.1; models/losses.py)
    label_smoothing: float = field(default=0.0, metadata=formerly("optim.label_smoothing"))

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        in_unit(m.label_smoothing, "model.label_smoothing")


@option_schema("model", "digits_cnn")
@dataclass
class DigitsCNN(Classifier):
    width: int = 32
    dropout: float = 0.0

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        require(m.width > 0, "model.width", m.width, "must be positive")
        in_unit(m.dropout, "model.dropout")


@option_schema("model", "small_grad_mlp")
@dataclass
class SmallGradMLP(Classifier):
    width: int = 16
    num_layers: int = 4
    variant: str = "log2k=-6"  # the gradient's shrink per layer, log2 (models/small_grad.py)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        require(m.width > 0, "model.width", m.width, "must be positive")
        require(m.num_layers > 0, "model.num_layers", m.num_layers, "must be positive")


@option_schema("model", "imagenet_cnn")
@dataclass
class ImageNetCNN(Classifier):
    # alexnet, googlenet: caffe (the paper's, default) | torchvision; vgg16: caffe | torchvision
    variant: str = ""
    dropout: float = 0.0

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        in_unit(m.dropout, "model.dropout")


@option_schema("model", "resnet50")
@dataclass
class ResNet50(Classifier):
    variant: str = "preact"  # preact (the paper's He et al. 2016b) | torchvision


@option_schema("model", "aux_heads_cnn")
@dataclass
class AuxHeadsCNN(ImageNetCNN):
    # auxiliary classifiers, trained only
    aux_logits: bool = False
    aux_weight: float = 0.3  # each auxiliary loss's weight (Caffe prototxts 0.3, TF-slim v3 0.4)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        require(m.aux_weight >= 0, "model.aux_weight", m.aux_weight, "must be >= 0")


@option_schema("model", "googlenet")
@dataclass
class GoogLeNet(AuxHeadsCNN):
    aux_dropout: float = 0.7  # the auxiliary heads' dropout (BVLC prototxt: 0.7)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        in_unit(m.aux_dropout, "model.aux_dropout")


@option_schema("model", "custom")
@dataclass
class CustomModel(Classifier):
    """Your own classifier: a factory called as factory(num_classes=..., **kwargs)."""

    target: str = ""  # package.module:factory (or package.module.factory, Hydra's _target_ form)
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        from mpt_repro.catalog import model_options

        super().check(m, cfg)
        require(bool(m.target), "model.target", m.target, "must name a factory (package.module:fn)")
        module, _ = split_target(m.target)
        problem = missing_module(module)
        require(
            problem is None,
            "model.target",
            m.target,
            f"names a module Python cannot find ({problem}): install the package that holds it, "
            "or put its folder on PYTHONPATH",
        )
        builtin = sorted(set(model_options()) - {"custom"})
        require(
            m.name not in builtin,
            "model.name",
            m.name,
            f"names a built-in model ({', '.join(builtin)}); a model of your own (model=custom) "
            "needs a name of its own, e.g. model.name=mynet",
        )


# -- data sets -------------------------------------------------------------------------------------
@option_schema("data", "digits")
@dataclass
class Digits(ImageData):
    """scikit-learn's handwritten digits, shipped with the package."""

    reads: ClassVar = LOADER


@option_schema("data", "synthetic")
@dataclass
class Synthetic(DetectionData):
    """Random images of the experiment's shape (and random boxes for detection)."""

    reads: ClassVar = (*LOADER, "num_classes", "channels", "image_size", "augmentation")
    augmentations: ClassVar = None  # the experiment's own, whatever its data set

    synthetic_train_size: int = 2048
    synthetic_eval_size: int = 256
    synthetic_pool: int = 256  # distinct images, made once and kept on the training device

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.synthetic_pool > 0, "data.synthetic_pool", d.synthetic_pool, "must be positive")


@option_schema("data", "imagenet")
@dataclass
class ImageNet(ImageData):
    """ILSVRC2012 as torchvision's ImageFolder reads it."""

    reads: ClassVar = ("root", *LOADER, "num_classes", "image_size", "resize_size", "augmentation")
    augmentations: ClassVar = ("none", "caffe", "torchvision", "inception")  # data/imagenet.py
    needs_root: ClassVar = True

    decode: str = "cpu"  # cpu: loader workers decode JPEGs | gpu: nvJPEG on the CUDA device
    on_corrupt: str = "fail"  # fail: stop, naming the file | skip: warn, use the next image

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.decode in ("cpu", "gpu"), "data.decode", d.decode, "must be cpu or gpu")
        require(
            d.on_corrupt in ("fail", "skip"),
            "data.on_corrupt",
            d.on_corrupt,
            "must be fail or skip",
        )


@option_schema("data", "imagefolder")
@dataclass
class ImageFolder(ImageNet):
    """Any folder of class subfolders (torchvision's ImageFolder layout); the classes are the
    folder's own."""

    reads: ClassVar = ("root", *LOADER, "image_size", "resize_size", "augmentation")

    holdout_every: int = 10  # no val/ folder: every N-th image is held out

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.holdout_every >= 2, "data.holdout_every", d.holdout_every, "must be >= 2")


@option_schema("data", "cifar10")
@dataclass
class CIFAR10(ImageData):
    """CIFAR-10 in its python-pickle layout (cifar-10-batches-py), held in memory as uint8."""

    reads: ClassVar = ("root", *LOADER, "augmentation")
    augmentations: ClassVar = ("none", "cifar")  # cifar: pad 4, random crop and flip
    needs_root: ClassVar = True
