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
#   EXPERIMENTS  [alexnet,vgg16,googlenet,inception_v2,inception_v3,resnet50]  ("" skips them)
#   PRECISIONS   [fp32,mixed,no_master,no_scaling]  presets for the ILSVRC models
#   OTHERS       [lstm_lm:fp32,mixed,no_scaling dcgan:fp32,mixed,no_scaling demo:fp32,mixed scaling_matters:fp32,mixed,no_scaling,adaptive]
#                space-separated experiment:presets for the rows on embedded data; the presets
#                include the paper's ablations (bigLSTM diverges without scaling; DCGAN needs none)
#   LM_ROOT      []        at BUDGET=paper, the One Billion Word corpus as train.txt/valid.txt/test.txt
#                          (docs/experiments_lm_gan.md); unset: the lstm_lm row is skipped, with a note
#   CELEBA_ROOT  []        at BUDGET=paper, CelebA as an ImageFolder; unset: the dcgan row is skipped
#                          (smoke and short budgets use the embedded corpus and digits instead)
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
EXPERIMENTS=${EXPERIMENTS-alexnet,vgg16,googlenet,inception_v2,inception_v3,resnet50}
PRECISIONS=${PRECISIONS:-fp32,mixed,no_master,no_scaling}
OTHERS=${OTHERS-lstm_lm:fp32,mixed,no_scaling dcgan:fp32,mixed,no_scaling demo:fp32,mixed scaling_matters:fp32,mixed,no_scaling,adaptive}
RUNS_DIR=${RUNS_DIR:-results/runs}
OUT=${OUT:-results/report}
VENV=${VENV:-.venv}
DRY_RUN=${DRY_RUN:-0}
LAUNCHER=${LAUNCHER:-}
LM_ROOT=${LM_ROOT:-}
CELEBA_ROOT=${CELEBA_ROOT:-}

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
# At the paper budget the language model and the DCGAN need their own data sets (the embedded
# ones stand in only for smoke and short); without them those rows are skipped, not failed.
other_data() {  # experiment -> extra overrides, or return 1 to skip it
    local root="" var what
    case "$1" in
        lstm_lm) root=$LM_ROOT; var=LM_ROOT; what="the One Billion Word corpus as train.txt, valid.txt, test.txt" ;;
        dcgan) root=$CELEBA_ROOT; var=CELEBA_ROOT; what="CelebA as an ImageFolder" ;;
        *) return 0 ;;
    esac
    if [[ -n "$root" ]]; then extra=("data.root=$root"); return 0; fi
    if [[ "$BUDGET" == paper ]]; then
        echo "reproduce-table: skipping $1 at budget=paper: set $var to a folder with $what (docs/experiments_lm_gan.md)" >&2
        return 1
    fi
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
