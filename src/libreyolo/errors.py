"""User-facing errors.

Every mistake a user can make (unknown key, bad value, missing file, corrupt data, bad checkpoint,
bad profile.json) raises a subclass of `LibreYOLOError` whose message is one clear line. The CLI
prints that line and exits with code 2 without a traceback (`LIBREYOLO_DEBUG=1` shows it).
"""

from __future__ import annotations


class LibreYOLOError(Exception):
    """Base class: a user mistake, reported as one line."""


class ConfigError(LibreYOLOError):
    """Unknown key, bad value, or an option that cannot be honoured."""


class DataError(LibreYOLOError):
    """Missing or unusable dataset: bad yaml, empty split, failed download."""


class ModelNameError(LibreYOLOError):
    """A model name that is neither a file, an official weights name nor an architecture."""


class CheckpointError(LibreYOLOError):
    """A truncated, foreign or incompatible checkpoint file."""


class ProfileFormatError(LibreYOLOError):
    """A malformed, truncated, foreign or too-new profile.json."""


class WriteError(LibreYOLOError):
    """A file could not be written (disk full, a file-size limit or quota, an I/O error); the
    line names the file and the error, and the previous file of that name is kept whole."""


class RunDirError(LibreYOLOError):
    """A run directory that cannot be used: another run holds it, it was deleted or emptied under
    a running job, or its results.csv is damaged beyond what the checkpoint can rebuild."""
