"""Augmentation on the Spark engine (local[2]) draws exactly as the local engine: the executors
decode, augment (seed, recording content, draw; copies), extract and cut each training recording
with the local stream's own functions, so a pass's windows are the local pass's windows, a
statistic family fitted on them equals the local fit, and validation windows stay clean."""
from collections import defaultdict

import numpy as np
import pytest

from tests.spark.test_engine import _same_gmm
from tests.spark.test_statistic_families import _same_threshold
from wavetrain.data import load_dataset
from wavetrain.models import build
from wavetrain.pipeline.jobs import RunOptions, evaluate_model, feature_layout, make_stream, train_model
from wavetrain.spark import engine
from wavetrain.spark.neural import RankJob
from wavetrain.spark.shards import TableStream
from wavetrain.stream.source import FeatureSource
from wavetrain.stream.windows import Windowing

#: Audio stages (the executors decode and augment the recordings) with two copies per pass.
WAVE = "copies(n=2) | noise(snr=10:20) | gain(db=-3:3)"
#: Masks only (the executors mask the table's clean grams).
MASKS = "specaugment(time=1, freq=1, width=2)"


def _by_recording(batches) -> dict[int, list[np.ndarray]]:
    """Windows of one pass grouped by the ordinal of their recording, in the order they came."""
    out: dict[int, list[np.ndarray]] = defaultdict(list)
    for b in batches:
        for g, ref in zip(b.grams, b.refs):
            out[ref[0]].append(g)
    return out


def _prepared(job, ds, model):
    rate, channels = feature_layout(ds, model.feature_spec)
    return engine.prepare(job.spark, job.table, ds, FeatureSource(model.feature_spec, rate=rate, channels=channels))


@pytest.mark.parametrize("augment", [WAVE, MASKS], ids=["audio", "masks"])
def test_a_pass_on_the_executors_has_the_local_passes_windows(job, demo_csv, augment):
    ds = load_dataset([demo_csv])
    model = build("gmm", {"augment": augment, "seed": "7", "clip_ms": "300"})
    labels = sorted(set(ds.values("state")))
    local = make_stream(ds, model, RunOptions(), label="state", labels=labels)
    prep = _prepared(job, ds, model)
    ys = engine.label_indices(prep.ds, "state", labels)
    spark = TableStream(job.table, prep.tasks(ys), model.feature_spec, Windowing.from_params(model.params), labels,
                        prep.feature_dim, rate=prep.source.rate, channels=prep.source.channels,
                        augmenting=engine._augmenting(model, prep, prep.ds))
    for draw in (0, 3):
        want, got = _by_recording(local.batches(seed=draw)), _by_recording(spark.batches(seed=draw))
        assert sorted(got) == sorted(want) == list(range(len(ds)))
        for i in want:
            assert len(got[i]) == len(want[i]), i
            for a, b in zip(got[i], want[i]):
                np.testing.assert_array_equal(a, b)
    clean = _by_recording(make_stream(ds, model, RunOptions(), label="state", labels=labels, train=False).batches())
    changed = [i for i in clean if not all(np.array_equal(a, b) for a, b in zip(clean[i], want[i]))]
    assert len(changed) == len(ds)                        # every recording was augmented
    copies = 2 if "copies" in augment else 1
    assert all(len(want[i]) == copies * len(clean[i]) for i in clean)


def test_an_augmenting_gmm_on_spark_equals_the_local_fit(job, demo_csv):
    ds = load_dataset([demo_csv])
    params = {"augment": WAVE, "components": "2", "seed": "3"}
    local, _ = train_model(ds, "state", "gmm", params, RunOptions())
    on_spark, prep = train_model(ds, "state", "gmm", params, RunOptions(), engine=job)
    assert len(prep.tasks()) > 1
    _same_gmm(on_spark, local)
    clean, _ = train_model(ds, "state", "gmm", {"components": "2", "seed": "3"}, RunOptions())
    assert not np.allclose(clean.means_, local.means_, rtol=1e-3)       # the augmentation mattered


def test_an_augmenting_detector_on_spark_equals_the_local_fit_and_its_threshold_is_set_on_clean_windows(
        job, demo_csv):
    normal = load_dataset([demo_csv]).filter(lambda r: r.labels.get("state") == "healthy")
    params = {"augment": MASKS, "compress": "none", "valid_fraction": "0.3", "seed": "5"}
    local, _ = train_model(normal, "state", "normal-dist", params, RunOptions())
    on_spark, _ = train_model(normal, "state", "normal-dist", params, RunOptions(), engine=job)
    assert on_spark.count_ == local.count_
    np.testing.assert_allclose(on_spark.mean_, local.mean_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(on_spark.var_, local.var_, rtol=1e-6, atol=1e-9)
    _same_threshold(on_spark, local)
    clean, _ = train_model(normal, "state", "normal-dist", dict(params, augment=""), RunOptions())
    assert not np.allclose(clean.var_, local.var_, rtol=1e-4)
    assert clean.train_info_["threshold_windows"] == local.train_info_["threshold_windows"]
    # a fitted model's windows are scored as they are, on either engine
    everything = load_dataset([demo_csv])
    ours = evaluate_model(on_spark, everything, "state", RunOptions(), normal="healthy", engine=job)
    theirs = evaluate_model(local, everything, "state", RunOptions(), normal="healthy")
    assert ours["auc"] == pytest.approx(theirs["auc"], abs=1e-12)


def test_ranks_augment_their_training_windows_and_not_their_validation_windows(job, demo_csv):
    ds = load_dataset([demo_csv])
    model = build("cnn", {"augment": WAVE, "features": "logmel(bands=16)", "clip_ms": "500"})
    prep = _prepared(job, ds, model)
    labels = sorted(set(ds.values("state")))
    tasks = prep.tasks(engine.label_indices(prep.ds, "state", labels))
    rank = RankJob(model, job.table, tasks, tasks, labels, prep.feature_dim, prep.source.rate, prep.source.channels,
                   "unused", augmenting=engine._augmenting(model, prep, prep.ds))
    train, valid = rank.stream(tasks[:1], train=True), rank.stream(tasks[:1])
    assert valid.augmenting is None
    assert train.augmenting is not None and set(train.augmenting.recordings) == set(tasks[0][1])
    n_train, n_valid = (sum(len(b.grams) for b in s.batches(seed=1)) for s in (train, valid))
    assert n_train == 2 * n_valid                         # copies(n=2): two augmented copies per recording


def test_an_augmenting_cnn_trains_on_two_ranks(job, demo_csv):
    ds = load_dataset([demo_csv])
    model, prep = train_model(ds, "state", "cnn", {"augment": "gain(db=-3:3) | noise(snr=15:25)",
                                                         "features": "logmel(bands=16)", "clip_ms": "500",
                                                         "epochs": "1", "batch_size": "8", "valid_fraction": "0.2"},
                              RunOptions(), engine=job)
    assert model.train_info_["processes"] == 2
    assert model.predict([prep.source.gram(ds[0])[:20]])[0] in model.labels_


def test_the_spark_memory_plan_counts_the_augmentation_of_a_pass(demo_csv):
    from wavetrain.spark.plan import plan_spark
    from wavetrain.spark.session import SparkSettings

    ds = load_dataset([demo_csv])
    clean = plan_spark(ds, build("gmm", {}), SparkSettings("local[2]"))
    masks = plan_spark(ds, build("gmm", {"augment": MASKS}), SparkSettings("local[2]"))
    audio = plan_spark(ds, build("gmm", {"augment": WAVE}), SparkSettings("local[2]"))
    assert "augment" not in clean.executor_mb and "augment" not in masks.executor_mb
    assert audio.executor_mb["augment"] > 0 and audio.executor_peak_mb > clean.executor_peak_mb


def test_passes_that_draw_alike_keep_their_augmented_grams_between_passes(job, demo_csv, monkeypatch):
    from wavetrain.spark import shards

    monkeypatch.setattr(shards, "_PROCESS", {"cache": shards.GramCache(64 * 2 ** 20)})
    ds = load_dataset([demo_csv])
    model = build("gmm", {"augment": WAVE, "seed": "7"})
    prep = _prepared(job, ds, model)
    task = prep.tasks()[0]
    aug, windowing = engine._augmenting(model, prep, prep.ds).for_tasks([task]), Windowing.from_params(model.params)

    def one_pass(keep):
        return [w for w, *_ in shards.augmented_windows(job.table, task, model.feature_spec, windowing, aug, 0,
                                                        keep=keep)]

    cache = shards.process_cache()
    first = one_pass(True)
    assert cache.hits == 0 and cache.stats()["entries"] == 2 * len(task[1])    # two copies of each recording
    second = one_pass(True)
    assert cache.hits == 2 * len(task[1])
    assert len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second))
    before = cache.stats()
    assert all(np.array_equal(a, b) for a, b in zip(one_pass(False), first))    # a rank's epochs keep none
    assert cache.stats()["entries"] == before["entries"] and cache.hits == before["hits"]
