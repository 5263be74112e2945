"""Error types whose messages are meant for the user.

The CLI prints a :class:`UserError` as one line (``error: ...``) and exits with its
``exit_code``, without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class EsperError(Exception):
    """Base class of Esper's own errors."""


class UserError(EsperError):
    """Bad input from the user (config, paths, data, checkpoints); exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A user error in the configuration; the message names the key path."""


class DatasetError(UserError):
    """A dataset is missing or malformed; the message says what to put where."""


class CheckpointError(UserError):
    """A checkpoint cannot be loaded (corrupt, unsafe, or from another configuration)."""


class CheckpointSaveError(EsperError):
    """A checkpoint could not be written (disk full, permissions); the previous one is
    intact. A failed run, not bad input: exit code 1."""
