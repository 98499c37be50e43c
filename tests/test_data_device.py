"""Device-side input: normalisation of uint8 batches, and synthetic data made once on the device
and gathered per step without host work."""

from __future__ import annotations

import pytest
import torch
from conftest import option_config
from torch.utils._python_dispatch import TorchDispatchMode

from mpt_repro.data import build_image_data
from mpt_repro.data.device import normalize_on_device
from mpt_repro.data.sampling import PoolBatches, build_epoch_loaders
from mpt_repro.data.synthetic import SyntheticImages

CPU = torch.device("cpu")


def test_normalize_on_device_matches_the_worker_side_normalisation():
    from torchvision import transforms as T

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8, generator=g)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    expect = torch.stack([T.Normalize(mean, std)(img.float() / 255) for img in x])
    torch.testing.assert_close(normalize_on_device(x, mean, std), expect, rtol=0, atol=2e-6)
    half = normalize_on_device(x, mean, std, torch.float16, torch.channels_last)
    assert half.dtype == torch.float16 and half.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(half.float(), expect, rtol=1e-3, atol=1e-3)
    with pytest.raises(TypeError, match="uint8"):
        normalize_on_device(x.float(), mean, std)


def synthetic_cfg(**kw):
    base = dict(
        name="synthetic",
        num_classes=5,
        channels=3,
        image_size=8,
        batch_size=4,
        synthetic_train_size=40,
        synthetic_eval_size=10,
        synthetic_pool=6,
    )
    base.update(kw)
    return option_config("data", **base)


class OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


def test_synthetic_pool_is_made_once_and_each_batch_is_a_gather():
    d = synthetic_cfg()
    data = build_image_data(d)
    loaders = build_epoch_loaders(data.train, data.eval, d, 4, seed=0, device=CPU)
    assert isinstance(loaders.train, PoolBatches)  # no DataLoader, no workers, no collate
    pool = data.train.pool
    assert pool.shape == (6, 3, 8, 8) and pool.dtype == torch.uint8
    loaders.sampler.set_epoch(0)
    order = list(loaders.sampler)
    ops = OpNames()
    with ops:
        batches = list(loaders.train)
    # per step: a slice of the epoch's order, one gather from the pool, the label lookup and
    # the normalisation; nothing is generated and nothing is built per sample
    assert len(batches) == 10 == loaders.sampler.batches_per_epoch()
    assert ops.names.count("randperm") == 1  # the epoch's order, drawn once by the sampler
    made = [n for n in ops.names if n.startswith(("rand", "normal", "uniform", "stack"))]
    assert made == ["randperm"]
    assert ops.names.count("index_select") == 10
    x, y = batches[1]
    idx = torch.tensor(order[4:8])
    expect = pool[idx % 6].float() / 127.5 - 1.0
    torch.testing.assert_close(x, expect, rtol=0, atol=1e-6)
    assert torch.equal(y, data.train.labels[idx]) and y.dtype == torch.int64
    # the next epoch reuses the same pool (made once)
    loaders.sampler.set_epoch(1)
    next(iter(loaders.train))
    assert data.train.pool.data_ptr() == pool.data_ptr()
    assert len(list(loaders.eval)) == 3  # 10 eval samples in batches of 4, the last one short


def test_synthetic_is_deterministic_and_respects_limits_and_dtype():
    d = synthetic_cfg(train_limit=12)
    a, b = build_image_data(d), build_image_data(d)
    la = build_epoch_loaders(a.train, a.eval, d, 4, 0, CPU, input_dtype=torch.float16)
    lb = build_epoch_loaders(b.train, b.eval, d, 4, 0, CPU, input_dtype=torch.float16)
    la.sampler.set_epoch(0)
    lb.sampler.set_epoch(0)
    xa, ya = next(iter(la.train))
    xb, yb = next(iter(lb.train))
    assert xa.dtype == torch.float16 and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert len(la.train) == 3  # train_limit=12 samples, batch 4
    # a limited split's sample k is the full split's sample k (Subset indices mapped on device)
    first = list(la.sampler)[:4]
    assert torch.equal(ya, a.train.dataset.labels[torch.tensor(first)])


def test_synthetic_samples_still_work_as_a_map_style_dataset():
    ds = SyntheticImages(10, 3, 8, 5, pool=4, seed=1)
    x, y = ds[7]
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and 0 <= y < 5
    assert -1.0 <= float(x.min()) and float(x.max()) <= 1.0
    torch.testing.assert_close(x, ds[3][0])  # 7 mod 4 = 3: the same pool image


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_synthetic_batches_are_born_on_the_gpu():
    d = synthetic_cfg()
    data = build_image_data(d)
    dev = torch.device("cuda")
    loaders = build_epoch_loaders(data.train, data.eval, d, 4, 0, dev)
    loaders.sampler.set_epoch(0)
    x, y = next(iter(loaders.train))
    assert x.device.type == "cuda" and y.device.type == "cuda"
    assert data.train.pool.device.type == "cuda"


def test_synthetic_images_keep_their_channel_count():
    # a 1-channel experiment (the demo's digits shape) on synthetic data: one mean and std per
    # channel, never broadcast to three
    from mpt_repro.data.synthetic import SyntheticImages

    ds = SyntheticImages(8, channels=1, image_size=4, num_classes=3, pool=4, seed=0)
    x, y = ds.batch(torch.arange(4))
    assert x.shape == (4, 1, 4, 4) and ds[0][0].shape == (1, 4, 4)
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0


def test_normalisation_constants_are_made_once_per_device_not_per_batch():
    """torch.tensor(list, device=cuda) in every batch waits for the GPU's queue each time
    (pytorch issue 120996): the mean and std are made on the first batch only."""
    from mpt_repro.bench.measure import SyncCounter

    mean, std = (0.1, 0.2, 0.3), (0.4, 0.5, 0.6)
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    first = normalize_on_device(x, mean, std)
    with SyncCounter() as counter:
        again = normalize_on_device(x, mean, std)
    assert counter.tensors == {} and torch.equal(first, again)
    with SyncCounter() as counter:  # another mean: both made once more
        normalize_on_device(x, (0.5,) * 3, std)
    assert counter.tensors == {"lift_fresh": 2}


def test_loader_workers_read_the_synthetic_pool_from_the_cpu():
    """BN recalibration reads the training set through a DataLoader, with data.num_workers
    worker processes: those must not touch the pool on the training device (a forked worker
    that touches CUDA fails). The meta device stands in for a GPU here: a worker reading the
    device pool would fail the same way (a meta tensor holds no data)."""
    import pickle

    from torch.utils.data import DataLoader, Subset

    on_device = SyntheticImages(6, 3, 8, 5, pool=4, seed=1)
    on_device.place(torch.device("meta"))
    assert on_device.pool.device.type == "meta"
    reference = SyntheticImages(6, 3, 8, 5, pool=4, seed=1)  # placed on the CPU
    loader = DataLoader(Subset(on_device, range(6)), batch_size=3, num_workers=1)
    xs, ys = zip(*loader)
    assert torch.equal(torch.cat(xs), torch.stack([reference[i][0] for i in range(6)]))
    assert torch.cat(ys).tolist() == [reference[i][1] for i in range(6)]
    # pickled for a spawned worker: no tensor of the training device goes along
    state = pickle.loads(pickle.dumps(on_device)).__dict__
    assert all(t.device.type == "cpu" for t in state.values() if torch.is_tensor(t))
