"""The networks the paper trained in Caffe, as their prototxts define them: exact parameter counts,
the layers that distinguish them from torchvision's, their initialisation and auxiliary heads.

Reference counts: the original prototxts' layer shapes, counted layer by layer (Convolution:
out x in/groups x k x k (+ out bias); InnerProduct: out x in (+ out); Scale (BN affine): 2 x C;
BatchNorm's running statistics are not parameters), at the prototxt's input size (227 px for
AlexNet, 224 px for the others):
- BVLC/caffe @9b89154 models/bvlc_alexnet/train_val.prototxt: 60,965,224 (also the figure
  quoted in recipes.md and issue 12);
- BVLC/caffe @9b89154 models/bvlc_googlenet/train_val.prototxt: 6,998,552 main (everything
  outside loss1/ and loss2/, loss3/classifier included),
  6,379,728 in loss1/loss2;
- BVLC/caffe branch intel @3f494b4 models/default_googlenet_v2/train_val.prototxt:
  11,194,984 main, 4,880,848 in loss1/loss2.
"""

from __future__ import annotations

import pytest
import torch
from conftest import option_config
from torch import nn

from mpt_repro.errors import ConfigError
from mpt_repro.models import build_model


def build(name: str, meta: bool = True, num_classes: int = 1000, size: int = 224, **kw):
    cfg = option_config("model", name=name, **kw)
    if meta:  # the meta device allocates nothing: counting costs no memory or init time
        with torch.device("meta"):
            return build_model(cfg, num_classes=num_classes, channels=3, image_size=size)
    return build_model(cfg, num_classes=num_classes, channels=3, image_size=size)


def count(model: nn.Module, aux: bool | None = None) -> int:
    """Parameters; aux=False: outside the auxiliary heads, aux=True: only in them."""
    return sum(
        p.numel() for n, p in model.named_parameters() if aux is None or n.startswith("aux") == aux
    )


# The prototxts' counts (see the module docstring), labelled by source.
BVLC_ALEXNET = 60_965_224
BVLC_GOOGLENET_MAIN, BVLC_GOOGLENET_AUX = 6_998_552, 6_379_728
BN_INCEPTION_MAIN, BN_INCEPTION_AUX = 11_194_984, 4_880_848


def test_alexnet_default_is_bvlc_alexnet_with_its_exact_parameter_count():
    model = build("alexnet", variant="", size=227)
    assert count(model) == BVLC_ALEXNET
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [96, 256, 384, 384, 256]
    assert [c.groups for c in convs] == [1, 2, 1, 2, 2]
    lrns = [m for m in model.modules() if isinstance(m, nn.LocalResponseNorm)]
    assert [(n.size, n.alpha, n.beta, n.k) for n in lrns] == [(5, 1e-4, 0.75, 1.0)] * 2
    names = [n for n, _ in model.features.named_children()]
    assert names.index("norm1") == names.index("relu1") + 1  # LRN after conv1's ReLU
    assert names.index("norm2") == names.index("relu2") + 1
    # torchvision's AlexNet is another network, kept as a variant
    assert count(build("alexnet", variant="torchvision", size=227)) == 61_100_840


def test_alexnet_pool5_is_6x6_at_227_px_so_the_adaptive_pool_is_the_identity():
    model = build("alexnet", size=227)
    x = model.features(torch.empty(1, 3, 227, 227, device="meta"))
    assert tuple(x.shape) == (1, 256, 6, 6)


def test_alexnet_initialisation_is_the_prototxts():
    torch.manual_seed(0)
    model = build("alexnet", meta=False, num_classes=10, size=63)
    layers = {**dict(model.features.named_children()), **dict(model.classifier.named_children())}
    for name, std, bias in [("conv1", 0.01, 0.0), ("conv2", 0.01, 0.1), ("fc6", 0.005, 0.1)]:
        w = layers[name].weight
        assert w.std().item() == pytest.approx(std, rel=0.05), name
        assert torch.all(layers[name].bias == bias), name


def test_googlenet_default_is_bvlc_googlenet_with_its_exact_parameter_counts():
    model = build("googlenet", aux_logits=True)
    assert count(model, aux=False) == BVLC_GOOGLENET_MAIN
    assert count(model, aux=True) == BVLC_GOOGLENET_AUX
    assert count(build("googlenet", aux_logits=False)) == BVLC_GOOGLENET_MAIN
    # what distinguishes it from torchvision's: no BN, LRN, real 5x5 convolutions
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert sum(isinstance(m, nn.LocalResponseNorm) for m in model.modules()) == 2
    kernels = {m.kernel_size for m in model.modules() if isinstance(m, nn.Conv2d)}
    assert (5, 5) in kernels
    tv = build("googlenet", variant="torchvision", aux_logits=True)
    assert any(isinstance(m, nn.BatchNorm2d) for m in tv.modules())
    assert (5, 5) not in {m.kernel_size for m in tv.modules() if isinstance(m, nn.Conv2d)}


def test_googlenet_initialisation_and_head_dropouts_are_the_prototxts():
    torch.manual_seed(0)
    model = build("googlenet", meta=False, num_classes=10, size=32, aux_logits=True)
    conv1 = model.stem[0][0]
    bound = (3.0 / conv1.weight[0].numel()) ** 0.5  # Caffe xavier: U(+-sqrt(3 / fan_in))
    assert conv1.weight.abs().max().item() <= bound
    assert conv1.weight.abs().max().item() > 0.95 * bound
    assert torch.all(conv1.bias == 0.2)
    for classifier in (model.classifier, model.aux1.classifier, model.aux2.classifier):
        assert torch.all(classifier.bias == 0)


def test_experiment_configs_reach_the_models_dropouts_and_heads():
    """The dropout values and auxiliary heads the experiments set arrive in the built modules."""
    from conftest import compose

    def built(experiment: str, size: int, *more: str) -> nn.Module:
        cfg = compose([f"experiment={experiment}", *more])
        with torch.device("meta"):
            return build_model(cfg.model, num_classes=1000, channels=3, image_size=size)

    g = built("googlenet", 224)  # prototxt: main dropout 0.4, auxiliary 0.7
    assert g.head[-1].p == 0.4 and g.aux1.drop.p == 0.7 and g.aux2.drop.p == 0.7
    assert built("inception_v2", 224).aux2 is not None
    v3 = built("inception_v3", 299, "recipe=public")  # TF-slim: keep probability 0.8
    assert v3.dropout.p == 0.2 and v3.AuxLogits is not None
    v3 = built("inception_v3", 299)  # the default, NVCaffe's train_val_fp16: no dropout
    assert v3.dropout.p == 0.0 and v3.AuxLogits is not None
    a = built("alexnet", 227)
    assert [m.p for m in a.classifier if isinstance(m, nn.Dropout)] == [0.5, 0.5]


def test_inception_v2_is_the_prototxt_with_its_exact_parameter_counts():
    model = build("inception_v2", aux_logits=True)
    assert count(model, aux=False) == BN_INCEPTION_MAIN
    assert count(model, aux=True) == BN_INCEPTION_AUX
    pool_proj = [m.branch_pool[1][0].out_channels for m in model.inception if m.branch1]
    assert pool_proj == [32, 64, 128, 128, 96, 96, 128, 128]  # 3a 3b 4a 4b 4c 4d 5a 5b
    assert not any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


def test_inception_v2_aux_heads_read_3c_and_4e_grids():
    model = build("inception_v2", aux_logits=True)
    model.train()
    x = model.stage3(model.stem(torch.empty(2, 3, 224, 224, device="meta")))
    assert tuple(x.shape[1:]) == (576, 14, 14)
    assert tuple(model.aux1.pool(x).shape[1:]) == (576, 4, 4)  # AVE 5/3: 14 -> 4
    x = model.stage4(x)
    assert tuple(x.shape[1:]) == (1024, 7, 7)
    assert tuple(model.aux2.pool(x).shape[1:]) == (1024, 2, 2)  # AVE 5/3 ceil: 7 -> 2


@pytest.mark.parametrize("name", ["googlenet", "inception_v2"])
def test_aux_heads_train_only_and_come_main_first(name, one_thread):
    torch.manual_seed(0)
    model = build(name, meta=False, num_classes=7, size=32, aux_logits=True)
    x = torch.randn(2, 3, 32, 32)
    out = model.train()(x)
    assert isinstance(out, tuple) and len(out) == 3 and all(o.shape == (2, 7) for o in out)
    with torch.no_grad():
        assert model.eval()(x).shape == (2, 7)


def test_inception_v2_refuses_sizes_its_ceil_mode_pools_cannot_concatenate():
    with pytest.raises(ConfigError, match="image_size=48"):
        build("inception_v2", size=48)
    for size in (224, 64, 32):
        build("inception_v2", size=size)


def test_unknown_variant_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"model.variant='bvlc'.*\['caffe', 'torchvision'\]"):
        build("alexnet", variant="bvlc")
    with pytest.raises(ConfigError, match="inception_v3 variant"):
        build("inception_v3", variant="caffe", size=299)
