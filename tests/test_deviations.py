"""The three documented choices between the authors' toolchains (issue 49): each default as the
config composes it, as the code builds it and as the docs state it, so that changing one without
the others fails here; and what each choice does, on real inputs.

- DeepSpeech 2's recurrent batch norm: `model.rnn_norm` (DS2 §3.2's `projected` by default);
- the translation tokenizer: `data.tokenizer` (the tutorial's `bytes` by default);
- NVCaffe's AlexNet FP16 arithmetic: kept out of `recipe=nvcaffe` (precision presets choose it).
"""

from __future__ import annotations

import gzip
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from conftest import compose
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from mpt_repro.data.parallel import read_lines, tokenize
from mpt_repro.data.speech import ALPHABET
from mpt_repro.models import build_model
from mpt_repro.models.deepspeech2 import InputNormGRU, ProjectedNormGRU

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
spec = importlib.util.spec_from_file_location(
    "measure_deviations", ROOT / "scripts" / "measure_deviations.py"
)
measure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(measure)


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def differences_table() -> str:
    """docs/recipes.md's one table of every known difference from the authors' toolchains."""
    text = doc("recipes.md")
    start = text.index("## Differences from the authors' toolchains")
    return text[start : text.index("\n## ", start + 1)]


# -- DeepSpeech 2's recurrent batch norm -----------------------------------------------------------
def test_ds2_layout_default_is_the_one_the_docs_state(one_thread) -> None:
    model_cfg = compose(["experiment=speech", "budget=smoke"]).model
    assert model_cfg.rnn_norm == "projected"
    assert "| `projected` (**default**) | W·h" in doc("experiments_speech.md")
    assert "`model.rnn_norm: projected`" in differences_table()
    model = build_model(model_cfg, vocab_size=len(ALPHABET))
    assert all(isinstance(rnn, ProjectedNormGRU) for rnn in model.rnns)
    # the norm acts on W·h: three gates wide, and the projection has no bias of its own
    first = model.rnns[0]
    assert first.norm.num_features == 3 * model_cfg.hidden_size
    assert first.projection.bias is None


def test_deepspeech_pytorch_layout_leaves_the_first_gru_without_batch_norm(one_thread) -> None:
    for layout in ("input", "input_all"):
        cfg = compose(["experiment=speech", "budget=smoke", f"model.rnn_norm={layout}"]).model
        rnns = build_model(cfg, vocab_size=len(ALPHABET)).rnns
        assert all(isinstance(rnn, InputNormGRU) for rnn in rnns)
        got = rnns[0].norm.norm.num_features if rnns[0].norm is not None else None
        assert got == (None if layout == "input" else rnns[0].input_size), layout
        assert rnns[1].norm.norm.num_features == cfg.hidden_size  # h, before the GRU's own W


@pytest.mark.parametrize("bidirectional", [False, True])
def test_projected_gru_is_pytorchs_gru_when_the_norm_is_the_identity(
    bidirectional, one_thread
) -> None:
    """The frame-by-frame recurrence computes cuDNN's GRU (gate order, reset on U·h + b, the
    state frozen past each utterance's end, the backward direction within each length)."""
    torch.manual_seed(0)
    ours = ProjectedNormGRU(5, 7, bidirectional).eval()
    reference = torch.nn.GRU(5, 7, bidirectional=bidirectional)
    gates = 3 * 7
    with torch.no_grad():
        ours.norm.running_var.fill_(1 - ours.norm.eps)  # B(x) = x
        for d, suffix in enumerate(["", "_reverse"][: 2 if bidirectional else 1]):
            getattr(reference, f"weight_ih_l0{suffix}").copy_(
                ours.projection.weight[d * gates : (d + 1) * gates]
            )
            getattr(reference, f"bias_ih_l0{suffix}").zero_()
            getattr(reference, f"weight_hh_l0{suffix}").copy_(ours.weight_hh[d])
            getattr(reference, f"bias_hh_l0{suffix}").copy_(ours.bias_hh[d])
    lengths = torch.tensor([9, 4, 6])
    packed = pack_padded_sequence(torch.randn(9, 3, 5), lengths, enforce_sorted=False)
    mine, _ = pad_packed_sequence(ours(packed))
    theirs, _ = pad_packed_sequence(reference(packed)[0])
    torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)


# -- the translation tokenizer ---------------------------------------------------------------------
def tutorial_tokens(line: bytes) -> list[str]:
    """data_utils.py's basic_tokenizer and _DIGIT_RE, on bytes as the tutorial runs them."""
    split = re.compile(b"([.,!?\"':;)(])")
    words = [w for fragment in line.strip().split() for w in split.split(fragment) if w]
    return [re.sub(rb"\d", b"0", w).decode() for w in words]


@pytest.fixture(scope="module")
def giga_fren_like(tmp_path_factory) -> Path:
    """The script's giga-fren-like pairs, written as the WMT files are (gzipped, one a line)."""
    folder = tmp_path_factory.mktemp("giga")
    for side, lang in ((0, "en"), (1, "fr")):
        lines = "".join(pair[side] + "\n" for pair in measure.giga_fren_like())
        (folder / f"giga-fren.release2.fixed.{lang}.gz").write_bytes(gzip.compress(lines.encode()))
    return folder


def test_translation_tokenizer_default_is_the_one_the_docs_state() -> None:
    for data in ("bible_enes", "wmt15_enfr"):
        assert compose(["experiment=translation", f"data={data}"]).data.tokenizer == "bytes"
    assert "- `bytes` (**default**, the tutorial's" in doc("experiments_translation.md")
    assert "`data.tokenizer: bytes`" in differences_table()


def test_bytes_tokenizer_gives_the_tutorials_tokens_and_text_does_not(giga_fren_like) -> None:
    path = giga_fren_like / "giga-fren.release2.fixed.fr.gz"
    raw = gzip.decompress(path.read_bytes()).split(b"\n")[:-1]
    lines = list(read_lines(path))
    assert len(lines) == len(raw) == 400
    assert all(tokenize(t, True, "bytes") == tutorial_tokens(b) for t, b in zip(lines, raw))
    differ = sum(tokenize(t, True, "text") != tutorial_tokens(b) for t, b in zip(lines, raw))
    assert differ == len(lines)  # every French line has a U+00A0 before its "!"


def test_a_lone_carriage_return_does_not_end_a_line(tmp_path) -> None:
    path = tmp_path / "x.fr"
    path.write_bytes(b"un\rdeux\ntrois\r\n")
    assert list(read_lines(path)) == ["un\rdeux", "trois\r"]  # two lines, as the tutorial's
    assert tokenize("un\rdeux", False) == ["un", "deux"]  # and \r is whitespace there


def test_the_documented_sample_measurement_is_what_the_script_prints() -> None:
    size = compose(measure.TOKENIZER_CONFIG).model.source_vocab_size
    rows = measure.sample_rows(size)
    documented = doc("experiments_translation.md")
    assert all(row in documented for row in rows), rows
    # the effect the docs describe: bytes splits the sample's French into more distinct tokens
    fr = {r.split(" | ")[2]: int(r.split(" | ")[3].replace(",", "")) for r in rows[-2:]}
    assert fr["`bytes`"] > fr["`text`"]


@pytest.mark.slow
def test_the_documented_tokenizer_measurement_is_what_the_script_prints() -> None:
    rows = measure.measure_tokenizer(compose(measure.TOKENIZER_CONFIG))
    documented = doc("experiments_translation.md")
    assert all(row in documented for row in rows), rows


@pytest.mark.slow
def test_the_measurement_script_tabulates_its_runs(tmp_path) -> None:
    """The docs' command, on fewer runs: the AlexNet table from real runs (one seed here)."""
    lines = measure.measure_alexnet(tmp_path, seeds=(0,))
    assert lines[0].startswith("| precision | arithmetic |") and len(lines) == 2 + 3
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| `fp32`",
        "| `pseudo_fp16`",
        "| `mixed`",
    ]


# -- AlexNet's arithmetic under recipe=nvcaffe -----------------------------------------------------
def test_nvcaffe_alexnet_recipe_leaves_the_arithmetic_to_the_precision_preset() -> None:
    recipe = (ROOT / "conf" / "experiment_recipe" / "alexnet_nvcaffe.yaml").read_text()
    assert not re.search(r"^precision:", recipe, re.M)  # no precision key in the recipe
    public = compose(["experiment=alexnet", "precision=pseudo_fp16"]).precision
    nvcaffe = compose(["experiment=alexnet", "recipe=nvcaffe", "precision=pseudo_fp16"]).precision
    assert nvcaffe == public
    # the presets the docs map NVCaffe's FLOAT math (pseudo_fp16) and FP16 arithmetic (mixed) onto
    assert (nvcaffe.arithmetic.name, nvcaffe.compute_dtype.name) == ("float32", "float16")
    mixed = (ROOT / "conf" / "precision" / "mixed.yaml").read_text()
    assert "compute_dtype: float16" in mixed and "arithmetic:" not in mixed  # native: FP16 math
    vision = doc("experiments_vision.md")
    assert "**Kept, not followed**" in vision
    assert "| **FLOAT16** (L5-6) |" in vision
    assert "arithmetic" in differences_table() and "@2a4581e9b7fb L5-6" in differences_table()


def test_fp16_products_sum_in_fp32_here_as_the_docs_say() -> None:
    """docs/experiments_vision.md: no preset sums in FP16; an FP16 sum of ones stops at 2,048."""
    ones = torch.ones(5000, dtype=torch.float16)
    assert float(ones @ ones) == 5000.0
    assert "a dot product of 5,000 FP16 ones gives 5,000" in doc("experiments_vision.md")
