#!/usr/bin/env bash
# One run, data-parallel over the GPUs of this machine (or CPU processes with trainer.device=cpu):
#   scripts/torchrun.sh [NPROC] experiment=resnet50 precision=mixed budget=short data.root=/data/imagenet
#   NPROC=4 scripts/torchrun.sh experiment=demo          (same as `make ddp NPROC=4 ARGS="experiment=demo"`)
# NPROC defaults to the number of visible GPUs (1 without any). The arguments are mpt-run's.
# Several nodes: run torchrun yourself with --nnodes and a rendezvous (docs/distributed.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then NPROC=$1; shift; fi
if [[ -z "${NPROC:-}" ]]; then
    NPROC=$("$VENV/bin/python" -c "import torch; print(max(torch.cuda.device_count(), 1))")
fi
# --standalone: a private rendezvous on a free port, so two runs on one machine do not collide
exec "$VENV/bin/python" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" "$VENV/bin/mpt-run" "$@"
