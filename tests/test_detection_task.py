"""The detection task (mpt_repro/tasks/detection.py) in the one trainer: configs and schedules of
experiment=ssd / faster_rcnn, a step and an evaluation on a tiny VOC data set, run records and
resume through `mpt-run` (slow)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import build_task, compose, read_run, run_cli
from omegaconf import OmegaConf
from test_voc_data import write_voc

from mpt_repro.optim import lr_multiplier

PRESETS = ["fp32", "mixed", "no_scaling", "amp", "bf16", "fp16", "no_master", "adaptive", "tf32"]


@pytest.mark.parametrize("experiment", ["ssd", "faster_rcnn"])
@pytest.mark.parametrize("precision", PRESETS)
def test_every_precision_preset_composes(experiment: str, precision: str) -> None:
    cfg = compose([f"experiment={experiment}", f"precision={precision}"])
    assert cfg.task == "detection" and cfg.precision.name == precision


def test_paper_loss_scales() -> None:
    assert compose(["experiment=ssd"]).paper_loss_scale == 8  # Fig. 3: x8 is enough
    assert compose(["experiment=faster_rcnn"]).paper_loss_scale is None  # not in the paper


def drops(cfg, steps_per_epoch: int) -> list[int]:
    """Iterations at which the LR factor changes, under the trainer's own schedule."""
    plain = SimpleNamespace(**OmegaConf.to_container(cfg.optim))  # 120k calls: no DictConfig
    f = lr_multiplier(plain, steps_per_epoch, cfg.trainer.max_steps)
    return [i for i in range(1, cfg.trainer.max_steps) if f(i) != f(i - 1)]


@pytest.mark.parametrize(
    ("overrides", "images", "expected_drops", "total"),
    [
        # ssd_pascal.py: batch 32 on 07+12 trainval (16,551 images): x0.1 at 80k, 100k of 120k
        (["experiment=ssd"], 16551, [80000, 100000], 120000),
        # py-faster-rcnn end2end: iter_size 2 of one image on VOC07 trainval (5,011 images):
        # x0.1 at update 50k of 70k
        (["experiment=faster_rcnn"], 5011, [50000], 70000),
        (["experiment=ssd", "budget=short"], 5011, [8000, 10000], 12000),
        (["experiment=faster_rcnn", "budget=short"], 5011, [7000], 10000),
    ],
)
def test_schedules_fall_on_the_originals_iterations(overrides, images, expected_drops, total):
    cfg = compose(overrides)
    # as SampledTask.steps_per_epoch: batches per epoch, then trainer.accumulate per update
    spe = images // cfg.data.batch_size // cfg.trainer.accumulate
    assert drops(cfg, spe) == expected_drops
    assert cfg.trainer.max_steps == total and cfg.trainer.epochs * spe >= total


@pytest.mark.parametrize(
    ("budget", "images", "drop_at"), [("paper", 140000, 100000), ("short", 20000, 14000)]
)
def test_faster_rcnn_updates_on_two_images_and_keeps_the_schedule_in_images(
    budget, images, drop_at
):
    """py-faster-rcnn's solver has iter_size 2 with one image per pass: 70k updates see 140k
    images, the drop at update 50k after 100k images. The short budget keeps its schedule in
    images (20k images, the drop after 14k) as it was at one image per update."""
    cfg = compose(["experiment=faster_rcnn", f"budget={budget}"])
    per_update = cfg.data.batch_size * cfg.trainer.accumulate
    assert (cfg.data.batch_size, per_update) == (1, 2)
    assert cfg.trainer.max_steps * per_update == images
    spe = 5011 // cfg.data.batch_size // cfg.trainer.accumulate
    assert drops(cfg, spe) == [drop_at // per_update]


@pytest.fixture
def tiny_voc(tmp_path: Path) -> Path:
    objects = [("dog", False, 10, 12, 200, 180), ("person", True, 150, 40, 240, 190)]
    for year, split in (("2007", "trainval"), ("2012", "trainval"), ("2007", "test")):
        write_voc(
            tmp_path,
            year,
            split,
            {f"{year}{split}{i}": (250, 200, objects) for i in range(2)},
        )
    return tmp_path


class PerfectDetector(torch.nn.Module):
    """Returns given boxes (input pixels) in order, one image after the other."""

    def __init__(self, answers: list[dict]):
        super().__init__()
        self.answers = answers
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, images, sizes=None, targets=None):
        out, self.answers = self.answers[: len(images)], self.answers[len(images) :]
        return out


@pytest.mark.usefixtures("one_thread")
def test_ssd_task_trains_and_evaluates_on_a_tiny_voc(tiny_voc: Path) -> None:
    task, _ = build_task("experiment=ssd", "budget=smoke", f"data.root={tiny_voc}")
    assert len(task.data.train) == 2 and task.data.num_classes == 21
    assert task.metric_names == ["map", "map_area", "loss_loc", "loss_conf"]
    result = task.train_step(next(task.train_batches(0)))
    assert result.samples == 1 and torch.isfinite(result.loss)
    assert set(result.logs) == {"loss_loc", "loss_conf"}
    assert float(result.loss) == pytest.approx(float(sum(result.logs.values())))
    found = task.evaluate()
    metrics = found.metrics
    assert set(metrics) == {"map", "map_area"} and 0 <= metrics["map"] <= 100
    # mAP rests on the ground-truth objects: 2 dogs (the difficult person is not one)
    assert found.counts == {"map": 2, "map_area": 2} and found.units["map"] == "objects"
    assert (found.items, found.unit, found.columns) == (2, "images", None)
    detail = task.metrics_detail
    assert detail["eval_images"] == 2 and detail["num_positives"]["dog"] == 2
    assert detail["num_positives"]["person"] == 0  # difficult: not a positive
    assert set(detail["per_class_ap"]) == {"dog"}  # classes with ground truth only
    # biases: lr x2 and no weight decay (ssd_pascal.py), group 0 is what the trainer logs
    groups = task.optimizer.param_groups
    assert groups[1]["lr"] == 2 * groups[0]["lr"] and groups[1]["weight_decay"] == 0.0


@pytest.mark.usefixtures("one_thread")
def test_map_without_a_ground_truth_object_is_undefined_never_zero(tmp_path: Path) -> None:
    """Evaluation images whose only objects are difficult: nothing for an AP to recall, so mAP
    is null with the reason (it was 0.0), resting on 0 objects."""
    person = [("person", True, 150, 40, 240, 190)]
    for year, split, objects in (("2007", "trainval", [("dog", False, 10, 12, 200, 180)]),
                                 ("2012", "trainval", [("dog", False, 10, 12, 200, 180)]),
                                 ("2007", "test", person)):  # fmt: skip
        write_voc(tmp_path, year, split, {f"{year}{split}{i}": (250, 200, objects) for i in (0, 1)})
    task, _ = build_task("experiment=ssd", "budget=smoke", f"data.root={tmp_path}")
    found = task.evaluate()
    assert found.metrics == {"map": None, "map_area": None}
    assert found.counts == {"map": 0, "map_area": 0}
    why = "no ground-truth object (not difficult) in the 2 evaluation images"
    assert found.undefined == {"map": why, "map_area": why}


@pytest.mark.usefixtures("one_thread")
def test_evaluation_maps_detections_back_to_the_original_image(tiny_voc: Path) -> None:
    """A detector that answers the ground truth in input pixels scores 100 mAP: the warp to 300 px
    is undone before matching, and the difficult person is ignored, not missed."""
    task, _ = build_task("experiment=ssd", "budget=smoke", f"data.root={tiny_voc}")
    answers = []
    for i in range(len(task.data.eval)):
        _, t = task.data.eval[i]
        assert t["scale"].tolist() == pytest.approx([300 / 250, 300 / 200])
        answers.append(
            {"boxes": t["boxes"], "scores": torch.ones(len(t["boxes"])), "labels": t["labels"]}
        )
    task.model = PerfectDetector(answers)
    metrics = task.evaluate().metrics
    assert metrics == {"map": pytest.approx(100.0), "map_area": pytest.approx(100.0)}


@pytest.mark.usefixtures("one_thread")
def test_evaluation_gathers_every_ranks_detections(tiny_voc: Path, monkeypatch) -> None:
    """As rank 0 of 2, the task evaluates image 0 only; image 1's detections come from the
    other rank through all_gather_object. With them the perfect detector scores 100, without
    them image 1's dog would count as missed (50)."""
    from mpt_repro import distributed

    monkeypatch.setattr(distributed, "rank", lambda: 0)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    task, _ = build_task("experiment=ssd", "budget=smoke", f"data.root={tiny_voc}")
    answers = []
    for i in range(2):
        _, t = task.data.eval[i]
        answers.append(
            {"boxes": t["boxes"], "scores": torch.ones(len(t["boxes"])), "labels": t["labels"]}
        )
    task.model = PerfectDetector(answers[:1])
    scale = task.data.eval[1][1]["scale"].repeat(2)
    other = [(1, {**answers[1], "boxes": answers[1]["boxes"] / scale})]  # rank 1: original pixels
    monkeypatch.setattr(distributed, "all_gather_object", lambda mine: [mine, other])
    assert task.evaluate().metrics["map"] == pytest.approx(100.0)
    task.model = PerfectDetector(answers[:1])
    monkeypatch.setattr(distributed, "all_gather_object", lambda mine: [mine])
    assert task.evaluate().metrics["map_area"] == pytest.approx(50.0)


def test_faster_rcnn_drops_difficult_training_targets(tiny_voc: Path) -> None:
    task, _ = build_task("experiment=faster_rcnn", "budget=smoke", f"data.root={tiny_voc}")
    _, target = task.data.train[0]
    assert target["difficult"].tolist() == [False]  # py-faster-rcnn's use_diff false
    groups = task.optimizer.param_groups
    assert groups[1]["lr"] == 2 * groups[0]["lr"] and groups[1]["weight_decay"] == 5e-4


def test_a_detector_is_required(tiny_voc: Path) -> None:
    from mpt_repro.errors import ConfigError

    with pytest.raises(ConfigError, match="not a detector"):
        build_task("experiment=ssd", "budget=smoke", "model=digits_cnn", f"data.root={tiny_voc}")


def test_a_model_without_the_experiments_keys_is_refused_in_its_terms(tmp_path: Path) -> None:
    """experiment=ssd sets model.width; VGG-16's schema has no width: the refusal names the model
    choice, not a key the user never typed."""
    out = run_cli("experiment=ssd", "budget=smoke", "model=vgg16", run_dir=tmp_path, check=False)
    assert out.returncode == 2
    assert "does not fit this experiment: the experiment sets model.width" in out.stderr
    assert "Remove model.width" not in out.stderr and not (tmp_path / "run.json").exists()


def test_voc_without_a_root_says_where_to_point_it() -> None:
    from mpt_repro.errors import DataError

    with pytest.raises(DataError, match="data.root is not set.*VOCdevkit"):
        build_task("experiment=ssd", "budget=smoke")


# -- through mpt-run ---------------------------------------------------------------------------
def train_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv") as f:
        return [r for r in csv.DictReader(f) if r["split"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["ssd", "faster_rcnn"])
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_smoke_runs_complete_with_map_in_the_record(tmp_path: Path, experiment, precision) -> None:
    run_cli(f"experiment={experiment}", "budget=smoke", "data=synthetic", f"precision={precision}",
            run_dir=tmp_path)  # fmt: skip
    rec = read_run(tmp_path)
    assert rec["status"] == "completed" and rec["steps"] == 2 and rec["task"] == "detection"
    assert set(rec["metrics"]) == {"map", "map_area"} and rec["primary_metric"] == "map"
    assert rec["model"]["backbone_weights"].startswith("none")
    if experiment == "ssd" and precision == "mixed":
        assert rec["loss_scale"]["initial"] == 8.0 and rec["loss_scale"]["kind"] == "static"
    parts = {"ssd": "loss_conf", "faster_rcnn": "loss_cls"}[experiment]
    assert all(r[parts] for r in train_rows(tmp_path))


@pytest.mark.slow
def test_resumed_run_continues_exactly(tmp_path: Path) -> None:
    """4 steps straight == 2 steps, then resumed for 2 more: the augmentation's random draws,
    the sampler order and the weights all come back from the checkpoint."""
    common = [
        "experiment=ssd",
        "budget=smoke",
        "data=synthetic",
        "precision=fp32",
        "trainer.epochs=2",
    ]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    run_cli(*common, "trainer.max_steps=4", run_dir=straight)
    run_cli(*common, "trainer.max_steps=2", run_dir=broken)
    record = read_run(broken)
    record["status"] = "running"  # what a killed run's record says: resume=true continues it
    (broken / "run.json").write_text(json.dumps(record))
    run_cli(*common, "trainer.max_steps=4", "resume=true", run_dir=broken)
    a, b = read_run(straight), read_run(broken)
    assert b["status"] == "completed" and b["resumed"] is True and b["steps"] == 4
    assert [r["loss"] for r in train_rows(broken)] == [r["loss"] for r in train_rows(straight)]
    assert b["metrics"] == a["metrics"]


@pytest.mark.slow
def test_two_process_run_keeps_replicas_identical(tmp_path: Path):
    """DDP (2 Gloo processes): each rank trains on its share with its own augmentation and RPN
    sampling draws; the averaged gradients keep the replicas identical, and the evaluation
    (each rank its shard, gathered) completes."""
    from test_distributed_tasks import mpt_run

    args = ["experiment=faster_rcnn", "budget=smoke", "data=synthetic", "precision=fp32"]
    args += ["data.batch_size=1", "data.eval_batch_size=1", "data.synthetic_eval_size=3"]
    mpt_run(args, 2, tmp_path)
    rec = read_run(tmp_path)
    assert rec["status"] == "completed" and rec["distributed"]["world_size"] == 2
    assert rec["diagnostics"]["distributed"]["replica_max_abs_diff"] == 0.0
    assert set(rec["metrics"]) == {"map", "map_area"}
