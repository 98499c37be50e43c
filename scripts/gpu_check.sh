#!/usr/bin/env bash
# The first run on a GPU machine, in one call (docs/performance.md, "GPU check"): the packages
# checked first, then mpt-bench on ResNet-50 (fp32, tf32, amp, mixed, bf16 at batch 256), one
# smoke run of every experiment under mixed on CUDA (two Hydra sweeps), DDP over NCCL with 2 GPUs
# or more, mpt-report; each step under its own time limit, and always summary.txt at the end.
#
# It runs the machine as it is: its python3, no venv, mpt-repro not installed (this checkout on
# PYTHONPATH); the packages the machine lacks come as wheels (`make gpu-wheels`, carried as
# .gpu-wheels/) and are installed with `pip install --no-index --target` into the work folder.
# OUT receives the files to send back, at most 8: summary.txt, the bench JSON, report.md and
# gpu-check-logs.tar.gz (logs, run records, report tables).
#
# Settings (environment or make variables; defaults in brackets):
#   OUT        [results/gpu-check/<date-time>]     WORK [${TMPDIR:-/tmp}/mpt-gpu-check-<date-time>]
#   PYTHON     [python3]     WHEELS [.gpu-wheels]  (no such folder: nothing is installed, and said;
#              WHEELS= set empty: nothing is installed, PYTHON has every package)
#   BUDGET     [470; 280 with REHEARSAL=1] seconds for all the steps
#   STEPS      [bench,smoke-folder,smoke-embedded,ddp-nccl,report] the steps to run
#   BATCH      [256]  the bench's batch (lower it if fp32 runs out of memory)
#   REHEARSAL  [0]    1: the same plan with trainer.device=cpu at tiny sizes (make gpu-check-rehearsal)
#   DRY_RUN    [0]    1: print the commands, run nothing (DRY_RUN_PYTHON: the Python printing them)
set -uo pipefail
cd "$(dirname "$0")/.."
stamp=$(date +%Y%m%d-%H%M%S)
OUT=${OUT:-results/gpu-check/$stamp}
WORK=${WORK:-${TMPDIR:-/tmp}/mpt-gpu-check-$stamp}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS-.gpu-wheels}  # set and empty: PYTHON has every package (make gpu-check's .venv)
args=(--out "$OUT" --work "$WORK" --batch "${BATCH:-256}")
[[ -n "${BUDGET:-}" ]] && args+=(--budget "$BUDGET")
[[ -n "${STEPS:-}" ]] && args+=(--steps "$STEPS")
[[ "${REHEARSAL:-0}" == 1 ]] && args+=(--rehearsal)
[[ "${DRY_RUN:-0}" == 1 ]] && args+=(--dry-run)

path="$PWD"
wheels=("$WHEELS"/*.whl)
if [[ -z "$WHEELS" ]]; then
    :
elif [[ -e "${wheels[0]}" ]]; then
    install=("$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
        --disable-pip-version-check --target "$WORK/site" "${wheels[@]}")
    path="$PWD:$WORK/site"
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        echo "+ ${install[*]}"
    elif ! out=$("${install[@]}" 2>&1); then
        # the check goes on: its first step names every package that does not import
        args+=(--note "pip install of $WHEELS failed: $(tail -n 1 <<<"$out")")
    fi
else
    args+=(--note "no wheels in $WHEELS/: nothing installed (make gpu-wheels makes them)")
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
runner=$PYTHON
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    echo "+ PYTHONPATH=$PYTHONPATH $PYTHON -m mpt_repro.gpucheck ${args[*]}"
    # the plan printed by another Python, where PYTHON cannot run it yet (make's rehearsal venv)
    runner=${DRY_RUN_PYTHON:-$PYTHON}
fi
"$runner" -m mpt_repro.gpucheck --python "$PYTHON" "${args[@]}"
code=$?
if [[ "${DRY_RUN:-0}" != 1 && ! -s "$OUT/summary.txt" ]]; then
    mkdir -p "$OUT"
    echo "gpu-check: $PYTHON -m mpt_repro.gpucheck ended with exit status $code before writing a summary" | tee "$OUT/summary.txt"
fi
exit $code
