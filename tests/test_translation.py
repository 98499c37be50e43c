"""experiment=translation (the paper's §4.4): the tutorial's tokenizer, vocabulary and buckets,
the parallel-corpus loader on files the test writes and on the embedded English-Spanish Bible,
the attention model's shapes and sizes, BLEU, and mpt-run + mpt-report under fp32, mixed and
no_scaling on the embedded corpus, synthetic pairs and a written WMT layout."""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, compose, option_config, read_run, run_cli

from mpt_repro.data.parallel import (
    EMBEDDED,
    EOS_ID,
    GO_ID,
    PAD_ID,
    UNK_ID,
    basic_tokenizer,
    bucketize,
    build_vocab,
    load_parallel,
    pad_batch,
    tokenize,
)
from mpt_repro.errors import DataError
from mpt_repro.evidence import bleu_statistics, dropped_share, from_columns, read_items
from mpt_repro.models.lstm_lm import LogUniformSampler
from mpt_repro.models.seq2seq import AttentionSeq2Seq, tf_parameter_count
from mpt_repro.tasks.translation import Translation

BUCKETS = [(5, 10), (10, 15), (20, 25), (40, 50)]
LONG_EN, LONG_FR = " ".join(["word"] * 60), " ".join(["mot"] * 60)  # past the largest bucket
EN = ["The cat sat.", "I have 12 dogs!", "Hello, world", 'She said: "yes"', "Go (now)."] * 8
FR = ["Le chat était assis.", "J'ai 12 chiens!", "Bonjour, monde", "Elle a dit: \"oui\"",
      "Va (maintenant)."] * 8  # fmt: skip


# -- tokens, vocabularies, buckets ----------------------------------------------------------------
def test_basic_tokenizer_splits_punctuation_and_normalises_digits() -> None:
    assert basic_tokenizer("  I'm here, at 12:30 (now)!  ") == [
        "I", "'", "m", "here", ",", "at", "12", ":", "30", "(", "now", ")", "!",
    ]  # fmt: skip
    assert tokenize("Room 42.", normalize_digits=True) == ["Room", "00", "."]
    assert tokenize("Room 42.", normalize_digits=False) == ["Room", "42", "."]
    assert basic_tokenizer("a-b c/d") == ["a-b", "c/d"]  # only the tutorial's characters split


def test_vocabulary_is_specials_then_by_count_ties_in_first_seen_order() -> None:
    vocab = build_vocab([["b", "a", "c"], ["a", "d", "c"], ["a"]], size=7)
    assert vocab.words == ["_PAD", "_GO", "_EOS", "_UNK", "a", "c", "b"]  # cut at 7; d after b
    assert vocab.encode(["a", "zzz"]) == [4, UNK_ID]
    assert (PAD_ID, GO_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)


def test_pairs_go_to_the_first_bucket_they_fit_and_pad_as_the_tutorial() -> None:
    pairs = [([5, 6], [7]), ([5] * 4, [7] * 9), ([5] * 9, [7] * 3), ([5] * 40, [7])]
    data = bucketize(pairs, BUCKETS)
    # target + _EOS must be shorter than the bucket's target length: 9 + 1 = 10 is not < 10
    assert [len(p) for p in data.pairs] == [1, 2, 0, 0] and data.dropped == 1
    enc, dec, tgt = pad_batch(data.pairs[0], data.buckets[0])
    assert enc.tolist() == [[0, 0, 0, 6, 5]]  # (source + pads) reversed
    assert dec.tolist() == [[GO_ID, 7, EOS_ID] + [PAD_ID] * 7]
    assert tgt.tolist() == [[7, EOS_ID] + [PAD_ID] * 8]  # shifted by one, padding weight 0


# -- the parallel-corpus loader -------------------------------------------------------------------
def write_wmt(
    root: Path, en=EN, fr=FR, dev_in_subfolder: bool = True, dev: tuple | None = None
) -> Path:
    """giga-fren.release2.fixed.{en,fr}.gz (as training-giga-fren.tar holds them) and
    dev/newstest2013.{en,fr} (as dev-v2.tgz unpacks): the first 6 lines, or `dev` (en, fr)."""
    root.mkdir(parents=True, exist_ok=True)
    dev_lines = dev or (en[:6], fr[:6])
    for lang, lines, dev_text in (("en", en, dev_lines[0]), ("fr", fr, dev_lines[1])):
        with gzip.open(root / f"giga-fren.release2.fixed.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        folder = root / "dev" if dev_in_subfolder else root
        folder.mkdir(exist_ok=True)
        (folder / f"newstest2013.{lang}").write_text("\n".join(dev_text) + "\n", encoding="utf-8")
    return root


def wmt_cfg(root: Path, **fields):
    return option_config("data", name="wmt15_enfr", root=str(root), **fields)


def test_the_release_layout_reads_into_vocabularies_and_buckets(tmp_path) -> None:
    data = load_parallel(wmt_cfg(write_wmt(tmp_path)), 12, 30, BUCKETS)
    assert len(data.source_vocab) == 12  # cut at the vocabulary size
    assert len(data.target_vocab) == 4 + 24  # below it: the specials and every French token
    # the most frequent English tokens; "." and '"' tie (16 each), "." seen first
    assert data.source_vocab.words[4:6] == [".", '"']
    assert "00" in data.target_vocab.index  # digits normalised
    assert (len(data.train), len(data.eval)) == (40, 6) and data.train.dropped == 0
    # the references keep the words (no _UNK), in the eval pairs' bucket order
    first = data.eval.pairs[0][0][1][:-1]
    assert [len(p) for p in data.eval.pairs] == [3, 3, 0, 0]  # dev lines 0, 2, 5 | 1, 3, 4
    assert data.references[0] == tokenize(FR[0], True)  # bucket 0 in file order
    assert data.references[3] == tokenize(FR[1], True)  # "I have 12 dogs!": 5 tokens, bucket 1
    assert data.target_vocab.decode(first) == data.references[0]


def test_a_missing_or_malformed_corpus_names_the_layout(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_parallel(wmt_cfg(tmp_path / "nowhere"), 10, 10, BUCKETS)
    with pytest.raises(DataError, match=r"no giga-fren.release2.fixed.en .*newstest2013.fr"):
        load_parallel(wmt_cfg(tmp_path), 10, 10, BUCKETS)
    root = write_wmt(tmp_path / "short", fr=FR[:-1], dev_in_subfolder=False)
    with pytest.raises(DataError, match="has 40 lines but .* has 39"):
        load_parallel(wmt_cfg(root), 10, 10, BUCKETS)


def test_mpt_run_refuses_an_evaluation_or_a_corpus_with_nothing_to_score(tmp_path) -> None:
    """Every dev pair longer than the largest bucket (it gave loss 0, perplexity 1, BLEU 0 and
    `completed`), a corpus of blank lines (perplexity 1.008), and a dev set of blank targets:
    refused while the data loads, one line each naming the file and the setting, exit 2,
    nothing written (one sweep)."""
    too_long = write_wmt(tmp_path / "long", dev=([LONG_EN] * 6, [LONG_FR] * 6))
    blank = write_wmt(tmp_path / "blank", en=[""] * 40, fr=[""] * 40)
    blank_dev = write_wmt(tmp_path / "blank_dev", dev=(EN[:6], [""] * 6))
    proc = run_cli("-m", "experiment=translation", "budget=smoke", "trainer.device=cpu",
                   "data=wmt15_enfr",
                   f"data.root={too_long},{blank},{blank_dev}",
                   f"paths.runs_dir={tmp_path / 'runs'}", check=False,
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run: error:")]
    assert errors[0] == (
        f"mpt-run: error: {too_long / 'dev' / 'newstest2013.en'}: none of its 6 sentence pairs "
        "fits a bucket of model.buckets (the largest, [40, 50], takes fewer than 40 source "
        "tokens and fewer than 50 target tokens with _EOS), so evaluation would score nothing; "
        "add a larger bucket to model.buckets, or use a dev set of shorter sentences"
    )
    assert errors[1] == (
        f"mpt-run: error: {blank / 'giga-fren.release2.fixed.en.gz'}: each of its 40 lines is "
        "blank (no token after tokenisation): there is nothing to translate; point data.root "
        "at a parallel corpus whose files hold sentences"
    )
    assert errors[2] == (
        f"mpt-run: error: {blank_dev / 'dev' / 'newstest2013.fr'}: the target of every dev pair "
        "that fits model.buckets (6 of 6 sentence pairs) is blank (no token after "
        "tokenisation): BLEU would have no reference word and the perplexity would score only "
        "_EOS; point data.root at a corpus whose newstest2013 files hold sentences"
    )
    assert not (tmp_path / "runs").exists()


def test_a_limit_that_cuts_the_dev_set_is_named(tmp_path) -> None:
    root = write_wmt(tmp_path, dev=([LONG_EN] * 3 + EN[:3], [LONG_FR] * 3 + FR[:3]))
    with pytest.raises(DataError, match=r"none of its 2 sentence pairs \(its first, "
                       r"data.eval_limit=2\) fits"):  # fmt: skip
        load_parallel(wmt_cfg(root, eval_limit=2), 12, 30, BUCKETS)
    data = load_parallel(wmt_cfg(root), 12, 30, BUCKETS)  # 3 fit, 3 too long: counted
    assert (len(data.eval), data.eval.dropped) == (3, 3)


def embedded_refs(split: str) -> list[str]:
    with gzip.open(EMBEDDED["bible_enes"] / f"{split}.ref.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_the_embedded_bible_loads_with_its_sizes_and_no_verse_in_two_splits() -> None:
    """The numbers of mpt_repro/data/embedded/README.md; every pair fits the tutorial's buckets
    (the build left longer ones out); a verse reference in one split only."""
    d = compose(["data=bible_enes"]).data  # conf/data/bible_enes.yaml as mpt-run composes it
    assert d.root is None and (d.source_lang, d.target_lang) == ("en", "es")
    data = load_parallel(d, 8000, 8000, BUCKETS)
    assert (len(data.train), len(data.eval)) == (21717, 1055)
    assert data.train.dropped == 0 and data.eval.dropped == 0
    assert (len(data.source_vocab), len(data.target_vocab)) == (8000, 8000)
    assert data.source_vocab.words[4:7] == [",", "the", "and"]
    assert data.target_vocab.words[4:7] == [",", "y", "de"]
    assert "embedded bible_enes" in data.description
    refs = {split: embedded_refs(split) for split in ("train", "dev", "test")}
    assert [len(r) for r in refs.values()] == [21717, 1055, 1219]
    for split, lines in refs.items():
        assert len(set(lines)) == len(lines), f"a verse twice in {split}"
    assert not set(refs["train"]) & set(refs["dev"])
    assert not set(refs["train"]) & set(refs["test"]) and not set(refs["dev"]) & set(refs["test"])
    assert refs["dev"][0] == "Genesis 19:3"  # chapter 19 is the KJV's 19th: index 18 -> dev


def test_the_embedded_corpus_stays_small() -> None:
    """Under 2 MiB in all, each file far below git's large-file warnings."""
    sizes = [p.stat().st_size for p in EMBEDDED["bible_enes"].glob("*.gz")]
    assert len(sizes) == 9 and sum(sizes) < 2 * 2**20


# -- the model ------------------------------------------------------------------------------------
def test_attention_model_shapes_decoding_and_sampled_loss() -> None:
    torch.manual_seed(0)
    model = AttentionSeq2Seq(20, 30, size=16, num_layers=2)
    source, decoder_input = torch.randint(4, 20, (3, 5)), torch.randint(4, 30, (3, 10))
    features = model(source, decoder_input)
    assert features.shape == (3, 10, 16)
    assert model.greedy_decode(source, GO_ID, 7).shape == (3, 7)
    full = model.token_losses(features, decoder_input)
    assert full.shape == (3, 10) and torch.isfinite(full).all()
    # candidates covering the vocabulary: the sampled softmax is the full one
    everything = LogUniformSampler(30, 30)
    sampled = model.token_losses(features, decoder_input, everything, torch.Generator())
    assert torch.allclose(sampled, full, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # amp and bf16 on a CPU (oneDNN's LSTM)
        assert model(source, decoder_input).dtype == torch.bfloat16
    # forget-gate bias 1 in the first bias of every LSTM layer (gate order i, f, g, o)
    assert model.decoder[0].bias_ih[16:32].eq(1).all() and model.encoder.bias_ih_l1[:16].eq(0).all()


@pytest.mark.parametrize("layers", [3, 5])
def test_paper_size_parameter_count(layers) -> None:
    with torch.device("meta"):
        model = AttentionSeq2Seq(40000, 40000, size=1024, num_layers=layers)
    count = sum(p.numel() for p in model.parameters())
    # TF's count plus PyTorch's second LSTM bias: 4 x 1024 per layer, encoder and decoder
    assert count == tf_parameter_count(40000, 40000, 1024, layers) + 2 * layers * 4 * 1024
    expected = {3: 184_814_656, 5: 222_579_776}[layers]  # TF's, checked by hand
    assert tf_parameter_count(40000, 40000, 1024, layers) == expected


def evaluated(hypotheses: list[str], references: list[str], losses=None, tokens=None):
    """The task's evaluation of these decodes (per-pair columns as eval_step gives them)."""
    n = len(references)
    columns = {
        "loss": np.array(losses if losses is not None else [1.0] * n),
        "tokens": np.array(tokens if tokens is not None else [1] * n),
        "items": np.ones(n),
        **{k: np.array(v) for k, v in bleu_statistics(hypotheses, references).items()},
    }
    return from_columns(columns, Translation.formulas, Translation.item_unit)


def test_bleu_on_known_strings() -> None:
    found = evaluated(["le chat est là"], ["le chat est là"], losses=[2.0], tokens=[2])
    assert found.metrics["bleu"] == pytest.approx(100.0)
    assert found.metrics["perplexity"] == pytest.approx(math.e)  # exp(2 / 2)
    assert evaluated(["un chien"], ["le chat est là"]).metrics["bleu"] == pytest.approx(0.0)
    # 3 of 4 words, 2 of 3 bigrams, 1 of 2 trigrams
    assert evaluated(["le chat est ici"], ["le chat est là"]).metrics["bleu"] == pytest.approx(
        59.46, abs=0.01
    )
    assert found.counts == {"loss": 2, "perplexity": 2, "bleu": 1}
    assert found.units == {"loss": "tokens", "perplexity": "tokens", "bleu": "sentence pairs"}


def test_summed_sentence_statistics_give_sacrebleus_corpus_bleu() -> None:
    """evidence.Bleu over the per-sentence statistics summed = sacrebleu.corpus_bleu, also with
    a sentence without any 4-gram match and one shorter than its reference."""
    import sacrebleu

    hyps = ["le chat est ici", "un chien", "a b c d e", "x y", "il fait beau aujourd'hui"]
    refs = ["le chat est là", "le chat", "a b c d e f", "x y z w", "il fait beau"]
    assert evaluated(hyps, refs).metrics["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score, abs=1e-9
    )
    # a subset (as a bootstrap resample draws one): the same identity
    assert evaluated(hyps[1:3], refs[1:3]).metrics["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hyps[1:3], [refs[1:3]], tokenize="none").score, abs=1e-9
    )


def test_an_evaluation_of_no_pair_has_no_bleu_nor_perplexity() -> None:
    """Nothing scored is undefined (null, with the reason), never BLEU 0 or perplexity 1."""
    found = evaluated([], [])
    assert found.metrics == {"loss": None, "perplexity": None, "bleu": None}
    assert found.undefined["bleu"] == "no sentence pairs to score (0 sentence pairs evaluated)"
    assert found.undefined["perplexity"] == "no tokens to score (0 sentence pairs evaluated)"
    blank = evaluated([""], [""])  # pairs without a reference word: BLEU has nothing to match
    assert blank.metrics["bleu"] is None and "no words" in blank.undefined["bleu"]


# -- mpt-run and mpt-report -----------------------------------------------------------------------
PRESETS = ["fp32", "mixed", "no_scaling"]


# README.md's sweep (its table of costs): the embedded corpus, budget=smoke's default data
README_SWEEP = "mpt-run -m experiment=translation budget=smoke precision=fp32,mixed,no_scaling"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """budget=smoke under each preset on the embedded Bible (README's sweep as written), on
    synthetic pairs and on a written WMT layout: one sweep per data set (start-up is most of a
    smoke run's time); one thread, as a tiny model's steps are all per-op overhead."""
    base = tmp_path_factory.mktemp("translation")
    # the dev set's 6 first lines, and one longer than the largest bucket (left out, counted)
    wmt = write_wmt(base / "wmt", dev=(EN[:6] + [LONG_EN], FR[:6] + [LONG_FR]))
    for data in ([], ["data=synthetic"], ["data=wmt15_enfr", f"data.root={wmt}"]):
        args = [*README_SWEEP.split()[1:], *data]
        args += ["trainer.device=cpu", f"paths.runs_dir={base / 'runs'}"]
        run_cli(*args, env={"OMP_NUM_THREADS": "1"})
    return base / "runs"


def test_the_readme_lists_the_sweep_run_here() -> None:
    assert f"`{README_SWEEP}`" in (ROOT / "README.md").read_text()


def test_smoke_runs_record_perplexity_and_bleu(runs) -> None:
    records = [read_run(p.parent) for p in sorted(runs.rglob("run.json"))]
    assert sorted((r["data"]["name"], r["precision"]) for r in records) == sorted(
        (d, p) for d in ("bible_enes", "synthetic", "wmt15_enfr") for p in PRESETS
    )
    for r in records:
        assert r["status"] == "completed", r.get("reason")
        m = r["metrics"]
        assert math.isfinite(m["perplexity"]) and 0 <= m["bleu"] <= 100
        assert m["perplexity"] == pytest.approx(math.exp(m["loss"]), rel=1e-6)
        assert r["model"]["num_layers"] == 2 and r["model"]["softmax"] == "sampled (16 candidates)"
    real = next(r for r in records if r["data"]["name"] == "wmt15_enfr")
    assert real["data"]["train_pairs"] == 40 and real["data"]["eval_pairs"] == 6
    # the evidence under the metrics: 6 dev pairs scored, the 7th too long (dropped, counted)
    block = real["evaluation"]
    assert (block["items"], block["data_items"], block["unit"]) == (6, 7, "sentence pairs")
    assert block["dropped"] == {"longer_than_largest_bucket": 1}
    assert block["counts"]["bleu"] == 6 and block["units"]["perplexity"] == "tokens"
    step, items = read_items(Path(real["run_dir"]) / block["items_file"])
    assert step == block["step"] and len(items["key"]) == 6
    assert items["tokens"].sum() == block["counts"]["perplexity"]
    assert dropped_share(block) == pytest.approx(1 / 7)  # above DROPPED_WARN_SHARE
    bible = next(r for r in records if r["data"]["name"] == "bible_enes")
    assert bible["data"]["train_pairs"] == 96 and bible["data"]["eval_pairs"] == 24
    assert bible["data"]["root"] is None


def test_the_sampled_training_loss_is_named_apart_from_the_evaluation_loss(runs) -> None:
    """Training optimises a sampled softmax (16 candidates), evaluation scores the full one:
    metrics.csv and TensorBoard never put the two under one name."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = next(p.parent for p in sorted(runs.rglob("run.json")))
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    assert train and evals
    assert all(r["sampled_loss"] and not r["loss"] for r in train)
    assert all(r["loss"] and not r["sampled_loss"] for r in evals)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "train/sampled_loss" in tags and "eval/loss" in tags and "train/loss" not in tags


def test_report_shows_the_translation_table_and_figure_4(runs, tmp_path) -> None:
    from mpt_repro.report import cli

    out = tmp_path / "report"
    assert cli.main([str(runs), "--out", str(out), "--quiet"]) == 0
    report = (out / "report.md").read_text()
    assert "Machine translation: perplexity and BLEU per preset" in report
    assert "Paper (§4.4, Figure 4 [S]), no_scaling: slight degradation" in report
    tables = sorted(p.name for p in (out / "tables").glob("mt_*.csv"))
    assert tables and "bleu" in (out / "tables" / tables[0]).read_text()
    figures = sorted(p.name for p in (out / "plots").glob("translation_*_train_perplexity.png"))
    assert len(figures) == 3  # one per data set: the embedded Bible, synthetic, the WMT layout


def test_the_translation_docs_exist_and_cite_the_tutorial() -> None:
    doc = (ROOT / "docs" / "experiments_translation.md").read_text()
    assert "tutorials/rnn/translate" in doc and "budget=smoke" in doc


# -- resume, accumulation, DDP (slow: whole runs) -------------------------------------------------
SMOKE = ["experiment=translation", "budget=smoke", "data=synthetic", "trainer.log_every=1"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def train_losses(run_dir: Path) -> list[str]:
    with open(run_dir / "metrics.csv") as f:
        return [r["sampled_loss"] for r in csv.DictReader(f) if r["split"] == "train"]


@pytest.mark.slow
def test_resumed_run_continues_exactly(tmp_path) -> None:
    """6 steps straight == 3 steps, then resumed for 3 more: the batch order, the sampled-softmax
    candidates and the weights come back from the checkpoint."""
    common = [*SMOKE, "precision=mixed", "trainer.device=cpu"]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    run_cli(*common, "trainer.max_steps=6", run_dir=straight, env=ONE_THREAD)
    run_cli(*common, "trainer.max_steps=3", run_dir=broken, env=ONE_THREAD)
    record = read_run(broken)
    record["status"] = "running"  # what a killed run's record says: resume=true continues it
    (broken / "run.json").write_text(json.dumps(record))
    run_cli(*common, "trainer.max_steps=6", "resume=true", run_dir=broken, env=ONE_THREAD)
    a, b = read_run(straight), read_run(broken)
    assert b["status"] == "completed" and b["resumed"] is True and b["steps"] == 6
    assert train_losses(broken) == train_losses(straight)
    assert b["metrics"] == a["metrics"]


@pytest.mark.slow
def test_accumulation_and_two_processes(tmp_path) -> None:
    from test_distributed_tasks import mpt_run

    run_cli(*SMOKE, "trainer.accumulate=2", "trainer.device=cpu", run_dir=tmp_path / "acc",
            env=ONE_THREAD)  # fmt: skip
    acc = read_run(tmp_path / "acc")
    assert acc["status"] == "completed" and acc["steps"] == 5  # 10 batches of 8 per epoch / 2
    mpt_run([*SMOKE, "precision=mixed"], 2, tmp_path / "ddp")
    ddp = read_run(tmp_path / "ddp")
    assert ddp["status"] == "completed" and ddp["distributed"]["world_size"] == 2
    assert ddp["diagnostics"]["distributed"]["replica_max_abs_diff"] == 0.0
