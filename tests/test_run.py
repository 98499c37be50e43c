"""End to end through the installed `mpt-run`: the run record, metrics, TensorBoard, resume,
divergence.
"""

from __future__ import annotations

import csv
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import MPT_RUN, ROOT, read_run, run_cli

REQUIRED_FIELDS = {
    "schema_version",
    "experiment",
    "task",
    "precision",
    "precision_config",
    "seed",
    "budget",
    "data",
    "model",
    "status",
    "reason",
    "metrics",
    "steps",
    "skipped_steps",
    "loss_scale",
    "samples_per_s",
    "peak_memory_bytes",
    "wall_time_s",
    "device",
    "versions",
    "git_commit",
    "config",
    "diagnostics",
    # schema 2
    "hint",
    "diverged_layer",
    "host",
    "pid",
}


@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_smoke_run_leaves_a_complete_record(tmp_path: Path, precision: str) -> None:
    run_cli("experiment=demo", "budget=smoke", f"precision={precision}", run_dir=tmp_path)
    rec = read_run(tmp_path)
    assert REQUIRED_FIELDS <= rec.keys()
    assert rec["schema_version"] == 5
    assert rec["status"] == "completed" and rec["reason"] is None and rec["hint"] is None
    assert (
        rec["experiment"] == "demo" and rec["precision"] == precision and rec["budget"] == "smoke"
    )
    assert rec["steps"] == 6  # budget=smoke: 6 iterations
    assert (
        0 <= rec["metrics"]["top1"] <= 100
        and rec["metrics"]["top1"] <= rec["metrics"]["top5"] <= 100
    )
    assert set(rec["loss_scale"]) >= {"initial", "final", "min"}
    assert rec["samples_per_s"] > 0 and rec["peak_memory_bytes"] > 0 and rec["wall_time_s"] > 0
    assert rec["versions"]["torch"] and rec["versions"]["hydra"] and rec["versions"]["python"]
    assert rec["precision_config"]["name"] == precision
    assert rec["config"]["precision"]["name"] == precision
    assert rec["data"]["train_size"] == 64  # budget=smoke trims the data to 64 examples
    # the other artefacts of a run
    assert (tmp_path / "checkpoints" / "last.pt").exists()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["step"] for r in rows if r["split"] == "train"] == ["2", "4", "6"]
    assert any(r["split"] == "eval" and r["top1"] for r in rows)


def test_tensorboard_events_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_cli("experiment=demo", "budget=smoke", "precision=amp", run_dir=tmp_path)
    events = EventAccumulator(str(tmp_path))  # the events sit in the run directory itself
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "train/loss_scale",
        "train/samples_per_s",
        "eval/top1",
    } <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6]
    assert (
        events.Scalars("train/loss_scale")[0].value == read_run(tmp_path)["loss_scale"]["initial"]
    )


def _launch(run_dir: Path, *overrides: str) -> subprocess.Popen:
    args = [
        MPT_RUN,
        "experiment=demo",
        "budget=paper",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not (run_dir / "checkpoints" / "last.pt").exists():
        assert proc.poll() is None, (
            f"run ended before its first checkpoint: {proc.stderr.read()[-2000:]}"
        )
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)


# 4 epochs of 16 steps: checkpoints every 6 steps, so a kill lands mid-epoch
# Dropout makes the run draw from the global RNG every step: a resume that shifted that stream
# (e.g. the DataLoader drawing its seed from it) would change the result.
RESUME_SETTINGS = (
    "trainer.epochs=4",
    "data.train_limit=512",
    "data.batch_size=32",
    "trainer.checkpoint_every=6",
    "trainer.log_every=5",
    "trainer.eval_every=20",
    "model.dropout=0.5",
)


@pytest.mark.slow
def test_killed_run_resumes_to_identical_metrics(tmp_path: Path) -> None:
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run_cli("experiment=demo", "budget=paper", *RESUME_SETTINGS, run_dir=whole, timeout=600)
    proc = _launch(broken, *RESUME_SETTINGS)
    _wait_for_checkpoint(proc, broken)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    assert read_run(broken)["status"] == "running"  # killed mid-way: the record says it never ended
    run_cli(
        "experiment=demo",
        "budget=paper",
        *RESUME_SETTINGS,
        "resume=true",
        run_dir=broken,
        timeout=600,
    )
    a, b = read_run(whole), read_run(broken)
    assert b["status"] == "completed" and b["resumed"] is True
    assert a["metrics"] == b["metrics"]  # exactly, not approximately
    assert a["steps"] == b["steps"]

    def rows(d):
        return [(r["step"], r["split"], r["loss"]) for r in csv.DictReader(open(d / "metrics.csv"))]  # noqa: E731

    assert rows(whole) == rows(broken)


# slow: tests/test_faults.py checks SIGTERM (interrupted, 143) in the default suite, and the
# resume of an interrupted run through the command the message prints
@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_records_the_stop(tmp_path: Path) -> None:
    proc = _launch(tmp_path, *RESUME_SETTINGS)
    _wait_for_checkpoint(proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM  # 143, as for any process it ends
    rec = read_run(tmp_path)
    assert rec["status"] == "interrupted" and "SIGTERM" in rec["reason"]
    assert "resume=true" in rec["hint"] and "Traceback" not in proc.stderr.read()
    run_cli(
        "experiment=demo",
        "budget=paper",
        *RESUME_SETTINGS,
        "resume=true",
        run_dir=tmp_path,
        timeout=600,
    )
    assert read_run(tmp_path)["status"] == "completed"


def test_resume_of_a_completed_run_does_nothing(tmp_path: Path) -> None:
    run_cli("experiment=demo", "budget=smoke", run_dir=tmp_path)
    before = (tmp_path / "run.json").read_text()
    run_cli("experiment=demo", "budget=smoke", "resume=true", run_dir=tmp_path)
    assert (tmp_path / "run.json").read_text() == before


def test_divergence_is_a_result_and_the_sweep_goes_on(tmp_path: Path) -> None:
    # An absurd learning rate makes the FP32 loss non-finite; the run ends `diverged`, exit 0,
    # and the next job of the multirun still runs.
    proc = subprocess.run(
        [
            MPT_RUN,
            "-m",
            "experiment=demo",
            "budget=smoke",
            "optim.lr=1e30,0.05",
            "trainer.max_steps=20",
            "trainer.log_every=1",
            "trainer.diverge_patience=3",
            "trainer.progress=false",
            f"paths.runs_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # sweep directories are named by their overrides
    sweep = tmp_path / "demo" / "fp32-smoke" / "seed0"
    diverged = read_run(next(sweep.glob("optim.lr=1e+30,*")))
    healthy = read_run(next(sweep.glob("optim.lr=0.05,*")))
    assert diverged["status"] == "diverged" and diverged["diverged_at_step"] >= 1
    assert "non-finite" in diverged["reason"] and "overwrite=true" in diverged["hint"]
    assert "diverged_layer" in diverged and diverged["metrics"] is None  # no result
    assert healthy["status"] == "completed"


def test_missing_data_folder_gives_a_clear_message(tmp_path: Path) -> None:
    proc = run_cli(
        "experiment=demo",
        "data=imagenet",
        f"data.root={tmp_path / 'nowhere'}",
        "budget=smoke",
        run_dir=tmp_path / "run",
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    # refused at start-up, before torch loads (the loader's layout message came only after it)
    assert f"data.root={tmp_path / 'nowhere'} does not exist" in proc.stderr
    assert 'README.md, "Data", gives each layout' in proc.stderr
    # a refusal before the run starts: the directory it would have used is not even created
    assert not (tmp_path / "run").exists()


def test_same_seed_gives_same_initial_weights_under_every_preset() -> None:
    import torch
    from conftest import compose

    from mpt_repro.precision import PrecisionPolicy
    from mpt_repro.tasks import build_task

    weights = {}
    for preset in ["fp32", "amp"] + [
        p
        for p in ("mixed", "no_master", "fp16", "bf16")
        if (ROOT / "conf/precision" / f"{p}.yaml").exists()
    ]:
        cfg = compose(["experiment=demo", "budget=smoke", f"precision={preset}"])
        policy = PrecisionPolicy(
            cfg.precision, torch.device("cpu"), paper_loss_scale=cfg.paper_loss_scale
        )
        task = build_task(cfg, torch.device("cpu"), policy)
        weights[preset] = [p.detach().clone() for p in task.model.parameters()]
    reference = weights.pop("fp32")
    assert len(weights) >= 1
    for preset, ws in weights.items():
        for a, b in zip(reference, ws, strict=True):
            # low-precision storage holds the same initial weights, rounded once: compare in its
            # dtype
            assert torch.equal(a.to(b.dtype), b), preset


@pytest.mark.slow
def test_resume_leaves_a_diverged_run_alone(tmp_path: Path) -> None:
    args = (
        "experiment=demo",
        "budget=smoke",
        "optim.lr=1e30",
        "trainer.log_every=1",
        "trainer.diverge_patience=2",
    )
    run_cli(*args, run_dir=tmp_path)
    before = (tmp_path / "run.json").read_text()
    assert read_run(tmp_path)["status"] == "diverged"
    run_cli(*args, "resume=true", run_dir=tmp_path)  # a re-run sweep: the result stands
    assert (tmp_path / "run.json").read_text() == before


def test_a_run_directory_that_trained_on_other_data_is_refused_with_or_without_resume(
    tmp_path: Path,
) -> None:
    # data.num_classes is not part of the directory's name when pinned (hydra.run.dir), and the
    # synthetic data reads it
    run_cli("experiment=demo", "budget=smoke", "data=synthetic", run_dir=tmp_path)
    before = (tmp_path / "run.json").read_text()
    # without resume=true it was told to use resume=true, which then refused (issue 34): both
    # now give the same answer, whose way out is another folder
    for resume in ([], ["resume=true"]):
        proc = run_cli("experiment=demo", "budget=smoke", "data=synthetic", *resume,
                       "data.num_classes=5", run_dir=tmp_path, check=False)  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run:")]
        assert f"{tmp_path} holds a run with data.num_classes=10, not 5; continuing it" in line
        assert "paths.runs_dir=DIR, or overwrite=true" in line
        assert "To keep it, run with resume=true" not in line
    assert (tmp_path / "run.json").read_text() == before  # the earlier result is untouched


@pytest.fixture
def torch_backends():
    """The global cuDNN and determinism flags, restored after the test."""
    import torch

    saved = torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled()
    yield
    torch.backends.cudnn.benchmark = saved[0]
    torch.use_deterministic_algorithms(saved[1])


def test_backends_follow_the_trainer_config(torch_backends) -> None:
    """cuDNN autotunes where shapes repeat and not for Faster R-CNN's one image per step at its own
    size; trainer.deterministic=true also fixes cuBLAS's workspace (its reductions otherwise vary
    from run to run), unless the user set one."""
    import torch
    from conftest import compose

    from mpt_repro.run import set_backends

    environ: dict[str, str] = {}
    set_backends(compose(["experiment=resnet50"]).trainer, environ)
    assert torch.backends.cudnn.benchmark and environ == {}
    set_backends(compose(["experiment=faster_rcnn"]).trainer, environ)
    assert not torch.backends.cudnn.benchmark
    set_backends(compose(["experiment=demo", "trainer.deterministic=true"]).trainer, environ)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert not torch.backends.cudnn.benchmark and torch.are_deterministic_algorithms_enabled()
    environ = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    set_backends(compose(["experiment=demo", "trainer.deterministic=true"]).trainer, environ)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
