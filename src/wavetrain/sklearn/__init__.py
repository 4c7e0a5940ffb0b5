"""scikit-learn estimators over wavetrain models (:mod:`wavetrain.sklearn.estimators`):
:class:`SoundClassifier` and :class:`SoundAnomalyDetector` fit on lists of audio files or arrays
of samples through the local engine's jobs and predict per recording as ``wavetrain classify``
does. Needs scikit-learn."""
from __future__ import annotations

from wavetrain.sklearn.estimators import LABEL, InvalidParameterError, SoundAnomalyDetector, SoundClassifier

__all__ = ["LABEL", "InvalidParameterError", "SoundAnomalyDetector", "SoundClassifier"]
