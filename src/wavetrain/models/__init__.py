"""Model families (gmm, cnn, dcase), their shared contract, registry and model files."""
from wavetrain.models.base import COMMON_PARAMS, Batch, Classifier, WindowStream
from wavetrain.models.modelfile import load_model, read_model_file, save_model
from wavetrain.models.params import Param, validate_params
from wavetrain.models.registry import build, family, family_names, parse_set, resolve_spec

__all__ = ["COMMON_PARAMS", "Batch", "Classifier", "Param", "WindowStream", "build", "family",
           "family_names", "load_model", "parse_set", "read_model_file", "resolve_spec", "save_model",
           "validate_params"]
