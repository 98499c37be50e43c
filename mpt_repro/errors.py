"""Errors that end a run with a clear message instead of a traceback."""


class UserError(Exception):
    """Bad input the user can fix: the message says what to do. The CLI prints it and exits 2."""


class ConfigError(UserError):
    """An invalid or contradictory configuration value; the message names the key."""


class DataError(UserError):
    """A missing, empty or malformed data set; the message names the expected layout."""


class Diverged(Exception):
    """Training diverged (non-finite loss, or the loss scale stuck at its floor).

    Divergence is a result, not a crash: the run ends with status ``diverged``.
    """

    def __init__(self, reason: str, step: int | None = None, layer: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.step = step
        self.layer = layer  # the parameter whose gradient went non-finite, when known
