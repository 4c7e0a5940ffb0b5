"""Model families (classifiers, HMM word models and anomaly detectors: ``wavetrain models`` lists
them), their shared contract and capability tags, the registry, model files and ONNX graphs."""
from wavetrain.models import embedder  # noqa: F401  (reads .wt files for embedding features)
from wavetrain.models.base import COMMON_PARAMS, Classifier, FitOptions
from wavetrain.models.modelfile import load_model, read_model_file, save_model
from wavetrain.models.registry import build, family, family_names, resolve_spec

__all__ = ["COMMON_PARAMS", "Classifier", "FitOptions", "build", "family", "family_names", "load_model",
           "read_model_file", "resolve_spec", "save_model"]
