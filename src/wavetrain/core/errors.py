"""The wavetrain error hierarchy.

Every error a user can cause derives from :class:`UserError`; the command line turns it into a
one-line message and exit code 2.  Messages name the file (and line) or parameter, what was
expected, what was found and, where there is one, the fix.
"""
from __future__ import annotations


class WavetrainError(Exception):
    """Root of every error raised by wavetrain."""


class UserError(WavetrainError):
    """An error caused by the user's input or settings (CLI exit code 2)."""


class AudioError(UserError):
    """A recording that cannot be read: missing, empty, truncated, corrupt or unsupported."""


class MetadataError(UserError):
    """A malformed metadata.csv line or a data set that cannot be used."""


class SpecError(UserError):
    """An invalid feature or model specification string."""


class ParameterError(UserError):
    """A hyper-parameter or option outside its declared limits; ``param`` names it when known."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class ModelFileError(UserError):
    """A model file that cannot be read (not a wavetrain model, wrong version, corrupt)."""


class MemoryLimitError(UserError):
    """The requested run cannot fit the given memory limit; ``plan`` is the smallest plan found
    (a :class:`wavetrain.pipeline.memory.Plan`), when there is one."""

    def __init__(self, message: str, *, plan=None):
        super().__init__(message)
        self.plan = plan


class NotFittedError(WavetrainError):
    """A model was used before it was fitted."""


class CacheError(UserError):
    """A feature cache that cannot be used: not a folder, not writable, not a wavetrain cache, or
    an invalid cache key or entry."""
