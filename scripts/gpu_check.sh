#!/usr/bin/env bash
# The first runs on a GPU machine (docs/performance.md, "GPU checklist"); `make gpu-check`.
#   1. mpt-bench: ResNet-50, batch 256, synthetic data, presets fp32, amp and mixed;
#   2. mpt-run: the smoke budget of every experiment (conf/experiment/) under fp32, amp and
#      mixed, on random data where the experiment's data set is a folder (ImageNet, VOC);
#   3. with 2 GPUs or more: one DDP run over 2 of them with NCCL (ResNet-50 smoke, mixed);
#   then mpt-report over the runs. Everything lands in OUT; send that folder back (its
#   summary.txt says what is in it).
#
# Settings (environment or make variables; defaults in brackets):
#   OUT      [results/gpu-check/<date-time>]   VENV [.venv]
#   BATCH    [256]   the bench's batch (lower it if fp32 runs out of memory)
#   DRY_RUN  [0]     1: print the commands, run nothing (no GPU needed)
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
OUT=${OUT:-results/gpu-check/$(date +%Y%m%d-%H%M%S)}
BATCH=${BATCH:-256}
DRY_RUN=${DRY_RUN:-0}
PY="$VENV/bin/python"
names() { "$PY" -m mpt_repro.catalog "$@"; }

die() { echo "gpu-check: $*" >&2; exit 2; }
[[ -x "$PY" ]] || die "no $PY: run \`make install\` first (or set VENV)"
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())") || die "torch cannot be imported from $VENV"
if [[ "$DRY_RUN" != 1 && "$GPUS" -lt 1 ]]; then
    die "no CUDA device is visible: this checklist is for a GPU machine (DRY_RUN=1 prints its commands)"
fi

common=(budget=smoke "precision=fp32,amp,mixed" trainer.device=cuda trainer.progress=false "paths.runs_dir=$OUT/runs")
# an experiment whose data set is a folder (ImageNet, VOC) runs on random data of its shape;
# the others have an embedded stand-in at the smoke budget (digits, a text corpus)
folder=() embedded=()
for e in $(names experiments); do
    read -r _ kind _ < <(names data-root "$e" smoke) || true
    if [[ "${kind:-}" == folder ]]; then folder+=("$e"); else embedded+=("$e"); fi
done
join() { local IFS=,; echo "$*"; }

failed=()
step() {  # step NAME COMMAND...: run it, its output in OUT/NAME.log too
    local name=$1
    shift
    echo "+ $*"
    [[ "$DRY_RUN" == 1 ]] && return 0
    "$@" 2>&1 | tee "$OUT/$name.log"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=("$name")
}

[[ "$DRY_RUN" == 1 ]] || mkdir -p "$OUT"
step bench "$VENV/bin/mpt-bench" experiment=resnet50 data=synthetic "data.batch_size=$BATCH" \
    "bench.presets=[fp32,amp,mixed]" "bench.out_dir=$OUT/bench"
step smoke-folder "$VENV/bin/mpt-run" -m "experiment=$(join "${folder[@]}")" data=synthetic "${common[@]}"
step smoke-embedded "$VENV/bin/mpt-run" -m "experiment=$(join "${embedded[@]}")" "${common[@]}"
if [[ "$GPUS" -ge 2 || "$DRY_RUN" == 1 ]]; then
    step ddp-nccl scripts/torchrun.sh 2 experiment=resnet50 budget=smoke data=synthetic \
        precision=mixed distributed.backend=nccl trainer.device=cuda trainer.progress=false \
        "paths.runs_dir=$OUT/runs"
else
    echo "gpu-check: one GPU: no DDP run (it needs 2: NCCL puts one process on each)"
fi
step report "$VENV/bin/mpt-report" "$OUT/runs" --out "$OUT/report"
[[ "$DRY_RUN" == 1 ]] && exit 0

{
    echo "mpt-repro gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$PY" -c "import torch; print(torch.__version__, 'CUDA', torch.version.cuda, '|', ', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"
    echo "bench JSON: $OUT/bench/   runs: $OUT/runs/   report: $OUT/report/report.md   logs: $OUT/*.log"
    if ((${#failed[@]})); then echo "FAILED: ${failed[*]}"; else echo "every step completed"; fi
} | tee "$OUT/summary.txt"
echo "gpu-check: send back $OUT (e.g. tar czf gpu-check.tgz $OUT); docs/performance.md says what to look at"
((${#failed[@]} == 0)) || exit 1
