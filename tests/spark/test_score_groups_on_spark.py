"""A detector scoring by group (``normalize_by``) on the Spark engine (local[2]): the held-out part
drawn from every group, the groups' shifts and the threshold equal the local engine's, and its
predictions, shifted by group on the driver, equal those made in this process."""
from __future__ import annotations

import numpy as np

from tests.machine_clips import write_clips
from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, train_model, window_predictions


def test_scores_by_group_on_spark_equal_those_here(job, tmp_path):
    ds = load_dataset(write_clips(tmp_path, (
        (f"{unit}_{hall}_{i}", "normal" if i < 5 else "bearing", hz * (1 + 0.01 * i), (u, h, i), snr,
         {"unit": unit, "hall": hall, "split": "train" if i < 4 else "test"})
        for u, (unit, hz) in enumerate((("u1", 20.0), ("u2", 27.0)))
        for h, (hall, snr) in enumerate((("quiet", 30.0), ("loud", 3.0))) for i in range(6))))
    train, test = ds.where([("split", ["train"])]), ds.where([("split", ["test"])])
    params = {"normalize_by": "unit,hall", "valid_fraction": 0.5}
    here, _ = train_model(train, "state", "normal-dist", params, RunOptions())
    there, _ = train_model(train, "state", "normal-dist", params, RunOptions(), engine=job)
    assert set(there.group_shifts_) == set(here.group_shifts_) and len(here.group_shifts_) == 4
    for k, v in here.group_shifts_.items():
        np.testing.assert_allclose(there.group_shifts_[k], v, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(there.threshold_, here.threshold_, rtol=1e-6)
    local = list(window_predictions(here, test, RunOptions())[0])
    spark = list(window_predictions(here, test, RunOptions(), engine=job)[0])
    assert [p.recording.name for p in spark] == [p.recording.name for p in local]
    assert [p.label for p in spark] == [p.label for p in local]
    np.testing.assert_allclose([float(p.scores[0]) for p in spark], [float(p.scores[0]) for p in local], rtol=1e-5)
    assert any(here.group_shift(p.recording.labels) for p in local)       # (the scores were shifted)


def test_adapting_by_group_on_spark_equals_adapting_here(job, tmp_path):
    import copy

    from wavetrain.pipeline.jobs import adapt_model

    units = (("u1", 20.0), ("u2", 27.0), ("u3", 33.0))
    ds = load_dataset(write_clips(tmp_path, ((f"{unit}_{i}", "normal", hz * (1 + 0.01 * i), (u, i), 20.0,
                                              {"unit": unit}) for u, (unit, hz) in enumerate(units) for i in range(4))))
    old, _ = train_model(ds.where([("unit", ["u1", "u2"])]), "state", "knn-anomaly",
                         {"k": 1, "normalize_by": "unit", "valid_fraction": 0.5}, RunOptions())
    new = ds.where([("unit", ["u3"])])
    here, there = copy.deepcopy(old), copy.deepcopy(old)
    info_here, _ = adapt_model(here, new, RunOptions())
    info_there, _ = adapt_model(there, new, RunOptions(), engine=job)
    assert ("u3",) in here.group_shifts_ and set(there.group_shifts_) == set(here.group_shifts_)
    for k, v in here.group_shifts_.items():
        np.testing.assert_allclose(there.group_shifts_[k], v, rtol=1e-6, atol=1e-9)
    assert there.threshold_ == here.threshold_ and info_there == info_here
