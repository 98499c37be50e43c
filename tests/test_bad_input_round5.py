"""Issue 44, through the real commands: never delete what it did not write, never wait on a file
that is not a file, and every damaged input one line.

One sweep of real runs (demo, smoke, fp32 and mixed) is shared by the module; each case breaks a
copy of it by hand, as a user's folder gets broken, and runs mpt-report, mpt-run or mpt-advise on
it. Several cases share one process where the command allows it (one report lists every damaged
record; one driver process runs the report's --out refusals one after the other). A FIFO case
has a time limit, so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import MPT_RUN, ROOT, read_run
from test_faults import one_line_error

SMOKE = ("experiment=demo", "budget=smoke", "trainer.progress=false")
PY = sys.executable


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "MPT_PLUGINS"}
    return {**base, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **extra}


def run(args: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", env())
    kw.setdefault("cwd", ROOT)
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """runs/demo/fp32-smoke/seed0, as mpt-run writes it."""
    root = tmp_path_factory.mktemp("round5") / "runs"
    done = run([MPT_RUN, *SMOKE, f"paths.runs_dir={root}"], 300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def copy_run(sweep: Path, root: Path, preset: str, seed: int, edit=None) -> Path:
    """A copy of the run as seed `seed` (record and config say so) in the folder of `preset` (its
    name: the record's preset stays fp32), the record changed by `edit(record)`."""
    src = sweep / "demo" / "fp32-smoke" / "seed0"
    dst = root / "demo" / f"{preset}-smoke" / f"seed{seed}"
    shutil.copytree(src, dst)
    record = read_run(dst)
    record["seed"] = record["config"]["seed"] = seed
    if edit is not None:
        edit(record)
    (dst / "run.json").write_text(json.dumps(record))
    return dst


def fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


# ------------------------------------------------------------------ one report, every damage


def _damaged_folder(sweep: Path, root: Path) -> dict[str, Path]:
    """Good runs at seeds 0 and 1; every other seed broken one way (the issue's list)."""
    for seed in (0, 1):
        copy_run(sweep, root, "fp32", seed)
    put = {
        "fifo items": copy_run(sweep, root, "fp32", 2),
        "fifo metrics": copy_run(sweep, root, "fp32", 3),
        "cut items": copy_run(sweep, root, "fp32", 4),
        "pickled items": copy_run(sweep, root, "fp32", 5),
        "huge metric": copy_run(sweep, root, "fp32", 6, lambda r: r["metrics"].update(top1=1e308)),
        "unknown preset": copy_run(sweep, root, "fp33", 7, lambda r: r.update(precision="fp33")),
        "no config": copy_run(sweep, root, "fp32", 8, lambda r: r.pop("config")),
        "direction": copy_run(sweep, root, "fp32", 9, lambda r: r.update(higher_is_better=False)),
        "other step": copy_run(sweep, root, "fp32", 10),
    }
    items = put["other step"] / "eval_items.npz"
    with np.load(items) as data:
        columns = {k: data[k] for k in data.files}
    np.savez_compressed(items, **{**columns, "_step": np.asarray(3)})
    fifo(put["fifo items"] / "eval_items.npz")
    fifo(put["fifo metrics"] / "metrics.csv")
    items = put["cut items"] / "eval_items.npz"
    items.write_bytes(items.read_bytes()[:200])
    objects = np.array([{"not": "a number"}] * 64, dtype=object)
    np.savez(put["pickled items"] / "eval_items.npz", correct=objects, _step=np.asarray(6))
    (root.parent / "bench").mkdir()  # runs/ -> bench/ beside it, read by every plain report
    put["fifo bench"] = fifo(root.parent / "bench" / "speed.json")
    return put


def _package_with_a_bad_claim(tmp_path: Path) -> Path:
    """A copy of the package whose conf/claims/ holds a claims file broken by hand (a negative
    tolerance), so that the report reads it as it reads the suite's own. (The issue's case, a
    tolerance written as a number, was an AttributeError in every report; the claims loader now
    takes a number as a tolerance: a claims file it refuses stands for any damage.)"""
    copy = tmp_path / "pkg"
    shutil.copytree(ROOT / "mpt_repro", copy / "mpt_repro", symlinks=False)
    claim = {
        "keys": ["table1.alexnet.mixed"],
        "statement": "mixed matches fp32",
        "section": "§4.1",
        "setting": "real",
        "why": "a claims file edited by hand",
        "runs": {
            "experiment": "demo",
            "budget": "smoke",
            "presets": ["fp32"],
            "seeds": list(range(6)),
        },
        "tests": [
            {
                "kind": "delta",
                "preset": "fp32",
                "reference": "fp32",
                "expect": "matches",
                "tolerance": "-2",  # edited by hand: no tolerance is below 0
            }
        ],
    }
    (copy / "mpt_repro" / "conf" / "claims" / "zz_edited.yaml").write_text(json.dumps(claim))
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    return copy


@pytest.mark.timeout(120)
def test_one_report_lists_every_damaged_input_and_reports_the_rest(sweep, tmp_path) -> None:
    """A FIFO items file, metrics.csv or bench JSON hung mpt-report; a cut items file, a metric
    of 1e308, a claims file with a numeric tolerance and a broken plugin were tracebacks; an
    unknown preset became a column, a record without config relabelled every run, records that
    disagree on higher_is_better passed. Now: one report, each listed, the good runs reported."""
    root = tmp_path / "runs"
    put = _damaged_folder(sweep, root)
    package = _package_with_a_bad_claim(tmp_path)
    path = os.pathsep.join([str(package), str(tmp_path / "plugins")])
    out = tmp_path / "report"
    args = [PY, "-m", "mpt_repro.report.cli", str(root), "--out", str(out), "--quiet"]
    # from tmp_path: `python -m` puts the working folder first on the path, and the package
    # read must be the copy
    done = run(args, 100, cwd=tmp_path, env=env(PYTHONPATH=path, MPT_PLUGINS="broken_plugin"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    text = (out / "report.md").read_text()
    listed = text.split("## Runs not in the tables")[1]

    def line_of(where: Path | str) -> str:
        found = [x for x in listed.splitlines() if x.startswith(f"- `{where}`")]
        assert found, (where, listed[:4000])
        return "\n".join(found)

    assert "eval_items.npz is a FIFO (named pipe), not a file mpt-run wrote" in line_of(
        put["fifo items"]
    )
    assert "metrics.csv is a FIFO (named pipe)" in line_of(put["fifo metrics"])
    assert "eval_items.npz cannot be used (not a complete .npz archive, cut short" in line_of(
        put["cut items"]
    )
    assert "holds pickled Python objects, not the number columns" in line_of(put["pickled items"])
    assert "eval_items.npz holds the evaluation of step 3, the record's 6" in line_of(
        put["other step"]
    )
    assert "a FIFO (named pipe), not a benchmark file" in line_of(put["fifo bench"])
    assert "top1=1e+308 beyond any value a run records" in line_of(put["huge metric"])
    assert "precision 'fp33' is no preset of this suite" in line_of(put["unknown preset"])
    assert "no `config`" in line_of(put["no config"])
    assert "higher_is_better is false for top1" in line_of(put["direction"])
    claims = package / "mpt_repro" / "conf" / "claims"
    assert "the paper's claims could not be judged" in line_of(claims)
    assert "zz_edited.yaml" in line_of(claims)
    assert "the experiment plugin 'broken_plugin' raised RuntimeError" in listed
    assert "named by MPT_PLUGINS" in listed
    # the runs that are fine are reported, and nothing else became a column or a group
    runs = (out / "runs.csv").read_text()
    assert "fp33" not in runs and "fp33" not in (out / "groups.csv").read_text()
    tabled = {(r["precision"], r["seed"]) for r in _csv(out / "runs.csv")}
    assert tabled == {("fp32", s) for s in (*range(6), 10)}  # items, curves: flagged, kept
    # an items file of pickled objects: said what it is, never numpy's advice to load it unsafely
    deltas = (out / "deltas.csv").read_text()
    assert "allow_pickle" not in deltas + text and "unsafely" not in deltas + text


def _csv(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return [{**r, "seed": int(r["seed"])} for r in csv.DictReader(f)]


# ------------------------------------------------------------------ --out: only what it wrote

DRIVER = """
import json, sys
from mpt_repro.report import cli
results = []
for case in json.loads(sys.argv[1]):
    results.append(cli.main(case))
print(json.dumps(results))
"""


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under folder (dot-files included) and what it holds: links as their target."""
    found: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        found[rel] = (
            f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes() if p.is_file() else "/"
        )
    return found


@pytest.mark.timeout(120)
def test_the_report_replaces_only_a_folder_it_wrote(sweep, tmp_path) -> None:
    """A folder of dot-files was deleted whole (a home folder: .bashrc, .ssh/id_rsa, a git repo),
    so were the runs of `mpt-report X/.runs --out X`, a .gitignore kept in a report's folder;
    `--out .` was a traceback; a symlinked --out became a folder beside a dangling link."""
    runs = tmp_path / "X" / ".runs"
    copy_run(sweep, runs, "fp32", 0)
    dots = tmp_path / "dots"
    for name, text in {
        ".bashrc": "alias ll=ls",
        ".ssh/id_rsa": "KEY",
        ".proj/.git/HEAD": "x",
    }.items():
        (dots / name).parent.mkdir(parents=True, exist_ok=True)
        (dots / name).write_text(text)
    home = tmp_path / "home"
    (home / ".profile").parent.mkdir()
    (home / ".profile").write_text("PATH=...")
    target = tmp_path / "disk" / "report"
    target.parent.mkdir()
    (tmp_path / "link").symlink_to(target)
    long_name = tmp_path / ("a" * 300)
    before = {p: _tree(p) for p in (dots, tmp_path / "X", home)}
    r = str(runs)
    cases = [
        [r, "--out", str(dots), "--quiet", "--no-plots"],  # 0 dot-files only
        [r, "--out", str(tmp_path / "X"), "--quiet", "--no-plots"],  # 1 holds the runs
        [r, "--out", ".", "--quiet", "--no-plots"],  # 2 the current folder
        [r, "--out", "/", "--quiet", "--no-plots"],  # 3 the root
        [r, "--out", str(home), "--quiet", "--no-plots"],  # 4 $HOME
        [r, "--out", str(tmp_path / "link"), "--quiet", "--no-plots"],  # 5 a link: written
        [r, "--out", str(tmp_path / "link"), "--quiet", "--no-plots"],  # 6 its own: replaced
        [str(long_name), "--quiet"],  # 7 a name past the file system's 255 bytes
    ]
    cwd = tmp_path / "here"
    cwd.mkdir()
    elsewhere = str(tmp_path / "xdg")  # matplotlib and fontconfig keep their caches there
    done = run(
        [PY, "-c", DRIVER, json.dumps(cases)],
        cwd=cwd,
        env=env(HOME=str(home), MPLCONFIGDIR=elsewhere, XDG_CACHE_HOME=elsewhere),
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [2, 2, 2, 2, 2, 0, 0, 2], done.stderr
    assert "Traceback" not in done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("mpt-report:")]
    assert f"--out {dots} holds files a report does not write (.bashrc, .proj/" in lines[0]
    assert f"--out {tmp_path / 'X'} holds the runs folder {runs}" in lines[1]
    assert "--out . is the current folder" in lines[2]
    assert "--out / is the root folder" in lines[3]
    assert f"--out {home} is your home folder" in lines[4]
    assert f"{long_name} cannot be read (File name too long)" in lines[7]
    assert {p: _tree(p) for p in before} == before  # nothing touched
    assert list(cwd.iterdir()) == []
    # the link still names the report's folder; no dangling .link.old-* is left beside it
    assert (tmp_path / "link").is_symlink() and (target / "report.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["report"]
    # a file the user keeps in the report's folder: the next report refuses and keeps it
    (target / ".gitignore").write_text("*\n")
    again = run([PY, "-m", "mpt_repro.report.cli", r, "--out", str(target), "--no-plots"])
    line = one_line_report_error(again)
    assert "holds files a report does not write (.gitignore)" in line
    assert (target / ".gitignore").read_text() == "*\n" and (target / "report.md").is_file()


def one_line_report_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("mpt-report:")]
    return line


# ------------------------------------------------------------------ every reader, a FIFO in place


@pytest.fixture(scope="module")
def readers() -> SimpleNamespace:
    """Every reader the walk below calls, imported once (torch among them), outside its limit."""
    from mpt_repro.advise.evidence import AdviceError, load_evidence
    from mpt_repro.catalog import _load
    from mpt_repro.checkpoint import safe_load
    from mpt_repro.data.cifar import read_batch
    from mpt_repro.data.corpus import _token_lines
    from mpt_repro.data.imagenet import load_rgb
    from mpt_repro.data.parallel import read_lines
    from mpt_repro.data.speech import _transcript_lines
    from mpt_repro.errors import DataError, UserError
    from mpt_repro.evidence import read_items
    from mpt_repro.report.bench import bench_tables
    from mpt_repro.report.cli import _claims
    from mpt_repro.report.collect import load_metrics_csv, read_record
    from mpt_repro.safeio import NotARegularFile
    from mpt_repro.telemetry.records import read_records

    return SimpleNamespace(
        claims_section=_claims,
        AdviceError=AdviceError,
        load_evidence=load_evidence,
        _load=_load,
        safe_load=safe_load,
        read_batch=read_batch,
        data_readers=(_token_lines, load_rgb, read_lines, _transcript_lines),
        DataError=DataError,
        UserError=UserError,
        read_items=read_items,
        bench_tables=bench_tables,
        load_metrics_csv=load_metrics_csv,
        read_record=read_record,
        NotARegularFile=NotARegularFile,
        read_records=read_records,
    )


@pytest.mark.timeout(20, func_only=True)  # the limit: the walk itself, imports aside
def test_every_reader_refuses_a_fifo_without_waiting(sweep, readers, tmp_path, monkeypatch) -> None:
    """Each of the suite's readers, given a FIFO where its file goes: a refusal naming it, within
    the time limit (each used to wait for a writer for ever)."""
    r = readers
    run_dir = copy_run(sweep, tmp_path, "fp32", 0)
    for name in ("eval_items.npz", "metrics.csv", "telemetry.jsonl", "x.yaml", "data_batch_1"):
        fifo(run_dir / name)
    fifo(run_dir / "checkpoints" / "last.pt")
    for reader, name in (
        (r.read_items, "eval_items.npz"),
        (r.safe_load, "checkpoints/last.pt"),
        (r.read_records, "telemetry.jsonl"),
        (r._load, "x.yaml"),
    ):
        with pytest.raises(r.NotARegularFile, match="is a FIFO"):
            reader(run_dir / name)
    assert r.load_metrics_csv(str(run_dir)) is None
    with pytest.raises(r.DataError, match="is a FIFO"):
        r.read_batch(run_dir / "data_batch_1")
    for reader in r.data_readers:  # a corpus, an image, a parallel text, a transcript
        with pytest.raises(r.UserError, match="is a FIFO"):  # mpt-run: one line, exit 2
            result = reader(run_dir / "data_batch_1")
            if hasattr(result, "__next__"):  # the streamed ones open at their first line
                next(result)
    with pytest.raises(r.AdviceError, match="telemetry.jsonl is a FIFO"):
        r.load_evidence(run_dir)
    fifo(run_dir / "run.json")
    assert "FIFO" in r.read_record(run_dir / "run.json")[1].reason
    with pytest.raises(r.AdviceError, match="run.json is a FIFO"):
        r.load_evidence(run_dir)
    (tmp_path / "bench").mkdir()
    fifo(tmp_path / "bench" / "b.json")
    assert "FIFO" in r.bench_tables(tmp_path / "bench")[1][0].reason
    claims = tmp_path / "conf" / "claims"  # the report's claims section reads conf/claims/
    claims.mkdir(parents=True)
    fifo(claims / "edited.yaml")
    monkeypatch.setattr("mpt_repro.catalog.conf_dir", lambda: tmp_path / "conf")
    table, problems = r.claims_section(None)
    assert table is None
    assert (
        problems[0].reason
        == "a FIFO (named pipe), not a claims file: never opened, and no claim judged"
    )


@pytest.mark.slow  # one more process with torch: the reader walk covers it in-process
@pytest.mark.timeout(60)
def test_mpt_advise_refuses_a_fifo_telemetry_file_in_one_line(sweep, tmp_path) -> None:
    run_dir = copy_run(sweep, tmp_path, "fp32", 0)
    fifo(run_dir / "telemetry.jsonl")
    done = run([PY, "-m", "mpt_repro.advise", str(run_dir)], 50)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == (
        f"mpt-advise: error: {run_dir / 'telemetry.jsonl'} is a FIFO (named pipe), not a regular "
        "file: mpt-advise never opens it; remove it, or run the diagnostic again\n"
    )


# ------------------------------------------------------------------ resume: FIFOs, unsafe files


def _interrupted(sweep: Path, runs: Path) -> Path:
    run_dir = copy_run(sweep, runs, "fp32", 0, lambda r: r.update(status="interrupted"))
    return run_dir


@pytest.mark.timeout(120)
def test_a_fifo_metrics_csv_or_last_pt_never_hangs_a_resume(sweep, tmp_path) -> None:
    """FIFO last.pt: "stopped before its first checkpoint"; FIFO metrics.csv: a resume that hung
    after "resumed from last.pt", and so did the command it printed. Now the FIFO checkpoint is
    named and passed over (previous.pt), and the FIFO metrics.csv is one line, exit 2."""
    runs = tmp_path / "runs"
    run_dir = _interrupted(sweep, runs)
    ckpt = run_dir / "checkpoints"
    shutil.copy(ckpt / "last.pt", ckpt / "previous.pt")
    fifo(ckpt / "last.pt")
    fifo(run_dir / "metrics.csv")
    done = run([MPT_RUN, *SMOKE, f"paths.runs_dir={runs}", "resume=true"], 100)
    line = one_line_error(done)
    assert f"{run_dir / 'metrics.csv'} is a FIFO (named pipe), not a regular file" in line
    assert "Remove it (the rows are rebuilt from the checkpoint)" in line
    log = (run_dir / "mpt-run.log").read_text()
    assert f"{ckpt / 'last.pt'} cannot be read (a FIFO (named pipe), not a checkpoint file" in log


@pytest.mark.slow  # one more process with torch: the reader walk covers it in-process
@pytest.mark.timeout(120)
def test_refused_checkpoints_say_what_the_file_is_not_how_to_load_it_unsafely(
    sweep, tmp_path
) -> None:
    """torch's "Re-running torch.load with weights_only set to False will likely succeed" was
    passed on; a suite that refuses pickles says what the file is instead."""
    import torch

    runs = tmp_path / "runs"
    run_dir = _interrupted(sweep, runs)
    ckpt = run_dir / "checkpoints"
    (ckpt / "last.pt").write_bytes(pickle.dumps({"step": 6}))  # a bare pickle stream
    torch.save({"step": 6, "x": np.array([object()], dtype=object)}, ckpt / "previous.pt")
    done = run([MPT_RUN, *SMOKE, f"paths.runs_dir={runs}", "resume=true"], 100)
    line = one_line_error(done)
    assert f"{ckpt / 'previous.pt'}: refused: it names numpy.dtypes.ObjectDType" in line
    log = (run_dir / "mpt-run.log").read_text()
    for advice in ("weights_only set to False", "Re-running", "likely succeed"):
        assert advice not in done.stderr + log
    from mpt_repro.checkpoint import safe_load  # what the bare pickle was called (passed over)

    with pytest.raises(ValueError, match="^a pickle stream, not a checkpoint torch.save wrote"):
        safe_load(ckpt / "last.pt")


# ------------------------------------------------------------------ plugins and the command line


def _plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "syntax_error.py").write_text("def f(:\n")
    (folder / "raises.py").write_text("raise RuntimeError('boom')\n")
    (folder / "exits.py").write_text("import sys\nsys.exit(0)\n")
    return folder


@pytest.mark.timeout(120)
def test_a_plugin_that_fails_in_any_way_is_one_line_and_help_goes_on(tmp_path) -> None:
    """A SyntaxError or RuntimeError in a plugin was a traceback, even for --help; a plugin that
    calls sys.exit(0) made mpt-run exit 0 having done nothing."""
    path = str(_plugins(tmp_path))
    runs = tmp_path / "runs"
    expected = {
        "syntax_error": "has a syntax error (invalid syntax, ",
        "raises": "raised RuntimeError while being imported (boom)",
        "exits": "called sys.exit(0) while being imported",
    }
    for name in ("syntax_error", "exits"):  # "raises": mpt-report's test runs one such
        words = expected[name]
        done = run(
            [MPT_RUN, *SMOKE, f"paths.runs_dir={runs}"], env=env(PYTHONPATH=path, MPT_PLUGINS=name)
        )
        line = one_line_error(done)
        assert f"the experiment plugin '{name}' {words}" in line
        assert "it is named by MPT_PLUGINS: fix it, or remove the name" in line
    assert not runs.exists()
    helped = run([MPT_RUN, "--help"], env=env(PYTHONPATH=path, MPT_PLUGINS=",".join(expected)))
    assert helped.returncode == 0 and "Traceback" not in helped.stderr, helped.stderr[-2000:]
    assert "experiment=" in helped.stdout and "demo" in helped.stdout
    for name, words in expected.items():
        assert f"Not listed: the experiment plugin '{name}' {words}" in helped.stdout


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """docs/adding-an-experiment.md's toy experiment, written out as test_plugins does."""
    from test_plugins import doc_files

    folder = tmp_path_factory.mktemp("toy")
    for name, text in doc_files().items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.mark.timeout(120)
def test_the_plugin_search_path_goes_where_hydra_reads_it(toy) -> None:
    """`mpt-run experiment=toyreg --cfg job` (the doc's command) failed with "unrecognized
    arguments: hydra.searchpath=[...]"; a trailing -m gave a false "no such experiment"."""
    plugin = env(PYTHONPATH=str(toy), MPT_PLUGINS="toyreg")
    shown = run([MPT_RUN, "experiment=toyreg", "--cfg", "job"], cwd=toy, env=plugin)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "task: toyreg" in shown.stdout and "hydra.searchpath" not in shown.stderr
    swept = run([MPT_RUN, "experiment=toyreg", "model.width=0", "-m"], cwd=toy, env=plugin)
    assert "model.width must be positive" in one_line_error(swept)
    assert not (toy / "results").exists()


PROBE = """
import sys
from mpt_repro import cli
sys.argv = ['mpt-run', *sys.argv[1:]]
try:
    cli.main()
except SystemExit as e:
    print('exit', e.code, 'torch' in sys.modules)
"""


@pytest.mark.timeout(120)
def test_a_missing_task_class_and_a_fifo_config_are_refused_before_torch(toy, tmp_path) -> None:
    """A task target that does not exist was found only after torch loaded and a run folder was
    made; a FIFO among a plugin's config files kept Hydra waiting."""
    broken = tmp_path / "broken"
    shutil.copytree(toy / "toyreg", broken / "toyreg")
    init = broken / "toyreg" / "__init__.py"
    init.write_text(init.read_text().replace("toyreg.task:", "toyreg.no_such_module:"))
    runs = tmp_path / "runs"
    args = [PY, "-c", PROBE, "experiment=toyreg", "budget=smoke", f"paths.runs_dir={runs}"]
    done = run(args, cwd=tmp_path, env=env(PYTHONPATH=str(broken), MPT_PLUGINS="toyreg"))
    assert done.stdout.strip() == "exit 2 False", done.stdout + done.stderr[-2000:]
    assert (
        "task=toyreg: its class toyreg.no_such_module:ToyRegression, registered by toyreg, is in "
        "a module Python cannot find (no module named 'toyreg.no_such_module')" in done.stderr
    )
    assert not runs.exists()
    fifo(broken / "toyreg" / "conf" / "model" / "extra.yaml")
    done = run(args, cwd=tmp_path, env=env(PYTHONPATH=str(broken), MPT_PLUGINS="toyreg"))
    assert done.stdout.strip() == "exit 2 False", done.stdout + done.stderr[-2000:]
    extra = broken / "toyreg" / "conf" / "model" / "extra.yaml"
    assert f"{extra} is a FIFO (named pipe), not a config file: mpt-run never opens it" in (
        done.stderr
    )


# ------------------------------------------------------------------ data, advice


@pytest.mark.slow  # one more process with torch: the reader walk covers it in-process
@pytest.mark.timeout(120)
def test_an_object_dtype_cifar_batch_is_refused_naming_the_file(tmp_path) -> None:
    """It was a TypeError that named no file."""
    from test_data_cifar import PER_BATCH, write_cifar

    folder = write_cifar(tmp_path / "cifar")
    data = np.array([[None] * 3072] * PER_BATCH, dtype=object)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": data, b"labels": [0] * PER_BATCH}, f)
    args = [MPT_RUN, "experiment=cifar10", "budget=smoke", "trainer.device=cpu"]
    done = run([*args, f"data.root={folder}", f"paths.runs_dir={tmp_path / 'runs'}"])
    line = one_line_error(done)
    assert f"{folder / 'data_batch_3'}: b'data' holds object values, not uint8 pixels" in line


@pytest.mark.slow
def test_a_diagnostic_run_that_blew_up_is_not_advised_as_safe(tmp_path) -> None:
    """lr=1e12: loss 1.8e12, top-1 at chance, no non-finite loss; mpt-advise called every recipe
    safe and suggested the same learning rate again."""
    args = ["experiment=demo", "budget=smoke", "optim.lr=1e12", f"paths.runs_dir={tmp_path}"]
    done = run([PY, "-m", "mpt_repro.advise", *args, "--no-figures"], 500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "**The diagnostic run did not train** (its final loss" in done.stdout
    assert "an untrained 10-class model starts from" in done.stdout
    assert "| safe |" not in done.stdout and "is enough" not in done.stdout
    assert "optim.lr=1e+11" in done.stdout and "optim.lr=1e12 " not in done.stdout


@pytest.mark.slow
def test_a_task_without_a_per_item_column_names_it_and_its_eval_step(toy, tmp_path) -> None:
    """It said "per-item columns of different lengths: [0, 256]"."""
    broken = tmp_path / "broken"
    shutil.copytree(toy / "toyreg", broken / "toyreg")
    task = broken / "toyreg" / "task.py"
    full = 'return {"sq_err": err * err, "items": torch.ones_like(err)}'
    assert full in task.read_text()
    task.write_text(task.read_text().replace(full, 'return {"items": torch.ones_like(err)}'))
    args = [MPT_RUN, "experiment=toyreg", "budget=smoke", "trainer.progress=false"]
    done = run(
        [*args, f"paths.runs_dir={tmp_path / 'runs'}"],
        300,
        cwd=tmp_path,
        env=env(PYTHONPATH=str(broken), MPT_PLUGINS="toyreg"),
    )
    line = one_line_error(done, code=1)
    assert (
        "per-item columns of different lengths (items: 256, sq_err: 0 items): the task's "
        "eval_step returned no sq_err column, which its metrics' formulas read"
    ) in line


@pytest.mark.timeout(60)
def test_a_folder_name_past_255_bytes_is_one_line_for_mpt_run_and_mpt_advise(tmp_path) -> None:
    """`OSError: [Errno 36] File name too long`, a traceback (mpt-report's: the driver above)."""
    long_name = tmp_path / ("a" * 300)
    done = run([MPT_RUN, *SMOKE, f"paths.runs_dir={long_name}"], 50)
    line = one_line_error(done)
    assert f"cannot use {long_name}/demo/fp32-smoke/seed0 (File name too long" in line
    assert "a folder name of 300 bytes): choose a shorter paths.runs_dir=DIR" in line
    advised = run([PY, "-m", "mpt_repro.advise", str(long_name)], 50)
    assert advised.returncode == 2 and "Traceback" not in advised.stderr, advised.stderr[-2000:]
    assert advised.stderr == (
        f"mpt-advise: error: {long_name} cannot be read (File name too long): give a run "
        "directory\n"
    )
