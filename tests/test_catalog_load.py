"""The catalog reads conf/ through libyaml with OmegaConf's rules (catalog._load): every file the
suite ships must read exactly as OmegaConf itself reads it, types included."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from mpt_repro import catalog


def _omegaconfs(path: Path) -> dict:
    data = OmegaConf.to_container(OmegaConf.create(path.read_text()), resolve=False)
    return data if isinstance(data, dict) else {}


def test_every_shipped_config_reads_as_omegaconf_reads_it() -> None:
    files = sorted(catalog.conf_dir().rglob("*.yaml"))
    assert len(files) > 100  # the whole conf/ tree, not an empty glob
    for path in files:
        ours, theirs = catalog._load(path), _omegaconfs(path)
        assert repr(ours) == repr(theirs), path  # repr: 1 and 1.0, "1e-3" and 0.001 differ


def test_yaml_12_floats_no_timestamps_and_duplicate_keys_refused(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("lr: 1e-3\nday: 2001-01-01\nhalf: .5\nscale: 65536\n")
    assert (
        catalog._load(path)
        == _omegaconfs(path)
        == {
            "lr": 0.001,
            "day": "2001-01-01",
            "half": 0.5,
            "scale": 65536,
        }
    )
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key a"):
        catalog._load(path)
