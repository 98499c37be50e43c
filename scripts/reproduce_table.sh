#!/usr/bin/env bash
# Reproduce the paper's tables: the Table 1 sweep (six ILSVRC12 models x precision presets), the
# language model and DCGAN rows, then mpt-report. Called by `make reproduce-table`.
#
# Settings (environment or make variables; defaults in brackets):
#   BUDGET       [paper]   smoke | short | paper (conf/budget/)
#   DATA         [imagenet] imagenet: the real ILSVRC12 data under DATA_ROOT (the paper's setting);
#                          synthetic: the same models on random images of the same shape, no
#                          download. BUDGET=smoke DATA=synthetic runs the whole pipeline on a CPU.
#   DATA_ROOT    []        ImageNet folder holding train/ and val/ (needed when DATA=imagenet)
#   SEEDS        [0]       comma-separated seeds, e.g. 0,1,2
#   EXPERIMENTS  [the rows of the paper's Table 1 that conf/experiment/ has, in the paper's order:
#                `python -m mpt_repro.catalog table1`]  ("" skips them)
#   PRECISIONS   [fp32,mixed,no_master,no_scaling]  presets for the ILSVRC models
#   OTHERS       [every other conf/experiment/ experiment, each with OTHER_PRECISIONS]
#                space-separated experiment:presets, e.g. "lstm_lm:fp32,mixed,no_scaling demo:fp32"
#   OTHER_PRECISIONS [fp32,mixed,no_scaling]  the presets of the default OTHERS: the baseline, the
#                paper's recipe and its loss-scaling ablation (bigLSTM diverges without scaling,
#                DCGAN needs none)
#   <DATA>_ROOT  []        the folder of an other experiment's data set when its conf/data/<data>.yaml
#                takes a root: LM_ROOT for the corpus (One Billion Word as train.txt/valid.txt/
#                test.txt, docs/experiments_lm_gan.md), CELEBA_ROOT for CelebA (an ImageFolder),
#                VOC_ROOT for PASCAL VOC (a VOCdevkit), LIBRISPEECH_ROOT for LibriSpeech (the
#                folder holding LibriSpeech/, docs/experiments_speech.md), WMT15_ENFR_ROOT for
#                WMT15 English-French (docs/experiments_translation.md). Unset: at BUDGET=paper that row is skipped,
#                with a note; at smoke and short the embedded stand-ins run (corpus, digits, the
#                English-Spanish Bible), and a data set without one (VOC) runs on random data with
#                DATA=synthetic
#   RUNS_DIR     [results/runs]    OUT [results/report]    VENV [.venv]
#   DRY_RUN      [0]       1: print the commands, run nothing
#   LAUNCHER     []        a Hydra launcher for the sweeps: slurm (submit every run to SLURM; fill in
#                          conf/hydra/launcher/slurm.yaml) or local (submitit, this machine); see
#                          docs/distributed.md. Empty: run the jobs one after another here.
#
# Idempotent: every run lands in results/runs/<experiment>/<precision>-<budget>/seed<N>/... and
# resume=true leaves a completed run alone and continues an interrupted one.
set -uo pipefail
cd "$(dirname "$0")/.."
# The body is one { ... } block: bash reads it whole before running it, so editing this file
# (a git pull) during an hours-long sweep cannot change what the running script does.
{

BUDGET=${BUDGET:-paper}
DATA=${DATA:-imagenet}
DATA_ROOT=${DATA_ROOT:-}
SEEDS=${SEEDS:-0}
VENV=${VENV:-.venv}
# names come from conf/ (and the paper's reference table), never from a list kept here
names() { "$VENV/bin/python" -m mpt_repro.catalog "$@"; }
EXPERIMENTS=${EXPERIMENTS-$(names table1 --sep ,)}
PRECISIONS=${PRECISIONS:-fp32,mixed,no_master,no_scaling}
OTHER_PRECISIONS=${OTHER_PRECISIONS:-fp32,mixed,no_scaling}
if [[ -z "${OTHERS+set}" ]]; then
    OTHERS=$(for e in $(names others); do printf '%s:%s ' "$e" "$OTHER_PRECISIONS"; done)
fi
RUNS_DIR=${RUNS_DIR:-results/runs}
OUT=${OUT:-results/report}
DRY_RUN=${DRY_RUN:-0}
LAUNCHER=${LAUNCHER:-}

die() { echo "reproduce-table: $*" >&2; exit 2; }

imagenet_help() {
    cat >&2 <<HELP
reproduce-table: DATA=imagenet needs the ILSVRC2012 images, but $1.
Nothing was run.

To reproduce the paper's Table 1 you need ImageNet (ILSVRC2012, 1000 classes):
  1. Register at https://image-net.org/ and download from the ILSVRC2012 page:
       ILSVRC2012_img_train.tar          (training images, about 138 GB)
       ILSVRC2012_img_val.tar            (validation images, about 6.3 GB)
       ILSVRC2012_devkit_t12.tar.gz      (validation labels, needed to sort val/)
  2. Put the three files in one folder, e.g. /data/imagenet, and unpack them into the layout
     the suite reads, DATA_ROOT/train/<wnid>/*.JPEG and DATA_ROOT/val/<wnid>/*.JPEG:
       .venv/bin/python -c "import torchvision.datasets as d; [d.ImageNet('/data/imagenet', split=s) for s in ('train', 'val')]"
     (torchvision unpacks the nested training tars and sorts the flat validation tarball into
     the 1000 class folders using the devkit; the widely used valprep.sh does the val step too.)
  3. Point the sweep at it:
       make reproduce-table DATA_ROOT=/data/imagenet            (BUDGET=paper, the paper's recipe)
       make reproduce-table DATA_ROOT=/data/imagenet BUDGET=short

Without ImageNet, the same pipeline runs on random images (checks everything, reproduces nothing):
       make reproduce-table BUDGET=smoke DATA=synthetic
HELP
    exit 2
}

[[ "$DATA" == imagenet || "$DATA" == synthetic ]] || die "DATA must be imagenet or synthetic, not '$DATA'"
[[ -f "conf/budget/$BUDGET.yaml" ]] || die "no budget '$BUDGET' (conf/budget/: $(ls conf/budget | sed 's/\.yaml//' | xargs))"

# The data first: without ImageNet nothing else matters.
ilsvrc_data=()
if [[ -n "$EXPERIMENTS" ]]; then
    if [[ "$DATA" == imagenet ]]; then
        [[ -n "$DATA_ROOT" ]] || imagenet_help "DATA_ROOT is not set"
        [[ -d "$DATA_ROOT/train" && -d "$DATA_ROOT/val" ]] || imagenet_help "DATA_ROOT=$DATA_ROOT has no train/ and val/ folders"
        ilsvrc_data=("data.root=$DATA_ROOT")
    else
        ilsvrc_data=("data=synthetic")
    fi
fi

# Every experiment and preset must exist before anything runs: a sweep that stops halfway
# through a typo wastes hours.
missing=()
for e in ${EXPERIMENTS//,/ }; do
    [[ -f "conf/experiment/$e.yaml" ]] || missing+=("experiment $e (conf/experiment/$e.yaml)")
    for p in ${PRECISIONS//,/ }; do [[ -f "conf/precision/$p.yaml" ]] || missing+=("preset $p (conf/precision/$p.yaml)"); done
done
for pair in $OTHERS; do
    e=${pair%%:*}
    [[ -f "conf/experiment/$e.yaml" ]] || missing+=("experiment $e (conf/experiment/$e.yaml)")
    for p in $(tr , ' ' <<<"${pair#*:}"); do [[ -f "conf/precision/$p.yaml" ]] || missing+=("preset $p (conf/precision/$p.yaml)"); done
done
if ((${#missing[@]})); then
    printf 'reproduce-table: not configured: %s\n' "${missing[@]}" | sort -u >&2
    die "nothing was run"
fi

MPT_RUN="$VENV/bin/mpt-run"
MPT_REPORT="$VENV/bin/mpt-report"
common=("budget=$BUDGET" "seed=$SEEDS" "resume=true" "paths.runs_dir=$RUNS_DIR" "trainer.progress=false")
[[ -z "$LAUNCHER" ]] || common+=("hydra/launcher=$LAUNCHER")

run() {
    echo "+ $*"
    [[ "$DRY_RUN" == 1 ]] || "$@"
}

failed=0
if [[ -n "$EXPERIMENTS" ]]; then
    run "$MPT_RUN" -m "experiment=$EXPERIMENTS" "precision=$PRECISIONS" "${common[@]}" "${ilsvrc_data[@]}" || failed=1
fi
# An other experiment whose data set takes a folder (conf/data/<data>.yaml has a `root:`) reads it
# from <DATA>_ROOT (LM_ROOT for the corpus; `names data-root` says which). Without it: at
# BUDGET=paper the row is skipped, not failed; at smoke and short the budget's embedded stand-in
# runs (the corpus, the digits, translation's Bible), or, for a data set without one (VOC),
# DATA=synthetic runs it on random data and anything else skips it with a note. A budget that
# trains on another data set (translation: bible_enes) gets the folder's own back with it.
other_data() {  # experiment -> extra overrides in $extra, or return 1 to skip it
    local var kind option root
    read -r var kind option < <(names data-root "$1" "$BUDGET") || true
    [[ -n "${var:-}" ]] || return 0
    root=${!var:-}
    if [[ -n "$root" ]]; then
        extra=(${option:+"data=$option"} "data.root=$root")
        return 0
    fi
    if [[ "$BUDGET" == paper ]]; then
        echo "reproduce-table: skipping $1 at budget=paper: set $var to its data set's folder (conf/data/, docs/)" >&2
        return 1
    fi
    [[ "$kind" == embedded ]] && return 0
    if [[ "$DATA" == synthetic ]]; then extra=("data=synthetic"); return 0; fi
    echo "reproduce-table: skipping $1: set $var to its data set's folder, or DATA=synthetic" >&2
    return 1
}
for pair in $OTHERS; do
    extra=()
    other_data "${pair%%:*}" || continue
    run "$MPT_RUN" -m "experiment=${pair%%:*}" "precision=${pair#*:}" "${common[@]}" "${extra[@]}" || failed=1
done
# the report lists failed and interrupted runs, so it runs even when a sweep failed
run "$MPT_REPORT" "$RUNS_DIR" --out "$OUT" || failed=1

if ((failed)); then
    echo "reproduce-table: a sweep or the report failed (see above and $OUT/report.md); re-run to resume" >&2
    exit 1
fi
echo "reproduce-table: done: $OUT/report.md (tables/ and plots/ beside it)"
exit 0
}
