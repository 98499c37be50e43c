"""DCGAN task: network shapes and depth, the image-folder loader, training through the Task
interface.
"""

from __future__ import annotations

import json
from pathlib import Path

import conftest
import pytest
import torch
from torch import nn

from mpt_repro.errors import DataError
from mpt_repro.models.dcgan import Discriminator, Generator, sample_noise

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def compose(*overrides: str):
    return conftest.compose(list(overrides))


def build(*overrides: str):
    return conftest.build_task("experiment=dcgan", "budget=smoke", *overrides)


def count(module: nn.Module, kind: type) -> int:
    return sum(isinstance(m, kind) for m in module.modules())


@pytest.mark.parametrize("size", [8, 16, 32])
def test_generator_output_shape_and_range(size):
    torch.manual_seed(0)
    g = Generator(latent_dim=10, channels=3, image_size=size, features=4)
    with torch.no_grad():
        list(g.net)[-2].weight *= 1000  # drive the output layer into tanh's saturation
        images = g(torch.randn(5, 10))
    assert images.shape == (5, 3, size, size)
    assert images.min() >= -1 and images.max() <= 1 and images.abs().max() > 0.99
    logits = Discriminator(channels=3, image_size=size, features=4)(images)
    assert logits.shape == (5,)


def test_paper_depth_at_128_pixels():
    # §4.6: G has 7 fractionally-strided convolutions (6 leaky ReLU, 1 tanh); D has 6 convolutions
    # and 2 fully connected layers.
    g, d = Generator(100, 3, 128, 2), Discriminator(3, 128, 2)
    assert count(g, nn.ConvTranspose2d) == 7 and count(g, nn.Conv2d) == 0
    assert count(g, nn.LeakyReLU) == 6 and count(g, nn.Tanh) == 1
    assert count(d, nn.Conv2d) == 6 and count(d, nn.Linear) == 2
    assert list(d.net)[-1].out_features == 1  # one logit: the sigmoid lives in the loss


def test_image_size_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        Generator(10, 1, 24, 4)


def test_image_folder_loader(tmp_path):
    from PIL import Image

    from mpt_repro.data import build_image_data

    cfg = compose(
        "experiment=dcgan", "budget=paper", "data.image_size=16"
    ).data  # conf/data/celeba.yaml
    assert cfg.name == "images" and cfg.root is None
    with pytest.raises(DataError, match="needs data.root"):
        build_image_data(cfg)
    cfg.root = str(tmp_path / "missing")
    with pytest.raises(DataError, match="not a folder"):
        build_image_data(cfg)
    (tmp_path / "empty").mkdir()
    cfg.root = str(tmp_path / "empty")
    with pytest.raises(DataError, match="no images"):
        build_image_data(cfg)
    faces = tmp_path / "celeba" / "img_align_celeba"
    faces.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    for i in range(101):  # small, non-square, like CelebA's 178x218 aligned crops
        pixels = torch.randint(0, 256, (27, 22, 3), generator=gen, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(faces / f"{i:06d}.png")
    cfg.root, cfg.train_limit, cfg.eval_limit = str(tmp_path / "celeba"), None, None
    data = build_image_data(cfg)
    assert (len(data.train), len(data.eval)) == (99, 2)  # 1 in 100 held out
    x, _ = data.train[0]
    assert x.shape == (3, 16, 16) and -1 <= x.min() < 0 < x.max() <= 1


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_training_steps_through_the_task_interface(precision, tmp_path):
    task, policy = build(f"precision={precision}")
    assert set(task.optimizers) == {"discriminator", "generator"}
    before = {k: [p.detach().clone() for p in m.parameters()] for k, m in task.models.items()}
    for i, batch in enumerate(task.train_batches(0)):
        result = task.train_step(batch)
        assert result.stepped and result.samples == 16
        assert {"d_loss", "g_loss", "d_real", "d_fake", "d_stepped", "g_stepped"} <= set(
            result.logs
        )
        assert (
            torch.isfinite(result.loss)
            and result.logs["d_stepped"].item() == result.logs["g_stepped"].item() == 1
        )
        if i == 2:
            break
    for name, model in task.models.items():  # both networks were updated
        assert any(not torch.equal(a, b) for a, b in zip(before[name], model.parameters())), name
    per_opt = policy.summary()["diagnostics"]["per_optimizer"]
    assert per_opt["discriminator"]["steps"] == per_opt["generator"]["steps"] == 3
    found = task.evaluate()
    metrics = found.metrics
    assert set(metrics) == set(task.metric_names)
    assert 0 < metrics["d_real"] < 1 and 0 < metrics["d_fake"] < 1
    # one item per held-out image, named by its index in the held-out set
    assert found.items == len(task.data.eval) == found.counts["g_loss"]
    assert sorted(found.columns["index"].tolist()) == list(range(len(task.data.eval)))


def test_discriminator_step_sees_only_its_own_gradients():
    """The G step back-propagates through D; none of that may leak into the next D step."""
    import copy

    task, policy = build("precision=fp32")
    batch = next(iter(task.train_batches(0)))
    task.train_step(batch)  # leaves the generator loss's gradients on D's parameters
    D, G = task.discriminator, task.generator
    # What the next D step's gradients must be: d_loss alone, on the same images and noise.
    rng = task.noise_rng.get_state()
    Dc, Gc = copy.deepcopy(D), copy.deepcopy(G)
    real = task._real(batch[0])  # the iteration's one micro-batch
    z = sample_noise(real.shape[0], task.cfg.model, "cpu", generator=task.noise_rng)
    fake = Gc(z).detach()
    d_loss = task._bce(Dc(real), True) + task._bce(Dc(fake), False)
    expected = torch.autograd.grad(d_loss, list(Dc.parameters()))
    task.noise_rng.set_state(rng)
    captured = []
    step = task.opt_d.step

    def spy(**kwargs):
        captured.extend(p.grad.clone() for p in D.parameters())
        return step(**kwargs)

    task.opt_d.step = spy
    task.train_step(batch)
    assert len(captured) == len(expected)
    for got, want in zip(captured, expected):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)


def test_sample_grid_goes_to_tensorboard_and_the_run_directory(tmp_path):
    task, _ = build("precision=fp32")

    class Writer:  # what the trainer passes: a SummaryWriter logging into the run directory
        log_dir = str(tmp_path)
        images: list = []

        def add_image(self, tag, image, step):
            self.images.append((tag, image.shape, step))

    writer = Writer()
    task.log_media(writer, 12)
    png = tmp_path / "samples" / "step_000012.png"
    assert png.is_file()
    from PIL import Image

    side = 8 * 8 + 9 * 2  # 8 x 8 samples of 8 px with 2 px padding
    assert Image.open(png).size == (side, side)
    assert writer.images == [("samples/fixed_noise", torch.Size([3, side, side]), 12)]
    assert torch.equal(task.sample_grid(), task.sample_grid())  # fixed noise: the same grid


def test_paper_config():
    cfg = compose("experiment=dcgan", "budget=paper")
    assert cfg.data.image_size == 128 and cfg.trainer.max_steps == 100000
    assert cfg.optim.name == "adam" and list(cfg.optim.betas) == [0.5, 0.999]
    assert cfg.paper_loss_scale == 1.0  # §4.6: no loss scaling


def test_both_optimizers_decay_every_parameter_as_radfords_code():
    """dcgan_code's Adam adds l2 = 1e-5 times each parameter to its gradient (coupled L2), for
    every generator and discriminator parameter, BN gains and biases included."""
    task, _ = build("precision=fp32")
    for opt, model in (
        (task.opt_g, task.models["generator"]),
        (task.opt_d, task.models["discriminator"]),
    ):
        groups = opt.param_groups
        assert {g["weight_decay"] for g in groups} == {1e-5}
        assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
        assert not any(g.get("decoupled_weight_decay") for g in groups)  # L2, not AdamW


def test_mpt_run_smoke(tmp_path):
    run_dir = tmp_path / "run"
    conftest.run_cli("experiment=dcgan", "budget=smoke", "precision=fp32", run_dir=run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed"
    assert set(record["metrics"]) == {"d_loss", "g_loss", "d_real", "d_fake"}
    assert sorted(p.name for p in (run_dir / "samples").glob("step_*.png"))
