"""Errors the analysis layer raises for expected user mistakes.

They subclass :class:`esper.errors.UserError`, so every CLI (``esper analyze`` and
``python -m esper_analysis``) prints them as one ``error: ...`` line and exits with 2.
"""

from __future__ import annotations

from esper.errors import UserError


class AnalysisError(UserError):
    """Base of the analysis layer's user-facing errors."""


class RunNotFoundError(AnalysisError):
    """The path is missing, or is not a run directory (no manifest, no events)."""


class CorruptFileError(AnalysisError):
    """A Parquet file or the manifest cannot be read; the message names the file."""


class NewerSchemaError(AnalysisError):
    """The run was written by a newer schema version than this code understands."""


class BaselineError(AnalysisError):
    """A baseline file is missing, unreadable, or not a baseline."""
