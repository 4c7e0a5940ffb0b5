"""wavetrain: train sound and vibration classifiers with bounded, predictable memory."""
from wavetrain.core.threads import set_default_threads as _set_default_threads

_set_default_threads()

from wavetrain.core.errors import (  # noqa: E402
    AudioError,
    MemoryLimitError,
    MetadataError,
    ModelFileError,
    NotFittedError,
    ParameterError,
    SpecError,
    UserError,
    WavetrainError,
)

__version__ = "0.1.0"

__all__ = [
    "AudioError", "MemoryLimitError", "MetadataError", "ModelFileError", "NotFittedError",
    "ParameterError", "SpecError", "UserError", "WavetrainError", "__version__",
]
