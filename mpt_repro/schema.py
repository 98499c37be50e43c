"""The base schemas of the model and data options, and the markers their fields carry. Each option
has a structured config of its own (Hydra's pattern of a base schema per option), registered by
the plugin that brings it (mpt_repro/registry.py; the built-in ones: mpt_repro/experiments/),
with the checks of its own fields beside them.

Each conf/model/*.yaml and conf/data/*.yaml names its schema first in its defaults list

    defaults:
      - /schema/model@_here_: my_net
      - _self_

so the composed `model` node is a `MyNet`: a key another model reads does not exist in it and is
refused by Hydra, with or without a leading `+` (mpt_repro/config.py turns that into a message
naming the options that have it).

Fields that the option carries but that change a run only in some settings say so in their
metadata: `read_when(selector, kinds...)` (a command-line override is refused when the run's kind
is not among them; config.check_overrides_are_read; the same marker serves the other groups'
fields: optim, trainer, precision, telemetry), or, for a base schema's field that only some
options read, `read_if_listed()` with the option's schema naming it in its `reads`. A setting
that a registered extension reads when its registration says so (a loss scaler's knobs:
`register_scaler("dynamic", reads=("init_scale", ...))`) is `read_if_declared(...)`: its kinds
are asked of the registry, so a plugin's scaler reads what it declares.
A trainer setting that only some tasks act on is marked `read_if_honoured()`, and the plugin of
each task that acts on it says so (`honours(kind, key...)`). A field that moved into an option's
schema from another group says where it was (`formerly("optim.x")`), so that the old key is
refused with the new name.

Nothing here imports torch: mpt-run checks a configuration before torch loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from mpt_repro.errors import ConfigError


def read_when(selector: str, *kinds: str) -> dict[str, Any]:
    """Field metadata: the key changes a run only when `selector` (a config key such as
    `optim.name`, or a derived kind: `task`, `loss_scaling`, `telemetry.enabled`) is one of
    `kinds`."""
    return {"read_when": (selector, tuple(kinds))}


class Declaring(Sequence[str]):
    """read_when's kinds for a setting that a registration declares it reads (a loss scaler's
    `reads=`, registry.loss_scaler): the names of extension point `point` whose registration
    names `setting`, asked of the registry at each check, so that a plugin's own kind
    (precision.loss_scaling=backoff) reads what its registration declares, as the suite's own
    read what theirs declare."""

    def __init__(self, point: str, setting: str) -> None:
        self.point, self.setting = point, setting

    def _names(self) -> list[str]:
        from mpt_repro import registry

        return registry.declaring(self.point, self.setting)

    def __getitem__(self, index):  # an index or a slice, of the sorted names
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, kind: object) -> bool:
        from mpt_repro import registry

        return self.setting in (registry.declared_reads(self.point, str(kind)) or ())

    def refusal(self, key: str, kind: str) -> str | None:
        """The one line refusing command-line `key` for a plugin's `kind` that does not declare
        it: how its author declares it. None for the suite's own kinds and for a kind that is
        not registered (config's message says what reads the key)."""
        from mpt_repro import registry

        if kind not in registry.names(self.point) or registry.is_the_suites(self.point, kind):
            return None
        declared = registry.declared_reads(self.point, kind) or ()
        wanted = (*declared, self.setting)
        call = self.point.replace(" ", "_")  # loss_scaler(...), the registry's function
        decorator = registry.BY_IMPORT_PATH[self.point][1]  # @register_scaler(...)
        return (
            f"{key} would change nothing in this run: the {self.point} {kind!r} (registered by "
            f"{registry.owner(self.point, kind)}) does not declare that it reads "
            f"{self.setting}. If it does, declare it where it is registered: reads={wanted!r} "
            f"in its {call}({kind!r}, ...) or @{decorator}({kind!r}, ...) "
            f"(docs/adding-an-experiment.md); if not, remove {key}=... from the command line."
        )


class Registered(Sequence[str]):
    """read_when's kinds for a setting that every registered name of `point` reads (whoever
    applies a loss scale reads precision.per_loss_scale, a plugin's scaler as the suite's):
    asked of the registry at each check."""

    def __init__(self, point: str) -> None:
        self.point = point

    def __getitem__(self, index):  # an index or a slice, of the sorted names
        from mpt_repro import registry

        return registry.names(self.point)[index]

    def __len__(self) -> int:
        from mpt_repro import registry

        return len(registry.names(self.point))

    def __contains__(self, kind: object) -> bool:
        from mpt_repro import registry

        return kind in registry.names(self.point)


def read_if_declared(selector: str, point: str, setting: str) -> dict[str, Any]:
    """Field metadata: the key changes a run only when the kind `selector` names (a registered
    name of `point`: `loss_scaling`, the run's loss scaler) declares in its registration that it
    reads `setting` (its field name): `reads=` (registry.loss_scaler, register_scaler). A kind
    of a plugin that does not is refused with how to declare it."""
    return {"read_when": (selector, Declaring(point, setting))}


def read_by_every(selector: str, point: str) -> dict[str, Any]:
    """Field metadata: the key changes a run whenever the kind `selector` names is a registered
    name of `point`, a plugin's included (a loss scaler of any kind)."""
    return {"read_when": (selector, Registered(point))}


# the registry's extension point of the trainer's settings a task acts on (honours)
HONOURED = "honoured setting"


def read_if_honoured() -> dict[str, Any]:
    """Field metadata of a trainer setting that the trainer hands to the task, which may have
    nothing to act on (`trainer.recalibrate_bn` without BatchNorm inputs, `trainer.compile`
    without a forward to compile): a task's plugin names the ones its task acts on (`honours`),
    and a command-line value for a task that does not is refused
    (config.check_overrides_are_read)."""
    return {"read_if_honoured": True}


def honours(kind: str, *keys: str) -> None:
    """Say, from a task's plugin module, which read_if_honoured settings task `kind` acts on,
    e.g. honours("my_task", "trainer.recalibrate_bn"). Registered like the task itself (one
    registry: a second module saying otherwise of the same task is refused)."""
    import sys

    from mpt_repro import registry

    registry.register(HONOURED, kind, tuple(sorted(keys)), sys._getframe(1).f_globals["__name__"])


def formerly(old_key: str) -> dict[str, Any]:
    """Field metadata: the key this setting had before it moved into the schema of the options
    that read it (`optim.label_smoothing`, now the classifiers' `model.label_smoothing`): a
    command line that still sets the old key is refused in one line naming the new one
    (config.check_command_line), rather than as a key no schema has."""
    return {"formerly": old_key}


def require(ok: bool, key: str, value: Any, must: str) -> None:
    """Raise ConfigError naming the key, its value and what it must be."""
    if not ok:
        raise ConfigError(
            f"{key} {must} (got {value!r}). Fix it in the config or on the command line, e.g. "
            f"{key}=..."
        )


def in_unit(x: float, key: str) -> None:
    """A probability-like value: in [0, 1)."""
    require(0 <= x < 1, key, x, "must be in [0, 1)")


# -- models ----------------------------------------------------------------------------------------
@dataclass
class ModelSchema:
    name: str = MISSING

    @classmethod
    def check(cls, m: Any, cfg: Any) -> None:
        """The checks of this option's own fields (ConfigError naming the key)."""


def split_target(target: str) -> tuple[str, str]:
    """`package.module:factory` (or Hydra's `package.module.factory`) as (module, attribute);
    either is empty when the target does not name both."""
    module, sep, attr = target.partition(":")
    if not sep:
        module, _, attr = target.rpartition(".")
    return module, attr


def missing_module(module: str) -> str | None:
    """Why `module` cannot be imported, found without importing it (only its parent packages,
    as Python's own search does), so that a misspelt model.target is refused before torch loads;
    None when it is there or when only importing it would tell (its package fails to import)."""
    import importlib.util

    if not module:
        return None  # the factory check names the malformed target itself
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError as e:
        return f"no module named {e.name!r}"
    except Exception:  # noqa: BLE001 - a parent package that fails to import: the build says why
        return None
    return None if found is not None else f"no module named {module!r}"


# -- data sets -------------------------------------------------------------------------------------
def read_if_listed() -> dict[str, Any]:
    """Field metadata of a base schema's field that only some options read: an option's schema
    names the fields it reads in its `reads` (config.check_overrides_are_read refuses a
    command-line value for an option that does not)."""
    return {"read_if_listed": True}


@dataclass
class DataSchema:
    name: str = MISSING
    # the data set's folder, in its standard layout (README.md, "Data"); null for data that
    # ships with the project or is made up
    root: str | None = field(default=None, metadata=read_if_listed())
    batch_size: int = 64  # one micro-batch of one process (trainer.accumulate, distributed.*)
    eval_batch_size: int | None = None  # null: same as batch_size
    train_limit: int | None = None  # use only the first N training examples (budgets)
    eval_limit: int | None = None
    # loader worker processes, and pinned host memory for their batches
    num_workers: int = field(default=0, metadata=read_if_listed())
    pin_memory: bool = field(default=True, metadata=read_if_listed())

    # the fields marked read_if_listed() that this option reads
    reads: ClassVar[tuple[str, ...]] = ()
    # a data set that needs its folder (data.root) unless it has a stand-in: mpt-run refuses it
    # without one before torch loads, and says which options run without a folder
    needs_root: ClassVar[bool] = False

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        require(d.batch_size > 0, "data.batch_size", d.batch_size, "must be a positive integer")
        for key in ("eval_batch_size", "train_limit", "eval_limit"):
            require(d[key] is None or d[key] > 0, f"data.{key}", d[key], "must be positive or null")
        require(d.num_workers >= 0, "data.num_workers", d.num_workers, "must be >= 0")


LOADER = ("num_workers", "pin_memory")  # the fields of a data set read through DataLoaders


@dataclass
class ImageData(DataSchema):
    """The fields every image data set carries (the experiments set them whatever the data set:
    a paper experiment on made-up images keeps its shape)."""

    num_classes: int = field(default=10, metadata=read_if_listed())
    channels: int = field(default=1, metadata=read_if_listed())
    image_size: int = field(default=8, metadata=read_if_listed())  # the training crop
    # validation: resize the shorter side, then centre-crop image_size
    resize_size: int | None = field(default=None, metadata=read_if_listed())
    augmentation: str = field(default="none", metadata=read_if_listed())

    # the data.augmentation values the option's loader implements; None: those of every image
    # data set (data made up in the experiment's shape keeps the experiment's value)
    augmentations: ClassVar[tuple[str, ...] | None] = ("none",)

    @classmethod
    def check(cls, d: Any, cfg: Any) -> None:
        super().check(d, cfg)
        require(d.image_size > 0, "data.image_size", d.image_size, "must be positive")
        known = cls.augmentations if cls.augmentations is not None else all_augmentations()
        require(
            d.augmentation in known,
            "data.augmentation",
            d.augmentation,
            f"must be one of {known} for data={d.name}",
        )


def all_augmentations() -> tuple[str, ...]:
    from mpt_repro import registry

    found = [
        a
        for schema in registry.option_schemas()["data"].values()
        for a in (getattr(schema, "augmentations", None) or ())
    ]
    return tuple(dict.fromkeys(found))


def register_option_schemas(store: Any) -> None:
    """Put every plugin's option schemas in Hydra's ConfigStore (group schema/<group>)."""
    from mpt_repro import registry

    for group, schemas in registry.option_schemas().items():
        for name, node in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=node)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def schema_of(node: Any) -> type | None:
    """The dataclass behind a composed node (None for a plain mapping)."""
    from omegaconf import OmegaConf

    found = OmegaConf.get_type(node)
    return found if dataclasses.is_dataclass(found) else None
