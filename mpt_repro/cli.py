"""`mpt-run`: the Hydra application. All settings come from conf/ and the command line.

mpt-run experiment=resnet50 precision=mixed budget=smoke
mpt-run -m experiment=demo precision=fp32,amp seed=0,1,2
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mpt_repro.config import register_configs
from mpt_repro.errors import UserError

# conf/ lives at the repository root, beside the package (editable install: `make install`).
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

register_configs()
log = logging.getLogger("mpt_repro")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _main(cfg: DictConfig) -> None:
    from mpt_repro.run import run

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        record = run(cfg, run_dir)
    except UserError as e:
        # Bad input the user can fix: a clear message, no traceback, exit status 2.
        print(f"mpt-run: error: {e}", file=sys.stderr)
        sys.exit(2)
    metrics = ", ".join(f"{k}={v:.4g}" for k, v in (record.get("metrics") or {}).items())
    log.info(
        "%s: %s %s -> %s",
        record["status"],
        record["experiment"],
        record["precision"],
        metrics or record.get("reason"),
    )
    log.info("run record: %s", run_dir / "run.json")


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
