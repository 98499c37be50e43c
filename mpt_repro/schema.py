"""The schemas of the model and data options: one structured config per option (Hydra's pattern of
a base schema per option), each with the checks of its own fields beside them.

Each conf/model/*.yaml and conf/data/*.yaml names its schema first in its defaults list

    defaults:
      - /schema/model@_here_: lstm_lm
      - _self_

so the composed `model` node is an `LSTMLM`: a key another model reads (`model.width`) does not
exist in it and is refused by Hydra, with or without a leading `+` (mpt_repro/config.py turns
that into a message naming the options that have it). A new ImageNet network needs no schema of
its own: `imagenet_cnn` takes any CNN classifier with a variant and a dropout.

Fields that the option carries but that change a run only in some settings say so with
`read_when(selector, kinds...)` in their metadata (a command-line override is refused when the
run's kind is not among them; config.check_overrides_are_read). The same marker serves the other
groups' fields (optim, trainer, precision, telemetry).

Nothing here imports torch: mpt-run checks a configuration before torch loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from mpt_repro.errors import ConfigError


def read_when(selector: str, *kinds: str) -> dict[str, Any]:
    """Field metadata: the key changes a run only when `selector` (a config key such as
    `optim.name`, or a derived kind: `task`, `loss_scaling`, `telemetry.enabled`) is one of
    `kinds`."""
    return {"read_when": (selector, tuple(kinds))}


def require(ok: bool, key: str, value: Any, must: str) -> None:
    """Raise ConfigError naming the key, its value and what it must be."""
    if not ok:
        raise ConfigError(
            f"{key} {must} (got {value!r}). Fix it in the config or on the command line, e.g. "
            f"{key}=..."
        )


def in_unit(x: float, key: str) -> None:
    """A probability-like value: in [0, 1)."""
    require(0 <= x < 1, key, x, "must be in [0, 1)")


# -- models ----------------------------------------------------------------------------------------
@dataclass
class ModelSchema:
    name: str = MISSING

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        """The checks of this option's own fields (ConfigError naming the key)."""


@dataclass
class Classifier(ModelSchema):
    # NHWC memory format for CNNs on CUDA (tensor-core convolutions without layout transposes);
    # ignored on the CPU and by models that are not CNNs
    channels_last: bool = True


@dataclass
class DigitsCNN(Classifier):
    width: int = 32
    dropout: float = 0.0

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        require(m.width > 0, "model.width", m.width, "must be positive")
        in_unit(m.dropout, "model.dropout")


@dataclass
class SmallGradMLP(Classifier):
    width: int = 16
    num_layers: int = 4
    variant: str = "log2k=-6"  # the gradient's shrink per layer, log2 (models/small_grad.py)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        require(m.width > 0, "model.width", m.width, "must be positive")
        require(m.num_layers > 0, "model.num_layers", m.num_layers, "must be positive")


@dataclass
class ImageNetCNN(Classifier):
    # alexnet, googlenet: caffe (the paper's, default) | torchvision; vgg16: caffe | torchvision
    variant: str = ""
    dropout: float = 0.0

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        in_unit(m.dropout, "model.dropout")


@dataclass
class ResNet50(Classifier):
    variant: str = "preact"  # preact (the paper's He et al. 2016b) | torchvision


@dataclass
class AuxHeadsCNN(ImageNetCNN):
    # auxiliary classifiers, trained only
    aux_logits: bool = False
    aux_weight: float = 0.3  # each auxiliary loss's weight (Caffe prototxts 0.3, TF-slim v3 0.4)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        require(m.aux_weight >= 0, "model.aux_weight", m.aux_weight, "must be >= 0")


@dataclass
class GoogLeNet(AuxHeadsCNN):
    aux_dropout: float = 0.7  # the auxiliary heads' dropout (BVLC prototxt: 0.7)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        super().check(m, cfg)
        in_unit(m.aux_dropout, "model.aux_dropout")


@dataclass
class LSTMLM(ModelSchema):
    """An LSTM language model with projection and optional sampled softmax."""

    embed_dim: int = 64
    hidden_size: int = 128
    proj_size: int = 0  # 0: no projection
    num_layers: int = 2
    num_sampled: int = 0  # sampled-softmax negatives; 0: full softmax
    dropout: float = 0.0
    # initial forget-gate bias (TF LSTMCell / f-lm: 1.0); null: none (all biases start at 0)
    forget_bias: float | None = None
    # f-lm's num_shards: the embedding and softmax weights are initialised per shard of
    # ceil(vocabulary / init_shards) rows, U(+-sqrt(3 / rows)) (mpt_repro/models/lstm_lm.py)
    init_shards: int = 8

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        for key in ("embed_dim", "hidden_size", "num_layers"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")
        for key in ("proj_size", "num_sampled"):
            require(m[key] >= 0, f"model.{key}", m[key], "must be >= 0")
        in_unit(m.dropout, "model.dropout")
        require(m.init_shards >= 1, "model.init_shards", m.init_shards, "must be >= 1")
        require(
            m.proj_size < m.hidden_size,
            "model.proj_size",
            m.proj_size,
            f"must be smaller than model.hidden_size={m.hidden_size} (0: no projection)",
        )


@dataclass
class Seq2SeqAttention(ModelSchema):
    """The TensorFlow seq2seq tutorial's attention encoder-decoder (models/seq2seq.py). The
    vocabulary sizes and buckets are the tutorial model's constructor arguments, so they live
    here and data=synthetic draws token pairs of the same shape."""

    size: int = 1024
    num_layers: int = 3
    source_vocab_size: int = 40000
    target_vocab_size: int = 40000
    buckets: list[list[int]] = field(
        default_factory=lambda: [[5, 10], [10, 15], [20, 25], [40, 50]]
    )
    num_sampled: int = 512  # sampled-softmax candidates; 0 (or >= the vocabulary): full softmax
    forget_bias: float = 1.0  # BasicLSTMCell's

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        for key in ("size", "num_layers"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")
        for key in ("source_vocab_size", "target_vocab_size"):
            require(m[key] > 4, f"model.{key}", m[key], "must be > 4 (_PAD, _GO, _EOS, _UNK)")
        require(m.num_sampled >= 0, "model.num_sampled", m.num_sampled, "must be >= 0")
        pairs = [list(b) for b in m.buckets]
        require(
            bool(pairs)
            and all(len(b) == 2 and b[0] >= 2 and b[1] >= 3 for b in pairs)
            and pairs == sorted(pairs),
            "model.buckets",
            pairs,
            "must be increasing [source, target] length pairs, e.g. [[5, 10], [10, 15]]",
        )


@dataclass
class DeepSpeech2(ModelSchema):
    """DeepSpeech 2 (models/deepspeech2.py) and its log-spectrogram front end: the window fixes
    the number of frequency bins, hence the first recurrent layer's input size."""

    sample_rate: int = 16000  # Hz; the audio must be at this rate
    window_ms: float = 20.0  # STFT window (= FFT length)
    hop_ms: float = 10.0  # STFT hop
    conv_channels: int = 32
    hidden_size: int = 2560  # GRU cells per layer (per direction)
    num_layers: int = 3
    bidirectional: bool = False
    lookahead: int = 80  # future frames of the row convolution; 0: none
    fc_size: int = 2560  # the hidden fully connected layer; 0: none

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        for key in ("sample_rate", "window_ms", "hop_ms", "conv_channels", "hidden_size"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")
        require(m.num_layers > 0, "model.num_layers", m.num_layers, "must be positive")
        for key in ("lookahead", "fc_size"):
            require(m[key] >= 0, f"model.{key}", m[key], "must be >= 0")


NOISES = ("uniform", "normal")


@dataclass
class DCGAN(ModelSchema):
    latent_dim: int = 100
    gen_features: int = 64
    disc_features: int = 64
    noise: str = "uniform"  # uniform U(-1, 1) (Radford et al.) | normal N(0, 1) (pytorch/examples)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        require(m.noise in NOISES, "model.noise", m.noise, f"must be one of {NOISES}")
        for key in ("latent_dim", "gen_features", "disc_features"):
            require(m[key] > 0, f"model.{key}", m[key], "must be positive")


@dataclass
class Detector(ModelSchema):
    width: int = 64
    # a VGG-16 weights file (a torchvision state dict or a vgg16 run's checkpoint)
    backbone_weights: str | None = None


@dataclass
class FasterRCNN(Detector):
    dropout: float = 0.5

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        in_unit(m.dropout, "model.dropout")


@dataclass
class CustomModel(Classifier):
    """Your own classifier: a factory called as factory(num_classes=..., **kwargs)."""

    target: str = ""  # package.module:factory (or package.module.factory, Hydra's _target_ form)
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        from mpt_repro.catalog import model_options

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


def split_target(target: str) -> tuple[str, str]:
    """`package.module:factory` (or Hydra's `package.module.factory`) as (module, attribute);
    either is empty when the target does not name both."""
    module, sep, attr = target.partition(":")
    if not sep:
        module, _, attr = target.rpartition(".")
    return module, attr


def missing_module(module: str) -> str | None:
    """Why `module` cannot be imported, found without importing it (only its parent packages,
    as Python's own search does), so that a misspelt model.target is refused before torch loads;
    None when it is there or when only importing it would tell (its package fails to import)."""
    import importlib.util

    if not module:
        return None  # the factory check names the malformed target itself
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError as e:
        return f"no module named {e.name!r}"
    except Exception:  # noqa: BLE001 - a parent package that fails to import: the build says why
        return None
    return None if found is not None else f"no module named {module!r}"


# -- data sets -------------------------------------------------------------------------------------
# loader workers
LOADED = (
    "cifar10",
    "digits",
    "imagefolder",
    "imagenet",
    "images",
    "librispeech",
    "synthetic",
    "voc",
)
ROOTED = (
    "bible_enes",
    "cifar10",
    "corpus",
    "imagefolder",
    "imagenet",
    "images",
    "librispeech",
    "voc",
    "wmt15_enfr",
)  # a folder
AUGMENTATIONS = ("none", "caffe", "torchvision", "inception", "ssd", "flip", "cifar")


@dataclass
class DataSchema:
    name: str = MISSING
    # the data set's folder, in its standard layout (README.md, "Data"); null for data that
    # ships with the project (digits, the embedded corpora) or is made up (synthetic)
    root: str | None = field(default=None, metadata=read_when("data.name", *ROOTED))
    batch_size: int = 64  # one micro-batch of one process (trainer.accumulate, distributed.*)
    eval_batch_size: int | None = None  # null: same as batch_size
    train_limit: int | None = None  # use only the first N training examples (budgets)
    eval_limit: int | None = None
    num_workers: int = field(default=0, metadata=read_when("data.name", *LOADED))
    pin_memory: bool = field(default=True, metadata=read_when("data.name", *LOADED))

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        require(d.batch_size > 0, "data.batch_size", d.batch_size, "must be a positive integer")
        for key in ("eval_batch_size", "train_limit", "eval_limit"):
            require(d[key] is None or d[key] > 0, f"data.{key}", d[key], "must be positive or null")
        require(d.num_workers >= 0, "data.num_workers", d.num_workers, "must be >= 0")


@dataclass
class ImageData(DataSchema):
    """The fields every image data set carries (the experiments set them whatever the data set:
    an ImageNet experiment on data=synthetic keeps its shape)."""

    num_classes: int = field(default=10, metadata=read_when("data.name", "imagenet", "synthetic"))
    channels: int = field(default=1, metadata=read_when("data.name", "images", "synthetic"))
    image_size: int = field(
        default=8,  # the training crop
        metadata=read_when("data.name", "imagefolder", "imagenet", "images", "synthetic", "voc"),
    )
    # validation: resize the shorter side, then centre-crop image_size
    resize_size: int | None = field(
        default=None, metadata=read_when("data.name", "imagefolder", "imagenet")
    )
    augmentation: str = field(
        default="none",
        metadata=read_when("data.name", "cifar10", "imagefolder", "imagenet", "synthetic", "voc"),
    )

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.image_size > 0, "data.image_size", d.image_size, "must be positive")
        require(
            d.augmentation in AUGMENTATIONS,
            "data.augmentation",
            d.augmentation,
            f"must be one of {AUGMENTATIONS}",
        )


@dataclass
class Digits(ImageData):
    """scikit-learn's handwritten digits, shipped with the package."""


@dataclass
class DetectionData(ImageData):
    """The fields of a detection data set (an experiment's VOC splits stay in the composed
    config when it runs on data=synthetic: its random boxes ignore them)."""

    # splits "<year>/<set>", e.g. [2007/trainval, 2012/trainval] and [2007/test]
    train_splits: list[str] = field(default_factory=list, metadata=read_when("data.name", "voc"))
    eval_splits: list[str] = field(default_factory=list, metadata=read_when("data.name", "voc"))
    # `difficult` boxes as training targets (evaluation always ignores them)
    train_difficult: bool = field(default=True, metadata=read_when("data.name", "voc"))
    # the longer side's cap (Faster R-CNN's 1000)
    max_size: int | None = field(default=None, metadata=read_when("task", "detection"))


@dataclass
class Synthetic(DetectionData):
    """Random images of the experiment's shape (and random boxes for detection)."""

    synthetic_train_size: int = 2048
    synthetic_eval_size: int = 256
    synthetic_pool: int = 256  # distinct images, made once and kept on the training device

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.synthetic_pool > 0, "data.synthetic_pool", d.synthetic_pool, "must be positive")


@dataclass
class ImageNet(ImageData):
    """ILSVRC2012 as torchvision's ImageFolder reads it."""

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


@dataclass
class ImageFolder(ImageNet):
    holdout_every: int = 10  # no val/ folder: every N-th image is held out

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.holdout_every >= 2, "data.holdout_every", d.holdout_every, "must be >= 2")


@dataclass
class Images(ImageData):
    """A folder of images without labels worth reading (CelebA for the DCGAN)."""


@dataclass
class VOC(DetectionData):
    """PASCAL VOC as the official tarballs unpack."""


@dataclass
class CIFAR10(ImageData):
    """CIFAR-10 in its python-pickle layout (cifar-10-batches-py), held in memory as uint8."""


@dataclass
class Corpus(DataSchema):
    """A word-level corpus: train.txt, valid.txt, test.txt."""

    seq_len: int = 35  # truncated back-propagation through time
    min_freq: int = 1  # words seen fewer times become <unk>
    max_vocab: int | None = None

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.seq_len > 0, "data.seq_len", d.seq_len, "must be positive")


@dataclass
class ParallelCorpus(DataSchema):
    """A parallel corpus as WMT releases it: <prefix>.<lang> plain-text files (or .gz)."""

    train_prefix: str = "giga-fren.release2.fixed"
    dev_prefix: str = "newstest2013"
    source_lang: str = "en"
    target_lang: str = "fr"
    normalize_digits: bool = True  # the tutorial's: every digit becomes 0


@dataclass
class LibriSpeech(DataSchema):
    """LibriSpeech as its tarballs unpack (mpt_repro/data/speech.py); sizes count utterances."""

    train_splits: list[str] = field(default_factory=lambda: ["train-clean-100"])
    eval_split: str = "dev-clean"
    max_seconds: float | None = None  # training utterances longer than this are left out
    sorta_grad: bool = True  # first epoch shortest first (DS2 §3.3)

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(bool(d.train_splits), "data.train_splits", d.train_splits, "must name a split")
        require(
            d.max_seconds is None or d.max_seconds > 0,
            "data.max_seconds",
            d.max_seconds,
            "must be positive or null",
        )


# the schema of each option, by the name its yaml file gives it (`/schema/<group>@_here_: <name>`)
OPTION_SCHEMAS: dict[str, dict[str, type]] = {
    "model": {
        "digits_cnn": DigitsCNN,
        "small_grad_mlp": SmallGradMLP,
        "imagenet_cnn": ImageNetCNN,
        "resnet50": ResNet50,
        "aux_heads_cnn": AuxHeadsCNN,
        "googlenet": GoogLeNet,
        "lstm_lm": LSTMLM,
        "seq2seq_attention": Seq2SeqAttention,
        "dcgan": DCGAN,
        "deepspeech2": DeepSpeech2,
        "detector": Detector,
        "faster_rcnn": FasterRCNN,
        "custom": CustomModel,
    },
    "data": {
        "digits": Digits,
        "synthetic": Synthetic,
        "imagenet": ImageNet,
        "imagefolder": ImageFolder,
        "images": Images,
        "voc": VOC,
        "cifar10": CIFAR10,
        "corpus": Corpus,
        "wmt15_enfr": ParallelCorpus,
        "bible_enes": ParallelCorpus,  # the same loader; root: null is the embedded corpus
        "librispeech": LibriSpeech,
    },
}


def register_option_schemas(store: Any) -> None:
    """Put every option schema in Hydra's ConfigStore (group schema/<group>)."""
    for group, schemas in OPTION_SCHEMAS.items():
        for name, node in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=node)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def schema_of(node: Any) -> type | None:
    """The dataclass behind a composed node (None for a plain mapping)."""
    from omegaconf import OmegaConf

    found = OmegaConf.get_type(node)
    return found if dataclasses.is_dataclass(found) else None
