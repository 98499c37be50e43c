"""The first hour's rough edges (issue 48, item 4), each through the real command.

- a misspelt option of any group (`experiment=deom`, `budget=smok`) gets the "did you mean" a
  misspelt key gets, from the same machinery (catalog.nearest), and a cheap example (never
  budget=paper, GPU-days); an experiment no loaded plugin brings says how plugins are named;
- a data folder that is missing, a file or empty is refused before torch is imported;
- TensorBoard's HParams table holds a run from its start (status running) and its outcome at
  its end (TensorBoard keeps a run folder's first HParams record: runlog/hparams.py);
- "1 skipped step", not "1 skipped steps";
- `mpt-run --help` cuts a description where a clause ends, never inside parentheses or quotes;
- `make help` names what the demo runs; README's own-model sweep names a budget and its seeds;
- `reproduce_claims.py --tiny` writes its structure-only page apart from the real one.

Two training runs are spawned in all (a completed one shared by three tests, and one stopped by
SIGTERM); every refusal runs the CLI's entry function in a fresh process that reports whether
torch was imported.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MPT_RUN, ROOT, read_run, run_cli
from test_cli import _cli


def entry(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """mpt-run's entry function (this checkout's code) in a fresh process, which prints at exit
    whether torch was imported (test_cli's own runner)."""
    return _cli(*args, env=env)


def refusal(*args: str, env: dict | None = None) -> str:
    """The one line of a command refused before torch loads (exit 2, no traceback)."""
    proc = entry(*args, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("mpt-run: error: ")
    assert "torch imported: False" in proc.stdout
    return line.removeprefix("mpt-run: error: ")


# ---------------------------------------------------------------- did you mean, for every group


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("experiment=deom", "(did you mean experiment=demo?)"),
        ("budget=smok", "(did you mean budget=smoke?)"),
        ("precision=fp3", "(did you mean precision=fp32?)"),
        ("optim.lrr=0.1", "(did you mean optim.lr?)"),  # a key: the same rule, catalog.nearest
    ],
)
def test_a_misspelt_option_or_key_gets_the_nearest_one(typed: str, suggested: str) -> None:
    line = refusal(typed)
    assert suggested in line, line
    assert "budget=paper" not in line  # no example that trains for GPU-days


def test_an_option_close_to_nothing_gets_a_cheap_example() -> None:
    line = refusal("budget=quick")
    assert line == (
        "budget=quick: there is no such budget; budget is one of: paper, short, smoke "
        "(e.g. budget=smoke)"
    )


def test_an_experiment_no_plugin_brings_says_how_plugins_are_named() -> None:
    """A plugin's experiment whose module is not in MPT_PLUGINS: the line says how a plugin is
    named, and points at the page that shows it (which exists)."""
    line = refusal("experiment=toyreg", env={"MPT_PLUGINS": ""})
    assert line.startswith("experiment=toyreg: there is no such experiment; ")
    assert "did you mean" not in line and "(e.g. experiment=demo)" in line
    assert "named in MPT_PLUGINS or by an entry point (docs/adding-an-experiment.md)" in line
    assert (ROOT / "docs" / "adding-an-experiment.md").is_file()


# ---------------------------------------------------------------- the data folder, before torch


@pytest.mark.parametrize("kind", ["missing", "empty", "file"])
def test_a_data_folder_that_cannot_hold_the_data_is_refused_before_torch(tmp_path, kind) -> None:
    root = tmp_path / "cifar"
    if kind == "empty":
        root.mkdir()
    elif kind == "file":
        root.write_text("not a folder")
    runs = tmp_path / "runs"
    line = refusal("experiment=cifar10", "budget=smoke", f"data.root={root}",
                   f"paths.runs_dir={runs}")  # fmt: skip
    said = {
        "missing": "does not exist",
        "empty": "is an empty folder",
        "file": "is a file, not a folder",
    }
    assert line.startswith(f"data.root={root} {said[kind]}: point it at the folder of data cifar10")
    assert "data=synthetic" in line
    assert not runs.exists()  # nothing created


def test_an_empty_folder_for_an_embedded_corpus_says_to_leave_the_root_unset(tmp_path) -> None:
    (tmp_path / "corpus").mkdir()
    line = refusal("experiment=lstm_lm", "budget=smoke", f"data.root={tmp_path / 'corpus'}")
    assert "is an empty folder" in line and "leave data.root unset (null)" in line


# ---------------------------------------------------------------- a real run: HParams, counts


def hparams_of(folder: Path) -> tuple[str, str | None] | None:
    """(the status hyperparameter, the session's end status or None) of the HParams record in
    a TensorBoard run folder's event files, as TensorBoard's own accumulator reads them; None
    when the folder holds no record."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    events = EventAccumulator(str(folder))
    events.Reload()
    tags = events.Tags()["tensors"]
    if metadata.SESSION_START_INFO_TAG not in tags:
        return None
    content = events.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
    status = metadata.parse_session_start_info_plugin_data(content).hparams["status"]
    end = None
    if metadata.SESSION_END_INFO_TAG in tags:
        content = events.SummaryMetadata(metadata.SESSION_END_INFO_TAG).plugin_data.content
        end = api_pb2.Status.Name(metadata.parse_session_end_info_plugin_data(content).status)
    return status.string_value, end


# a dynamic scale from 2^24 overflows FP16 at the first step; one backoff brings it to ~17, where
# the demo's gradients fit: exactly one skipped step
ONE_SKIP = ["precision=mixed", "precision.init_scale=16777216", "precision.backoff_factor=1e-6"]
SMOKE = ["experiment=demo", "budget=smoke", "trainer.device=cpu"]


@pytest.fixture(scope="module")
def completed(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """A real smoke run that skipped exactly one step: (its mpt-run process, its directory)."""
    run_dir = tmp_path_factory.mktemp("completed") / "run"
    return run_cli(*SMOKE, *ONE_SKIP, run_dir=run_dir, env={"OMP_NUM_THREADS": "1"}), run_dir


def test_one_skipped_step_is_one_skipped_step(completed) -> None:
    proc, run_dir = completed
    assert read_run(run_dir)["skipped_steps"] == 1
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("  loss scale")]
    assert line.endswith("; 1 skipped step"), line
    assert "6 steps," in proc.stdout


def test_a_completed_run_s_hparams_are_its_outcome_in_its_own_folder(completed) -> None:
    _, run_dir = completed
    assert read_run(run_dir)["status"] == "completed"
    assert hparams_of(run_dir) == ("completed", "STATUS_SUCCESS")
    for status in ("running", "interrupted", "failed"):  # the start record is gone
        assert not (run_dir / status).exists()


def _logged_rows(metrics_csv: Path) -> int:
    """The rows a run has logged so far (metrics.csv is flushed at each row)."""
    return max(len(metrics_csv.read_text().splitlines()) - 1, 0) if metrics_csv.is_file() else 0


def test_a_run_is_in_the_hparams_table_from_its_start_and_stops_as_interrupted(tmp_path) -> None:
    """A run that would go on for ever: while it trains, TensorBoard's HParams table has it as
    `running` (the run folder `running/`, as run.json says); stopped by SIGTERM, `interrupted`
    (its checkpoint resumes it), and the `running` record is gone."""
    run_dir = tmp_path / "run"
    args = [
        MPT_RUN,
        *SMOKE,
        "precision=fp32",
        "trainer.epochs=100000",
        "trainer.max_steps=100000000",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        # SIGTERM once the loop has logged a step: one that arrives while the run is still
        # building (its `running` record is written just before the loop) stops it before any
        # checkpoint, which is `failed` by design (mpt_repro/stopping.py)
        seen, deadline = None, time.monotonic() + 240
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            trained = _logged_rows(run_dir / "metrics.csv") > 0
            seen = hparams_of(run_dir / "running") if trained else None
        assert seen == ("running", None), (seen, proc.poll())
        assert read_run(run_dir)["status"] == "running"
        assert hparams_of(run_dir) is None  # the run's own events: no record until it ends
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-3000:]
    assert read_run(run_dir)["status"] == "interrupted"
    assert hparams_of(run_dir / "interrupted") == ("interrupted", None)  # no end: it resumes
    assert not (run_dir / "running").exists() and hparams_of(run_dir) is None


# ---------------------------------------------------------------- help texts and the README


def test_help_cuts_a_description_where_a_clause_ends_never_inside_parentheses() -> None:
    proc = entry("--help")
    assert proc.returncode == 0 and "torch imported: False" in proc.stdout
    lines = proc.stdout.splitlines()
    cut = [line.removesuffix(" ...") for line in lines if line.endswith(" ...")]
    assert len(cut) > 10 and max(len(line) for line in lines) <= 100
    for line in cut:
        shown = re.sub(r"^\s+\S+(\s\[[^]]*\])?\s+", "", line)  # the description after the name
        assert shown.count("(") == shown.count(")"), line
        assert shown.count("[") == shown.count("]") and shown.count('"') % 2 == 0, line
        assert shown.count("`") % 2 == 0 and not shown.endswith((",", ";", ":")), line
    alexnet = next(line for line in lines if re.match(r"\s+alexnet\s", line))  # experiment=
    assert alexnet.endswith("(Krizhevsky et al. 2012) ...")  # it read `(Krizhevsky et al. ...`


def test_make_help_names_every_preset_the_demo_runs() -> None:
    script = (ROOT / "scripts" / "demo.py").read_text()
    presets = re.search(r'"--precisions", default="([^"]+)"', script).group(1).split(",")
    budget = re.search(r'"--budget", default="([^"]+)"', script).group(1)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    made = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    (demo,) = [line for line in made.stdout.splitlines() if line.split()[:1] == ["demo"]]
    assert len(presets) == 3 and all(re.search(rf"\b{p}\b", demo) for p in presets), demo
    assert f"budget={budget}" in demo


def test_the_readme_s_own_model_sweep_is_cheap_and_counts_its_seeds() -> None:
    from test_report_comparison import readme_block

    commands = readme_block("What does mixed precision do to my model?")
    runs = [c for c in commands if c.startswith("mpt-run")]
    assert runs and all("budget=short" in c for c in runs)  # not the 20-epoch recipe 15 times
    (seeds,) = {m for c in runs for m in re.findall(r"seed=([\d,]+)", c)}
    text = (ROOT / "README.md").read_text()
    assert f"{len(seeds.split(','))} paired seeds" in text and "with 2 seeds" not in text


def test_a_tiny_claims_page_never_lands_where_the_real_one_does() -> None:
    """`make reproduce-claims ARGS=--tiny` wrote results/claims/claims.md, the real page's place;
    its page is labelled and headed like the real one (tests/test_claims.py, the runner test)."""
    script = [sys.executable, str(ROOT / "scripts" / "reproduce_claims.py"), "--tiny"]
    before = (ROOT / "docs" / "claims.md").read_bytes()
    done = subprocess.run([*script, "--docs", "docs/claims.md"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "reproduce-claims: --tiny makes a structure-only page (budget=smoke, one seed a set): it "
        "never replaces docs/claims.md; leave out --tiny or --docs"
    )
    assert (ROOT / "docs" / "claims.md").read_bytes() == before
    plan = subprocess.run([*script, "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True).stdout  # fmt: skip
    sweeps = [line for line in plan.splitlines() if line.startswith("+ mpt-run -m")]
    assert sweeps and all(x.endswith(" paths.runs_dir=results/claims/tiny/runs") for x in sweeps)
