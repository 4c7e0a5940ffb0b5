"""``adapt`` on the Spark engine (local[2]): the new recordings' summary passes and scores run as
Spark jobs, and the adapted detector equals the one adapted in this process."""
from __future__ import annotations

import copy

import numpy as np
import soundfile as sf

from wavetrain.data import load_dataset
from wavetrain.data.demo import machine_sound
from wavetrain.pipeline.jobs import RunOptions, adapt_model, train_model


def test_adapting_on_spark_equals_adapting_here(job, tmp_path):
    rows = []
    for unit, hz in (("u1", 20.0), ("u2", 31.0)):
        for i in range(5):
            sf.write(tmp_path / f"{unit}_{i}.wav", machine_sound("healthy", seconds=1.0, shaft_hz=hz * (1 + 0.01 * i),
                                                                rng=np.random.default_rng(i)), 16000)
            rows.append(f"{unit}_{i}.wav,unit={unit}")
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    ds = load_dataset(tmp_path / "metadata.csv")
    old, _ = train_model(ds.filter(lambda r: r.labels["unit"] == "u1"), None, "knn-anomaly",
                         {"k": 1, "valid_fraction": 0.0}, RunOptions())
    new = ds.filter(lambda r: r.labels["unit"] == "u2")
    here, there = copy.deepcopy(old), copy.deepcopy(old)
    info_here, _ = adapt_model(here, new, RunOptions())
    info_there, _ = adapt_model(there, new, RunOptions(), engine=job)
    np.testing.assert_allclose(there.vectors_, here.vectors_)
    np.testing.assert_allclose(there.weights_, here.weights_)
    assert info_there["windows"] == info_here["windows"] == 5
    assert there.threshold_ == here.threshold_ and info_there == info_here
