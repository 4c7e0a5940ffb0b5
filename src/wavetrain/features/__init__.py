"""Feature extraction: specs, extractors, processors and the dataset normaliser.

Public API::

    from wavetrain.features import FeatureSpec, parse_spec, extract, resample
    spec = parse_spec("logmel(bands=64, window_ms=40, shift_pct=50)")
    feats = extract(samples, rate, spec)          # (frames, 64) float32
    both = parse_spec("mfcc(coeffs=20) + logmel(bands=64)")   # one decode, 84 columns

See :mod:`wavetrain.features.extractors` for the conventions (n_fft, log scale, mel).
"""
from __future__ import annotations

from wavetrain.features import extractors, processors, stats  # noqa: F401  (registrations)
from wavetrain.features.api import extract, extract_blocks, resample
from wavetrain.features.base import Extractor
from wavetrain.features.framing import frame, get_window
from wavetrain.features.normalizer import DatasetNormalizer
from wavetrain.features.processors import Pipeline, Processor
from wavetrain.features.registry import EXTRACTORS, PROCESSORS, register_extractor, register_processor
from wavetrain.features.spec import CombinedSpec, FeatureSpec, combine_specs, describe_specs, parse_spec

__all__ = [
    "EXTRACTORS", "PROCESSORS", "CombinedSpec", "DatasetNormalizer", "Extractor", "FeatureSpec", "Pipeline",
    "Processor", "combine_specs", "describe_specs", "extract", "extract_blocks", "frame", "get_window", "parse_spec",
    "register_extractor", "register_processor", "resample",
]
