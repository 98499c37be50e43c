"""experiment=speech (the paper's §4.3, DeepSpeech 2): the model's size, the features, CTC decoding,
CER/WER, the LibriSpeech layout read from small FLAC files the test writes, its errors, SortaGrad,
and mpt-run + mpt-report on synthetic audio and on the real layout under fp32, mixed and
no_scaling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_task, compose, option_config, read_run, run_cli

from mpt_repro.data.speech import (
    ALPHABET,
    Features,
    SortaGradSampler,
    build_speech_data,
    ctc_infeasible,
    encode,
    frames_needed,
    greedy_decode,
    has_reference,
)
from mpt_repro.errors import DataError
from mpt_repro.evidence import dropped_share, from_columns, read_items
from mpt_repro.models import build_model
from mpt_repro.tasks.speech import Speech, edit_counts

# the paper-size count docs/experiments_speech.md and conf/model/deepspeech2.yaml state
PAPER_PARAMETERS = 115_538_173  # model.rnn_norm=projected (DS2 §3.2)
RATE = 16000
PRESETS = ("fp32", "mixed", "no_scaling")


# -- the model and the features --------------------------------------------------------------------
def test_the_paper_size_model_has_the_documented_parameter_count() -> None:
    cfg = compose(["experiment=speech"]).model
    with torch.device("meta"):  # 115 M parameters, never allocated
        model = build_model(cfg, vocab_size=len(ALPHABET))
    assert sum(p.numel() for p in model.parameters()) == PAPER_PARAMETERS
    gru = model.rnns[0]
    assert (len(model.rnns), gru.hidden_size, gru.bidirectional) == (3, 2560, False)
    assert gru.input_size == 32 * 41  # 161 bins -> 81 -> 41 after the two frequency strides
    assert model.lookahead.weight.shape == (2560, 1, 81)  # tau = 80 future frames + the present


def test_a_spectrogram_has_161_bins_and_a_frame_every_10_ms() -> None:
    features = Features(RATE, 20.0, 10.0)
    assert (features.window, features.hop) == (320, 160)
    for seconds, frames in ((1.0, 101), (0.5, 51), (2.345, 235)):
        samples = int(seconds * RATE)
        spec = features(torch.randn(samples))
        assert spec.shape == (161, frames) == (161, features.frames(samples))
        assert abs(float(spec.mean())) < 1e-4 and abs(float(spec.std()) - 1) < 1e-3


def test_the_model_maps_frames_to_half_as_many_outputs(one_thread) -> None:
    cfg = compose(["experiment=speech", "budget=smoke"]).model
    model = build_model(cfg, vocab_size=len(ALPHABET)).eval()
    x = torch.randn(2, 1, 161, 101)
    x[1, :, :, 60:] = 0  # the batch's padding, as collate writes it
    logits, lengths = model(x, torch.tensor([101, 60]))
    assert logits.shape == (51, 2, len(ALPHABET)) and lengths.tolist() == [51, 30]
    # a longer neighbour in the batch does not change an utterance's outputs
    alone, _ = model(x[1:, :, :, :60], torch.tensor([60]))
    assert torch.allclose(alone[:, 0], logits[:30, 1], atol=1e-5)


# -- decoding and error rates ----------------------------------------------------------------------
def one_hot_logits(paths: list[str]) -> torch.Tensor:
    """(T, B, vocab) logits whose best path spells each string ('_' is the blank)."""
    t = max(len(p) for p in paths)
    logits = torch.zeros(t, len(paths), len(ALPHABET))
    for b, path in enumerate(paths):
        for i, symbol in enumerate(path.ljust(t, "_")):
            logits[i, b, ALPHABET.index(symbol)] = 5.0
    return logits


def test_greedy_decoding_merges_repeats_and_drops_blanks() -> None:
    logits = one_hot_logits(["hh_e_ll_llo__ wo", "a_a__bb"])
    # the second utterance's output stops after 5 frames: "a_a__" -> "aa"
    assert greedy_decode(logits, torch.tensor([16, 5])) == ["hello wo", "aa"]
    assert encode("HELLO, World's") == [ALPHABET.index(c) for c in "hello world's"]


def test_cer_and_wer_count_edits_over_the_reference() -> None:
    counts = edit_counts(["hello world", "abc"], ["helo world", "abd e"])
    # per utterance; characters: one deletion | one substitution + two insertions ("d", " ", "e")
    assert (counts["char_errors"], counts["chars"]) == ([1, 3], [11, 3])
    # words: "hello"->"helo" | "abc"->"abd" and "e" inserted
    assert (counts["word_errors"], counts["words"]) == ([1, 2], [2, 1])
    columns = {k: np.array(v) for k, v in counts.items()}
    columns["loss"], columns["aligned"] = np.array([3.0, 5.0]), np.array([1, 1])
    found = from_columns(columns, Speech.formulas, "utterances")
    assert found.metrics["cer"] == pytest.approx(100 * 4 / 14)  # summed edits / summed chars
    assert found.metrics["wer"] == pytest.approx(100.0) and found.metrics["loss"] == 4.0
    assert found.counts == {"loss": 2, "cer": 14, "wer": 3}


def test_error_rates_of_nothing_are_undefined_never_zero() -> None:
    """No reference character (all utterances left out): CER and WER are null with a reason."""
    columns = {k: np.zeros(0) for k in ("loss", "aligned", "char_errors", "chars", "word_errors",
                                        "words")}  # fmt: skip
    found = from_columns(columns, Speech.formulas, "utterances")
    assert found.metrics == {"loss": None, "cer": None, "wer": None}
    assert found.undefined["cer"] == "no characters to score (0 utterances evaluated)"


# -- LibriSpeech as its tarballs unpack ------------------------------------------------------------
UTTERANCES = {  # split -> (speaker, chapter, utterance, seconds, transcript)
    "train-clean-100": [
        (19, 198, 0, 1.2, "NORTHANGER ABBEY"),
        (19, 198, 1, 0.6, "IT WAS"),
        (19, 198, 2, 0.9, "THE LADY'S HOUSE"),
        (26, 495, 0, 0.7, "A BOOK"),
        (26, 495, 1, 1.0, "ONE TWO THREE"),
        (26, 495, 2, 0.5, "NO"),
    ],
    "dev-clean": [(84, 121, 0, 0.8, "GO ON"), (84, 121, 1, 0.6, "YES SIR")],
}


def write_librispeech(root: Path, layout: dict | None = None) -> Path:
    """root/LibriSpeech/<split>/<speaker>/<chapter>/ with 16 kHz FLAC files and the chapter's
    .trans.txt, as the tarballs unpack (`layout`: UTTERANCES unless given)."""
    import soundfile

    g = torch.Generator().manual_seed(0)
    for split, utterances in (layout or UTTERANCES).items():
        for speaker, chapter, utt, seconds, text in utterances:
            folder = root / "LibriSpeech" / split / str(speaker) / str(chapter)
            folder.mkdir(parents=True, exist_ok=True)
            key = f"{speaker}-{chapter}-{utt:04d}"
            audio = (torch.randn(int(seconds * RATE), generator=g) * 0.1).numpy()
            soundfile.write(folder / f"{key}.flac", audio, RATE)
            with open(folder / f"{speaker}-{chapter}.trans.txt", "a") as f:
                f.write(f"{key} {text}\n")
    return root / "LibriSpeech"


def speech_data(root: Path | str | None, **fields):
    d = option_config("data", name="librispeech", root=None if root is None else str(root),
                      **fields)  # fmt: skip
    return build_speech_data(d, Features(RATE, 20.0, 10.0), seed=0)


@pytest.mark.parametrize("point_at", ["parent", "folder"])
def test_librispeech_reads_as_the_tarballs_unpack(tmp_path, point_at) -> None:
    folder = write_librispeech(tmp_path)
    data = speech_data(tmp_path if point_at == "parent" else folder)
    assert (len(data.train), len(data.eval)) == (6, 2)
    first = data.train.utterances[0]
    assert first.text == "NORTHANGER ABBEY" and first.samples == int(1.2 * RATE)
    spec, target = data.train[0]
    assert spec.shape == (161, 1 + int(1.2 * RATE) // 160)
    assert target == encode("northanger abbey")
    # evaluation goes shortest first (little padding per batch)
    assert [u.text for u in data.eval.utterances] == ["YES SIR", "GO ON"]
    # max_seconds leaves out the longer training utterances; limits count utterances
    assert len(speech_data(folder, max_seconds=0.75).train) == 3
    assert len(speech_data(folder, train_limit=4).train) == 4


def test_a_missing_or_broken_librispeech_names_the_layout(tmp_path) -> None:
    with pytest.raises(DataError, match="needs data.root"):
        speech_data(None)
    with pytest.raises(DataError, match="does not exist.*<speaker>-<chapter>.trans.txt"):
        speech_data(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no split 'train-clean-100' .*LibriSpeech/<split>"):
        speech_data(tmp_path / "empty")
    folder = write_librispeech(tmp_path / "d")
    (folder / "train-clean-100" / "19" / "198" / "19-198-0001.flac").unlink()
    with pytest.raises(DataError, match=r"19-198.trans.txt: lists 19-198-0001 but .* missing"):
        speech_data(folder)
    folder = write_librispeech(tmp_path / "e")
    (folder / "dev-clean" / "84" / "121" / "84-121-0000.flac").write_bytes(b"not audio")
    with pytest.raises(DataError, match="84-121-0000.flac: not a readable FLAC"):
        speech_data(folder)


def test_audio_at_another_rate_is_refused(tmp_path) -> None:
    import soundfile

    folder = write_librispeech(tmp_path)
    soundfile.write(folder / "dev-clean/84/121/84-121-0000.flac", torch.zeros(800).numpy(), 8000)
    with pytest.raises(DataError, match="sampled at 8000 Hz.*model.sample_rate"):
        speech_data(folder)  # found when the split is listed, before any training


def test_a_transcript_that_is_not_utf8_is_refused_naming_the_file_and_line(tmp_path) -> None:
    folder = write_librispeech(tmp_path)
    listing = folder / "dev-clean/84/121/84-121.trans.txt"
    listing.write_bytes(b"84-121-0000 GO ON\n84-121-0001 YES S\xc9R\n")  # Latin-1, not UTF-8
    with pytest.raises(DataError) as err:
        speech_data(folder)
    assert str(err.value).startswith(
        f"{listing}: line 2 is not UTF-8 text (byte 0xc9); LibriSpeech transcripts are"
    )


def _nan_clip(path: Path) -> None:
    """A float WAV under the clip's name (libsndfile reads by content): one NaN sample."""
    import soundfile

    audio = np.zeros(int(0.5 * RATE), np.float32)
    audio[100] = np.nan
    soundfile.write(path, audio, RATE, format="WAV", subtype="FLOAT")


def test_nan_audio_is_a_data_fault_naming_the_file(tmp_path) -> None:
    from mpt_repro.data.speech import read_audio

    path = tmp_path / "84-121-0000.flac"
    _nan_clip(path)
    with pytest.raises(DataError) as err:
        read_audio(path, RATE)
    assert str(err.value) == (
        f"{path}: 1 of its 8000 samples are NaN or infinite (the first at sample 100); replace "
        "the file (a run would record it as a numerics divergence)"
    )


def test_mpt_run_fails_a_nan_clip_as_data_and_a_bad_transcript_at_start(tmp_path) -> None:
    """NaN audio was recorded as an FP32 numerics divergence; a non-UTF-8 trans.txt was exit 1
    with no file named (issue 34)."""
    nan, latin = write_librispeech(tmp_path / "nan"), write_librispeech(tmp_path / "latin")
    for speaker, chapter, utt, _, _ in UTTERANCES["train-clean-100"]:  # every clip: any order
        _nan_clip(nan / f"train-clean-100/{speaker}/{chapter}/{speaker}-{chapter}-{utt:04d}.flac")
    bad = latin / "train-clean-100/19/198/19-198.trans.txt"
    bad.write_bytes(bad.read_bytes() + b"19-198-0009 CAF\xc9\n")
    proc = run_cli("-m", "experiment=speech", "budget=smoke", "trainer.device=cpu",
                   f"data.root={nan},{latin}", f"paths.runs_dir={tmp_path / 'runs'}",
                   check=False, env=ONE_THREAD)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run: error:")]
    assert f"mpt-run: error: {bad}: line 4 is not UTF-8 text (byte 0xc9); " in "\n".join(errors)
    assert any("samples are NaN or infinite" in x and str(nan) in x for x in errors), errors
    (record,) = [read_run(p.parent) for p in (tmp_path / "runs").rglob("run.json")]
    assert record["status"] == "failed" and "NaN or infinite" in record["reason"]
    assert "diverg" not in record["reason"].split("(a run")[0]


# -- SortaGrad -------------------------------------------------------------------------------------
# -- what an evaluation or a step cannot score ----------------------------------------------------
LONG = "ABCDEFGHIJ" * 20  # 200 characters: more than any of these clips has output frames


def relabelled(texts: dict[tuple[int, int, int], str], extra_dev: tuple = ()) -> dict:
    """UTTERANCES with the transcripts of `texts` ((speaker, chapter, utterance) -> text), and
    `extra_dev` utterances added to dev-clean."""
    return {
        split: [(*u[:4], texts.get(u[:3], u[4])) for u in utterances]
        + (list(extra_dev) if split == "dev-clean" else [])
        for split, utterances in UTTERANCES.items()
    }


def test_ctc_feasibility_is_what_ctc_loss_finds_infinite() -> None:
    """An utterance needs a frame per character and one between doubled letters: exactly where
    ctc_loss (without zero_infinity) is infinite."""
    texts = ["abc", "aab", "hello", "", "a"]
    targets = [encode(t) for t in texts]
    flat = torch.tensor([c for t in targets for c in t], dtype=torch.long)
    target_lengths = torch.tensor([len(t) for t in targets])
    assert [frames_needed(t) for t in targets] == [3, 4, 6, 0, 1]
    output_lengths = torch.tensor([3, 3, 6, 1, 0])
    infeasible = ctc_infeasible(output_lengths, flat, target_lengths)
    assert infeasible.tolist() == [False, True, False, False, True]
    log_probs = torch.randn(6, len(texts), len(ALPHABET)).log_softmax(-1)
    losses = torch.nn.functional.ctc_loss(log_probs, flat, output_lengths, target_lengths,
                                          reduction="none")  # fmt: skip
    assert torch.isinf(losses).tolist() == infeasible.tolist()
    assert [has_reference(t) for t in ("YES", "123", " 4 5 ", "", "it's")] == [
        True, False, False, False, True,
    ]  # fmt: skip


def test_mpt_run_refuses_what_it_cannot_score_and_fails_a_step_it_cannot_align(tmp_path) -> None:
    """One sweep over four LibriSpeech folders the test writes: the dev transcripts empty, or
    digits only (CER 0.00 was printed beside the paper's 2.20), every training clip too short
    for its transcript (every loss was 0, `completed`): refused while the data loads, one line
    each, nothing written; the four clips of the first (shortest-first) batch too short: the
    run fails at that step with one line, `failed` in run.json, exit 2."""
    dev = [(84, 121, 0), (84, 121, 1)]
    train = [u[:3] for u in UTTERANCES["train-clean-100"]]
    first_batch = [(26, 495, 2), (19, 198, 1), (26, 495, 0), (19, 198, 2)]  # 0.5-0.9 s
    roots = {
        name: write_librispeech(tmp_path / name, relabelled(texts))
        for name, texts in (
            ("empty", dict.fromkeys(dev, "")),
            ("digits", dict.fromkeys(dev, "1 2 3")),
            ("short", dict.fromkeys(train, LONG)),
            ("step", dict.fromkeys(first_batch, LONG)),
        )
    }
    proc = run_cli("-m", "experiment=speech", "budget=smoke", "trainer.device=cpu",
                   f"data.root={','.join(str(r) for r in roots.values())}",
                   f"paths.runs_dir={tmp_path / 'runs'}", check=False, env=ONE_THREAD)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("mpt-run: error:")]
    no_letter = (
        "(data.eval_split): none of its 2 utterances has a transcript with a letter once encoded "
        '(characters outside " \'abcdefghijklmnopqrstuvwxyz", such as digits, are dropped), so '
        "there is nothing to score; check its *.trans.txt files (lines `<id> TRANSCRIPT`), or "
        "choose another split"
    )
    assert errors[0] == f"mpt-run: error: {roots['empty'] / 'dev-clean'} {no_letter}"
    assert errors[1] == f"mpt-run: error: {roots['digits'] / 'dev-clean'} {no_letter}"
    assert errors[2] == (
        f"mpt-run: error: {roots['short'] / 'train-clean-100'} (data.train_splits): every one "
        "of its 6 utterances is too short for its transcript (CTC needs an output frame per "
        "character, and one between doubled letters): every loss would be 0 and nothing "
        "learned or scored; check that the transcripts belong to the audio files and that the "
        "audio is at model.sample_rate"
    )
    step_failure = (
        f"every utterance of a training step (4, from {roots['step'] / 'train-clean-100'} "
        "(data.train_splits)) is too short for its transcript: CTC needs an output frame per "
        "character (and one between doubled letters), so their loss was 0 and the step learned "
        "nothing; 4 of the 6 training utterances are such clips: leave them out (or shorten "
        "their transcripts), and check that the audio is at model.sample_rate=16000 Hz"
    )
    assert errors[3] == f"mpt-run: error: {step_failure}"
    (record,) = [read_run(p.parent) for p in (tmp_path / "runs").rglob("run.json")]
    assert record["status"] == "failed" and record["reason"] == f"DataError: {step_failure}"
    assert record["data"]["root"] == str(roots["step"])


def test_dropped_utterances_are_counted_in_run_json(tmp_path) -> None:
    """Two of the first batch's clips too short for their transcripts (their loss zeroed), one
    dev transcript of digits only (left out before scoring) and one dev clip too short (left out
    of the loss, still scored by CER and WER): the run completes and run.json counts each."""
    root = write_librispeech(tmp_path / "data", relabelled(
        {(26, 495, 2): LONG, (19, 198, 1): LONG, (84, 121, 0): "1 2 3", (84, 121, 1): LONG},
        extra_dev=[(84, 121, 2, 1.0, "GOOD MORNING"), (84, 121, 3, 0.9, "A CAT")],
    ))  # fmt: skip
    run_cli("experiment=speech", "budget=smoke", "trainer.device=cpu", f"data.root={root}",
            "trainer.max_steps=1", run_dir=tmp_path / "run", env=ONE_THREAD)  # fmt: skip
    record = read_run(tmp_path / "run")
    assert record["status"] == "completed"
    assert record["data"]["ctc_infeasible"] == {"train": 2, "eval": 1, "trained": 2}
    block = record["evaluation"]
    assert (block["items"], block["data_items"], block["unit"]) == (3, 4, "utterances")
    assert block["dropped"] == {"empty_reference": 1, "ctc_infeasible": 1}
    # the loss rests on the 2 clips CTC aligns; CER and WER on all 3 references
    assert block["counts"]["loss"] == 2 and block["counts"]["cer"] == 200 + 12 + 5
    assert dropped_share(block) == 0.5
    _, items = read_items(tmp_path / "run" / block["items_file"])
    assert items["dropped_ctc_infeasible"].tolist() == [1, 0, 0]  # in order of length
    assert items["loss"][0] == 0.0 and (items["loss"][1:] > 0).all()


def test_sortagrad_goes_shortest_first_then_shuffles_whole_batches() -> None:
    lengths = [50, 10, 40, 20, 70, 30, 60, 80, 5]
    sampler = SortaGradSampler(lengths, seed=3, batch_size=2, sorted_first_epoch=True)
    sampler.set_epoch(0)
    first = [lengths[i] for i in sampler]
    assert first == [5, 10, 20, 30, 40, 50, 60, 70]  # the longest (the remainder) left out
    sampler.set_epoch(1)
    later = [lengths[i] for i in sampler]
    pairs = [tuple(later[i : i + 2]) for i in range(0, 8, 2)]
    assert sorted(pairs) == [(5, 10), (20, 30), (40, 50), (60, 70)] and later != first
    sampler.set_epoch(1, skip_batches=1)  # a resumed run leaves out what it trained on
    assert [lengths[i] for i in sampler] == later[2:]
    # two ranks: each takes its half of every global batch of 4
    ranks = [
        SortaGradSampler(lengths, 3, 2, True, rank=r, world_size=2) for r in range(2)
    ]  # fmt: skip
    for r in ranks:
        r.set_epoch(0)
    assert [[lengths[i] for i in r] for r in ranks] == [[5, 10, 40, 50], [20, 30, 60, 70]]
    unsorted = SortaGradSampler(lengths, seed=3, batch_size=2, sorted_first_epoch=False)
    unsorted.set_epoch(0)
    assert [lengths[i] for i in unsorted] != first


def test_the_ctc_loss_is_fp32_from_fp16_logits(one_thread) -> None:
    task, policy = build_task("experiment=speech", "budget=smoke", "data=synthetic",
                              "precision=mixed")  # fmt: skip
    batch = next(iter(task.train_loader))
    with policy.autocast():
        logits, _ = task._forward(task.model, batch)
        loss = task.loss(batch)
    assert logits.dtype == torch.float16  # mixed runs the model in FP16 ...
    assert loss.value.dtype == torch.float32 and torch.isfinite(loss.value)  # ... CTC in FP32


def _train(task, iterations: int, skip: int = 0) -> list:
    batches = task.train_batches(0, skip=skip)
    return [task.train_step(b) for _, b in zip(range(iterations), batches)]


def test_accumulation_and_an_exact_resume(one_thread) -> None:
    """Two micro-batches of 2 per step; 2 steps, then a fresh task loading that state and
    skipping those 2 steps, ends where 4 straight steps end (SortaGrad order, BN statistics and
    the dynamic loss scale included)."""
    import copy

    overrides = ("experiment=speech", "budget=smoke", "data=synthetic", "precision=mixed",
                 "data.batch_size=2", "trainer.accumulate=2")  # fmt: skip
    straight, _ = build_task(*overrides)
    assert straight.steps_per_epoch() == 8  # 32 utterances, 4 per step
    assert [r.samples for r in _train(straight, 4)] == [4, 4, 4, 4]
    first, _ = build_task(*overrides)
    _train(first, 2)
    saved = copy.deepcopy(
        {"model": first.model.state_dict(), "opt": first.optimizer.state_dict()}
    )  # fmt: skip
    resumed, _ = build_task(*overrides)
    resumed.model.load_state_dict(saved["model"])
    resumed.optimizer.load_state_dict(saved["opt"])
    _train(resumed, 2, skip=2)
    for (name, p), q in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values()
    ):
        assert torch.equal(p, q), name


# -- mpt-run and mpt-report ------------------------------------------------------------------------
# One thread per process: on a loaded 2-core machine the GRU's thread hand-offs cost ~100x its
# arithmetic (seconds per step instead of milliseconds).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def sweep(runs: Path, *data_args: str) -> dict[str, dict]:
    """experiment=speech budget=smoke under fp32, mixed and no_scaling in one mpt-run -m."""
    run_cli("-m", "experiment=speech", "budget=smoke", f"precision={','.join(PRESETS)}",
            "trainer.device=cpu", f"paths.runs_dir={runs}", *data_args, env=ONE_THREAD)  # fmt: skip
    found = {}
    for path in runs.glob("speech/*-smoke/seed0/**/run.json"):
        record = read_run(path.parent)
        found[record["config"]["precision"]["name"]] = record
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("speech_runs")


@pytest.fixture(scope="module")
def synthetic_records(runs) -> dict[str, dict]:
    return sweep(runs, "data=synthetic")


@pytest.fixture(scope="module")
def librispeech_records(runs, tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("librispeech")
    write_librispeech(root)
    # 6 training utterances: batches of 2, evaluation on both dev utterances
    return sweep(runs, f"data.root={root}", "data.batch_size=2", "data.eval_batch_size=2")


@pytest.mark.parametrize("records", ["synthetic_records", "librispeech_records"])
def test_smoke_runs_complete_and_record_cer_and_wer(records, request) -> None:
    found = request.getfixturevalue(records)
    assert sorted(found) == sorted(PRESETS)
    for record in found.values():
        assert record["status"] == "completed", record.get("error")
        metrics = record["metrics"]
        assert 0 <= metrics["cer"] <= 100 * 5 and 0 <= metrics["wer"] <= 100 * 5, metrics
        assert record["primary_metric"] == "cer" and record["higher_is_better"] is False
        assert record["model"]["parameters"] < 200_000  # the smoke width, not the paper's
        assert record["config"]["optim"]["nesterov"] is True
    data = found["fp32"]["data"]
    assert data["train_size"] == (32 if records == "synthetic_records" else 6)
    if records == "synthetic_records":  # 8 steps: the dynamic scale comes down and mixed steps
        mixed = found["mixed"]
        assert mixed["steps"] == 8 and mixed["skipped_steps"] < mixed["steps"], mixed


def test_mpt_report_rebuilds_table3_beside_the_papers_values(
    runs, synthetic_records, librispeech_records, tmp_path
) -> None:
    from mpt_repro.report import cli

    out = tmp_path / "report"
    assert cli.main([str(runs), "--out", str(out), "--quiet", "--no-plots"]) == 0
    report = (out / "report.md").read_text()
    assert report.count("### Table 3: speech recognition") == 2  # synthetic and librispeech
    tables = [t.split("###")[0] for t in report.split("### Table 3: speech recognition")[1:]]
    (table,) = [t for t in tables if "on librispeech data" in t]
    assert "| paper: English (WSJ '92) | paper; our data differs | 2.20 [S] | 1.99 [S] |" in table
    assert "| ours: speech | librispeech |" in table
    for preset in PRESETS:
        assert f"CER {preset}" in table and f"WER {preset}" in table
    assert "speech: every final metric" not in report  # no generic table as well


@pytest.mark.slow  # two torchrun processes: ~25 s on the loaded 2-core CPU
def test_two_processes_train_and_evaluate_like_one(tmp_path) -> None:
    from test_distributed_tasks import mpt_run

    args = ["experiment=speech", "budget=smoke", "data=synthetic", "precision=fp32"]
    mpt_run(args, 1, tmp_path / "one")
    mpt_run([*args, "data.batch_size=2"], 2, tmp_path / "two")  # the same global batch of 4
    one, two = read_run(tmp_path / "one"), read_run(tmp_path / "two")
    assert two["status"] == "completed" and two["distributed"]["world_size"] == 2
    # the same global batches; the evaluation loss is a mean over utterances of 100-300 each, so
    # an utterance evaluated twice or never would move it by far more than the tolerance
    assert two["metrics"]["cer"] == pytest.approx(one["metrics"]["cer"], abs=1e-6)
    assert two["metrics"]["loss"] == pytest.approx(one["metrics"]["loss"], rel=1e-3)
