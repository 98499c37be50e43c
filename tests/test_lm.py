"""Language-model task: corpus loading, BPTT batches, the bigLSTM model, sampled softmax, resume."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from pathlib import Path

import conftest
import pytest
import torch

from mpt_repro.data.corpus import (
    EOS,
    UNK,
    Corpus,
    batchify,
    bptt_batches,
    build_vocab,
    num_bptt_batches,
)
from mpt_repro.errors import ConfigError, DataError
from mpt_repro.models.lstm_lm import LogUniformSampler, LSTMLanguageModel

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def compose(*overrides: str):
    return conftest.compose(list(overrides))


def build(*overrides: str):
    """A language-model task on the CPU from the real config (experiment=lstm_lm budget=smoke)."""
    return conftest.build_task("experiment=lstm_lm", "budget=smoke", *overrides)


def write_corpus(root: Path, train: str, valid: str = "a b\n", test: str = "b a\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in (("train", train), ("valid", valid), ("test", test)):
        (root / f"{name}.txt").write_text(text)
    return root


# -- corpus ---------------------------------------------------------------------------------------
def test_vocab_cutoff_unk_and_eos(tmp_path):
    root = write_corpus(
        tmp_path / "c", "the cat sat\nthe dog sat\n\nthe rare\n", valid="the unseen cat\n"
    )
    c = Corpus(root, min_freq=2)
    # kept: the (3), sat (2); <eos> 3 lines (the blank line is skipped); <unk>: cat, dog, rare
    assert c.vocab.words == [EOS, UNK, "the", "sat"]  # by count, ties alphabetical
    assert c.vocab.counts == [3, 3, 3, 2]
    v = c.vocab.index
    assert c.train.tolist() == [
        v["the"],
        v[UNK],
        v["sat"],
        v[EOS],
        v["the"],
        v[UNK],
        v["sat"],
        v[EOS],
        v["the"],
        v[UNK],
        v[EOS],
    ]
    assert c.valid.tolist() == [v["the"], v[UNK], v[UNK], v[EOS]]
    assert c.unk_rate("valid") == pytest.approx(0.5)


def test_max_vocab_keeps_the_most_frequent_and_merges_existing_unk():
    counts = Counter({"a": 5, "b": 4, "c": 3, UNK: 2})  # PTB files contain <unk> already
    vocab = build_vocab(counts, num_lines=1, max_vocab=4)
    assert set(vocab.words) == {"a", "b", EOS, UNK}
    assert vocab.counts[vocab.index[UNK]] == 2 + 3  # the file's own <unk> plus the cut word
    with pytest.raises(ConfigError):
        build_vocab(counts, 1, max_vocab=2)


def test_batchify_and_bptt_targets_are_shifted_by_one():
    ids = torch.arange(23)
    streams = batchify(ids, 4)  # 5 steps x 4 streams, the last 3 tokens dropped
    assert streams.shape == (5, 4)
    assert streams[:, 1].tolist() == [5, 6, 7, 8, 9]  # each column is a contiguous stretch
    batches = list(bptt_batches(streams, seq_len=3))
    assert len(batches) == num_bptt_batches(streams, 3) == 2
    (x0, y0), (x1, y1) = batches
    assert x0.shape == (3, 4) and x1.shape == (1, 4)  # the last window is shorter
    assert torch.equal(y0[:-1], x0[1:]) and torch.equal(y0[-1], x1[0])
    assert x0.dtype == torch.long
    # resume: skip=1 gives exactly the second window
    ((xs, ys),) = list(bptt_batches(streams, seq_len=3, skip=1))
    assert torch.equal(xs, x1) and torch.equal(ys, y1)


def test_missing_folder_and_bad_splits_raise_data_error(tmp_path):
    with pytest.raises(DataError, match="not a folder"):
        Corpus(tmp_path / "nope")
    root = write_corpus(tmp_path / "c", "a b\n")
    (root / "test.txt").unlink()
    with pytest.raises(DataError, match="test.txt is missing"):
        Corpus(root)
    root = write_corpus(tmp_path / "d", "a b\n", valid="\n  \n")
    with pytest.raises(DataError, match="valid.txt is empty"):
        Corpus(root)


def test_mpt_run_refuses_an_empty_or_too_short_validation_text(tmp_path):
    """An empty valid.txt, and one too short for the validation streams (data.eval_batch_size):
    one line each naming the file and the setting, exit 2, nothing written (one sweep)."""
    empty = write_corpus(tmp_path / "empty", "a b c d e f g\n" * 100, valid="")
    short = write_corpus(tmp_path / "short", "a b c d e f g\n" * 100, valid="a\n")
    proc = conftest.run_cli("-m", "experiment=lstm_lm", "budget=smoke", "trainer.device=cpu",
                            f"data.root={empty},{short}", f"paths.runs_dir={tmp_path / 'runs'}",
                            check=False, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run: error:")]
    assert errors[0] == (
        f"mpt-run: error: {empty / 'valid.txt'} is empty; data.root must be a folder with "
        "train.txt, valid.txt and test.txt (whitespace tokens, one sentence per line)"
    )
    assert errors[1] == (
        f"mpt-run: error: {short / 'valid.txt'}: 2 tokens are too few for 4 parallel streams "
        "(need 2 per stream); 4 streams come from data.eval_batch_size (and the number of "
        "processes): lower it, or use a longer valid.txt"
    )
    assert not (tmp_path / "runs").exists()  # refused while the data loads: nothing written


def test_embedded_corpus_is_the_documented_one():
    c = Corpus(None, min_freq=2)
    assert c.embedded
    # The numbers in mpt_repro/data/embedded/README.md: 65,579 words + 2,166 <eos> in train.
    assert (c.train.numel(), c.valid.numel(), c.test.numel()) == (
        65579 + 2166,
        9380 + 307,
        7635 + 273,
    )
    assert len(c.vocab) == 1908 + 2
    assert c.unk_rate("valid") < 0.1


# -- model and sampled softmax
# ----------------------------------------------------------------------
def test_projection_shapes():
    m = LSTMLanguageModel(vocab_size=50, embed_dim=12, hidden_size=32, num_layers=2, proj_size=8)
    p = dict(m.named_parameters())
    assert p["lstm.weight_ih_l0"].shape == (4 * 32, 12)
    assert p["lstm.weight_hh_l0"].shape == (4 * 32, 8)  # the recurrence sees the projection
    assert p["lstm.weight_hr_l0"].shape == (8, 32)
    assert p["lstm.weight_ih_l1"].shape == (4 * 32, 8)
    assert p["decoder.weight"].shape == (50, 8)
    h, c = m.init_hidden(3, CPU)
    features, (h2, c2) = m(torch.zeros(5, 3, dtype=torch.long), (h, c))
    assert features.shape == (5, 3, 8) and h2.shape == (2, 3, 8) and c2.shape == (2, 3, 32)


def _model_and_batch(vocab=40, seed=0):
    torch.manual_seed(seed)
    m = LSTMLanguageModel(vocab, 8, 16, 1, 0, 0.0)
    x = torch.randint(vocab, (6, 4))
    y = torch.randint(vocab, (6, 4))
    features, _ = m(x, m.init_hidden(4, CPU))
    return m, features, y


def test_sampled_softmax_is_finite_and_grads_reach_only_used_rows():
    m, features, y = _model_and_batch()
    sampler = LogUniformSampler(40, 5)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    loss = m.sampled_loss(features, y, sampler, g)
    assert torch.isfinite(loss)
    loss.backward()
    g.set_state(state)
    candidates, _, _ = sampler.sample(g, CPU)
    used = set(candidates.tolist()) | set(y.flatten().tolist())
    row_has_grad = m.decoder.weight.grad.abs().sum(1) > 0
    assert {i for i in range(40) if row_has_grad[i]} == used
    assert m.embedding.weight.grad.abs().sum() > 0 and m.lstm.weight_hh_l0.grad.abs().sum() > 0


def test_sampled_softmax_over_the_whole_vocabulary_is_the_full_softmax():
    # Every word a candidate with certainty (expected count 1): the only difference from the full
    # softmax would be the target counted twice, which the accidental-hit removal prevents.
    m, features, y = _model_and_batch()
    full = m.full_loss(features, y)
    sampled = m.sampled_loss(
        features, y, LogUniformSampler(40, 40), torch.Generator().manual_seed(0)
    )
    assert sampled.item() == pytest.approx(full.item(), rel=1e-5)


def test_log_uniform_sampler_expected_counts_match_inclusion_frequencies():
    vocab, n, draws = 30, 6, 3000
    sampler = LogUniformSampler(vocab, n)
    g = torch.Generator().manual_seed(1)
    hits, expected = (
        torch.zeros(vocab, dtype=torch.float64),
        torch.zeros(vocab, dtype=torch.float64),
    )
    for _ in range(draws):
        ids, q, tries = sampler.sample(g, CPU)
        assert ids.numel() == n and ids.unique().numel() == n  # distinct candidates
        hits[ids] += 1
        expected += sampler.expected_count(torch.arange(vocab), tries)
        assert torch.allclose(q, sampler.expected_count(ids, tries))
    # The chance that word k is a candidate, estimated two ways; frequent words first (Zipf).
    assert torch.allclose(hits / draws, expected / draws, atol=0.03)
    assert hits[0] > hits[10] > hits[29]
    assert sampler.prob(torch.arange(vocab)).sum().item() == pytest.approx(1.0)


# -- the task
# ------------------------------------------------------------------------------------------
def test_evaluation_uses_the_full_softmax():
    full, _ = build("model.num_sampled=0")
    sampled, _ = build("model.num_sampled=8")
    # same seed, same weights, same eval
    assert full.evaluate().metrics == sampled.evaluate().metrics


def test_evaluation_scores_blocks_of_the_validation_text():
    """Items: each BPTT window of each validation stream, its summed full-softmax loss and its
    tokens; the perplexity is exp(summed loss / tokens), the same as the summed loss of the
    windows computed at once (no per-block reduction changes it)."""
    task, _ = build()
    found = task.evaluate()
    streams = task.eval_streams
    windows = num_bptt_batches(streams, task.seq_len)
    assert found.items == windows * streams.size(1) and found.unit == "text blocks"
    assert found.counts["perplexity"] == (streams.size(0) - 1) * streams.size(1)  # tokens
    assert found.metrics["perplexity"] == pytest.approx(math.exp(found.metrics["loss"]))
    hidden, total = task.model.init_hidden(streams.size(1), CPU), 0.0
    with torch.no_grad():
        task.model.eval()
        for x, y in bptt_batches(streams, task.seq_len):
            features, hidden = task.model(x, hidden)
            total += float(task.model.full_loss(features, y, reduction="sum"))
    assert found.metrics["loss"] == pytest.approx(total / found.counts["loss"], rel=1e-5)
    # the key names a block by its words: equal windows of equal text, equal keys
    assert len(set(found.columns["key"].tolist())) == found.items
    assert found.key == "key" and found.dropped == {}


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_training_steps_through_the_task_interface(precision):
    task, policy = build(f"precision={precision}")
    assert task.steps_per_epoch() == math.ceil((2000 // 4 - 1) / 10)
    losses = []
    for i, batch in enumerate(task.train_batches(0)):
        result = task.train_step(batch)
        assert result.stepped and result.samples == 40  # 10 steps x 4 streams
        losses.append(result.loss.item())
        if i == 5:
            break
    assert all(math.isfinite(v) for v in losses)
    metrics = task.evaluate().metrics
    assert set(metrics) == set(task.metric_names)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]))
    assert metrics["perplexity"] < 500  # a capped 500-word vocabulary: uniform guessing gives 500


def test_resume_mid_epoch_is_exact():
    """Training 4 windows == 2 windows, checkpoint, a new task, 2 more windows (hidden state
    carried).
    """
    overrides = ("model.dropout=0.0",)

    def train(task, skip, n):
        for i, batch in enumerate(task.train_batches(0, skip=skip)):
            if i == n:
                break
            task.train_step(batch)

    straight, _ = build(*overrides)
    train(straight, 0, 4)

    first, first_policy = build(*overrides)
    train(first, 0, 2)
    saved = copy.deepcopy(
        {
            "model": first.model.state_dict(),
            "opt": first.optimizer.state_dict(),
            "task": first.state_dict(),
        }
    )
    resumed, policy = build(*overrides)
    resumed.model.load_state_dict(saved["model"])
    resumed.optimizer.load_state_dict(saved["opt"])
    resumed.load_state_dict(saved["task"])
    train(resumed, 2, 2)
    for (name, a), b in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=False
    ):
        assert torch.equal(a, b), name


def test_paper_budget_needs_a_corpus():
    with pytest.raises(ConfigError, match="data.root"):
        build("budget=paper")


def test_paper_budget_config_is_the_papers_model():
    cfg = compose("experiment=lstm_lm", "budget=paper")
    m = cfg.model
    assert (m.hidden_size, m.proj_size, m.num_layers, m.num_sampled) == (8192, 1024, 2, 8192)
    assert cfg.paper_loss_scale == 128 and cfg.optim.name == "adagrad" and cfg.trainer.epochs == 50


def test_mpt_run_smoke(tmp_path):
    run_dir = tmp_path / "run"
    conftest.run_cli("experiment=lstm_lm", "budget=smoke", "precision=fp32", run_dir=run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "completed"
    assert record["primary_metric"] == "perplexity" and record["higher_is_better"] is False
    assert math.isfinite(record["metrics"]["perplexity"])
    assert record["data"]["vocab_size"] == 500
