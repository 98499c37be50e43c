"""What each known deviation from the authors' toolchains changes, measured on this machine
(docs/recipes.md#differences-from-the-authors-toolchains prints the tables):

    .venv/bin/python scripts/measure_deviations.py         # all three, ~5 min on 2 CPU cores
    .venv/bin/python scripts/measure_deviations.py --only tokenizer --out /tmp/dev

- speech: DeepSpeech 2's recurrent batch norm in its three layouts (model.rnn_norm: projected,
  DS2 §3.2; input, deepspeech.pytorch; input_all), real mpt-run runs on synthetic audio
  (budget=smoke widths, 32 steps, fp32, the same seeds), each layout's evaluation loss and CER
  paired with `projected` by mpt-report's own paired interval (mpt_repro.report.compare).
- tokenizer: data.tokenizer=bytes (the tutorial's) against text, on the embedded parallel corpus
  and on a giga-fren-like sample written here (French with U+00A0 before : ; ! ? and inside
  numbers, and non-ASCII digits): distinct tokens, the vocabulary at the configured size, the
  share of dev tokens that fall to _UNK, and the share of tokens the two split differently.
- alexnet: experiment=alexnet recipe=nvcaffe at budget=smoke on synthetic images (8 steps),
  precision=mixed (FP16 arithmetic) against pseudo_fp16 (FP16 storage, FP32 arithmetic: NVCaffe's
  `default_*_math: FLOAT`), fp32 as reference: the final training loss, the evaluation loss and
  the share of skipped steps.

Runs go to --out (a temporary folder unless given); nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SEEDS = (0, 1, 2)
LAYOUTS = ("projected", "input", "input_all")  # the first is the default, the others pair with it
# 32 steps of 4 utterances (4 epochs of the smoke budget's 32): long enough for the loss to move
SPEECH = ["experiment=speech", "budget=smoke", "data=synthetic", "precision=fp32"]
SPEECH += ["trainer.epochs=4", "trainer.max_steps=32"]
ALEXNET = ["experiment=alexnet", "recipe=nvcaffe", "budget=smoke", "data=synthetic"]
ALEXNET += ["data.train_limit=16", "trainer.max_steps=8"]  # 8 steps of 2, not the smoke's 2
ALEXNET_PRESETS = ("fp32", "pseudo_fp16", "mixed")


def mpt_run(overrides: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the GRU's per-frame steps: one thread
    subprocess.run([str(BIN / "mpt-run"), "-m", *overrides], cwd=cwd, env=env, check=True)


def records(folder: Path) -> list[tuple[Path, dict]]:
    return [(p.parent, json.loads(p.read_text())) for p in sorted(folder.rglob("run.json"))]


# -- speech ----------------------------------------------------------------------------------------
def measure_speech(out: Path, reuse: bool = False, seeds: tuple = SEEDS) -> list[str]:
    from mpt_repro.report.collect import load_runs
    from mpt_repro.report.compare import default_settings, paired_delta

    folder = out / "speech"
    folder.mkdir(parents=True, exist_ok=True)
    if not reuse:
        mpt_run(
            [*SPEECH, f"seed={','.join(map(str, seeds))}", f"model.rnn_norm={','.join(LAYOUTS)}"],
            folder,
        )
    runs, _ = load_runs(folder / "results" / "runs")
    layout = {str(d): r["config"]["model"]["rnn_norm"] for d, r in records(folder)}
    params = {
        r["config"]["model"]["rnn_norm"]: r["model"]["parameters"] for _, r in records(folder)
    }
    runs["layout"] = runs["path"].map(layout)
    lines = [
        f"| model.rnn_norm | parameters | eval loss (mean of {len(seeds)} seeds) "
        "| paired Δ loss vs projected, 95 % | CER % | paired Δ CER | training samples/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in LAYOUTS:
        mine, ref = runs[runs["layout"] == name], runs[runs["layout"] == LAYOUTS[0]]
        cells = [f"`{name}`", f"{params[name]:,}"]
        for metric in ("loss", "cer"):
            mean = mine[f"metric_{metric}"].mean()
            if name == LAYOUTS[0]:
                cells += [f"{mean:.2f}", "(reference)"]
                continue
            d = paired_delta(_primary(mine, metric), _primary(ref, metric), default_settings())
            cells += [f"{mean:.2f}", f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}] (n={d.n})"]
        cells.append(f"{mine['samples_per_s'].mean():.1f}")  # a loaded CPU: ratios only
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _primary(runs, metric: str):
    """The runs with `metric` as the one paired (the report pairs each task's primary metric)."""
    runs = runs.copy()
    runs["primary_metric"], runs["higher_is_better"] = metric, False
    return runs


# -- the translation tokenizer ---------------------------------------------------------------------
def giga_fren_like(n: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """(English, French) pairs in giga-fren's typography, from a made-up Zipf-distributed lexicon
    of 600 words: French puts U+00A0 (no-break space) before : ; ! ? and inside « », and groups
    thousands with it; one line in five carries a number in non-ASCII digits (Arabic-Indic,
    full-width, Devanagari), as giga-fren's web-crawled text does. English uses plain spaces."""
    rng = random.Random(seed)
    nbsp, marks = "\u00a0", (":", ";", "!", "?")
    syllables = ["ba", "cor", "di", "en", "fa", "gre", "li", "mon", "no", "pré", "ri", "sé", "tu"]
    lexicon = sorted({"".join(rng.choices(syllables, k=rng.randint(2, 3))) for _ in range(900)})
    lexicon = lexicon[:600]
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]
    zero = {"arabic": 0x0660, "fullwidth": 0xFF10, "devanagari": 0x0966}

    def words(k: int) -> list[str]:
        return rng.choices(lexicon, weights, k=k)

    def foreign_number() -> str:
        base = zero[rng.choice(sorted(zero))]
        return "".join(chr(base + int(c)) for c in str(rng.randint(1, 999)))

    pairs = []
    for i in range(n):
        first, second, quoted = words(rng.randint(3, 7)), words(rng.randint(3, 7)), words(2)
        mark, amount = rng.choice(marks), f"{rng.randint(1, 999)}{nbsp}{rng.randint(0, 999):03d}"
        extra = [foreign_number()] if i % 5 == 0 else []
        french = " ".join([*first, amount, *extra]) + f"{nbsp}{mark} " + " ".join(second)
        french += f" «{nbsp}{' '.join(quoted)}{nbsp}»{nbsp}!"
        english = " ".join([*first, amount.replace(nbsp, ","), *extra]) + f"{mark} "
        english += " ".join(second) + f' "{" ".join(quoted)}"!'
        pairs.append((english, french))
    return pairs


def tokenizer_rows(name: str, train, dev, size: int) -> list[str]:
    """One row per (language, tokenizer): distinct tokens, the vocabulary at `size`, dev OOV."""
    from mpt_repro.data.parallel import UNK_ID, tokenize, vocab_from_counts

    rows = []
    for side, lang in ((0, "source"), (1, "target")):
        split = {}
        for how in ("bytes", "text"):
            counts = Counter(t for pair in train for t in tokenize(pair[side], True, how))
            vocab = vocab_from_counts(counts, size)
            dev_ids = [i for pair in dev for i in vocab.encode(tokenize(pair[side], True, how))]
            oov = 100 * sum(i == UNK_ID for i in dev_ids) / max(1, len(dev_ids))
            split[how] = [tokenize(pair[side], True, how) for pair in train]
            rows.append(
                f"| {name} | {lang} | `{how}` | {len(counts):,} | {len(vocab):,} | {oov:.2f} |"
            )
        differ = sum(a != b for a, b in zip(split["bytes"], split["text"]))
        rows[-1] += f" {100 * differ / max(1, len(train)):.2f} |"
        rows[-2] += " |"
    return rows


TOKENIZER_CONFIG = ["experiment=translation", "budget=short"]  # the embedded Bible, 8,000 words


def translation_config():
    from hydra import compose, initialize_config_dir

    from mpt_repro.config import register_configs

    register_configs()  # the options' schemas, as mpt-run registers them
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", TOKENIZER_CONFIG)


def measure_tokenizer(cfg=None) -> list[str]:
    """The table, for `cfg` (TOKENIZER_CONFIG composed; composed here when None)."""
    from mpt_repro.data.parallel import corpus_root, read_pairs

    cfg = cfg if cfg is not None else translation_config()
    d, size = cfg.data, cfg.model.source_vocab_size
    root = corpus_root(d)
    train = list(read_pairs(d, root, d.train_prefix, None))
    dev = list(read_pairs(d, root, d.dev_prefix, None))
    lines = [
        f"| corpus | side | data.tokenizer | distinct tokens | vocabulary (cut at {size:,}) "
        "| dev tokens -> _UNK % | sentences tokenised differently % |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += tokenizer_rows(
        f"embedded {d.name} ({len(train):,} / {len(dev):,} pairs)", train, dev, size
    )
    return lines + sample_rows(size)


def sample_rows(size: int) -> list[str]:
    """The giga-fren-like sample's rows: its first 3/4 build the vocabulary, the rest is dev."""
    sample = giga_fren_like()
    cut = len(sample) * 3 // 4
    return tokenizer_rows(
        f"giga-fren-like ({cut} / {len(sample) - cut} pairs)", sample[:cut], sample[cut:], size
    )


# -- AlexNet's arithmetic --------------------------------------------------------------------------
def measure_alexnet(out: Path, reuse: bool = False, seeds: tuple = SEEDS) -> list[str]:
    folder = out / "alexnet"
    folder.mkdir(parents=True, exist_ok=True)
    if not reuse:
        mpt_run(
            [
                *ALEXNET,
                f"seed={','.join(map(str, seeds))}",
                f"precision={','.join(ALEXNET_PRESETS)}",
            ],
            folder,
        )
    by: dict[str, dict[int, tuple]] = {}
    for run_dir, r in records(folder):
        rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()]
        train = [float(row[3]) for row in rows[1:] if row[2] == "train"]
        summary = (train, r["metrics"]["loss"], r["skipped_steps"], r["steps"])
        by.setdefault(r["precision"], {})[r["seed"]] = summary
    lines = [
        f"| precision | arithmetic | last training loss (mean of {len(seeds)} seeds) | eval loss "
        "| largest \\|Δ\\| of a step's training loss vs fp32 | skipped steps |",
        "|---|---|---|---|---|---|",
    ]
    kinds = {"fp32": "FP32", "pseudo_fp16": "FP32 on FP16 storage", "mixed": "FP16 (FP32 sums)"}
    for preset in ALEXNET_PRESETS:
        got = by[preset]
        last = sum(g[0][-1] for g in got.values()) / len(got)
        evaluated = sum(g[1] for g in got.values()) / len(got)
        gap = max(abs(a - b) for seed, g in got.items() for a, b in zip(g[0], by["fp32"][seed][0]))
        skipped, steps = sum(g[2] for g in got.values()), sum(g[3] for g in got.values())
        lines.append(
            f"| `{preset}` | {kinds[preset]} | {last:.4f} | {evaluated:.4f} | {gap:.1e} "
            f"| {skipped}/{steps} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--only", help="comma-separated: speech, tokenizer, alexnet")
    parser.add_argument(
        "--reuse", action="store_true", help="tabulate the runs already in --out; train none"
    )
    args = parser.parse_args(argv)
    chosen = set((args.only or "speech,tokenizer,alexnet").split(","))
    unknown = chosen - {"speech", "tokenizer", "alexnet"}
    if unknown:
        print(f"--only: unknown {sorted(unknown)}; use speech, tokenizer, alexnet", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="deviations-"))
    tables = []
    if "speech" in chosen:
        tables.append(("DeepSpeech 2's recurrent batch norm", measure_speech(out, args.reuse)))
    if "tokenizer" in chosen:
        tables.append(("The translation tokenizer", measure_tokenizer()))
    if "alexnet" in chosen:
        tables.append(("AlexNet's arithmetic (NVCaffe recipe)", measure_alexnet(out, args.reuse)))
    for title, lines in tables:
        print(f"\n### {title}\n")
        print("\n".join(lines))
    print(f"\nruns in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
