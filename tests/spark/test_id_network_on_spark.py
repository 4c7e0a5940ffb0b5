"""A detector with ``id_labels`` (the preset ``knn-id``) trains on the Spark engine (local[2]): its
network learns the units on Spark, and the detector learnt there from that network's embeddings
equals the one this process learns from them."""
from __future__ import annotations

import numpy as np
import pytest

from tests.machine_clips import write_clips
from wavetrain.data import load_dataset
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.jobs import RunOptions, train_model

pytestmark = pytest.mark.slow     # (a network trained by Spark ranks: about a minute)


def test_knn_id_trains_on_spark_with_the_local_detector(job, tmp_path):
    units = (("u1", 18.0), ("u2", 26.0), ("u3", 37.0))
    write_clips(tmp_path, ((f"{unit}_{i}", "normal", hz * (1 + 0.01 * i), (u, i), 20.0, {"unit": unit})
                           for u, (unit, hz) in enumerate(units) for i in range(6)))
    (tmp_path / "net.toml").write_text('model = "cnn-id"\nepochs = 2\n')
    ds = load_dataset(tmp_path / "metadata.csv")
    there, _ = train_model(ds, "state", "knn-id", {"id_labels": "unit", "id_network": str(tmp_path / "net.toml")},
                           RunOptions(), engine=job, network=tmp_path / "spark.net.wt")
    assert load_model(tmp_path / "spark.net.wt").fitted_labels == ["u1", "u2", "u3"]
    here, _ = train_model(ds, "state", "knn-anomaly", {"subwindow_frames": 1, "features": there.params["features"]},
                          RunOptions())
    np.testing.assert_allclose(there.vectors_, here.vectors_, rtol=1e-5)
    np.testing.assert_allclose(there.threshold_, here.threshold_, rtol=1e-5)
