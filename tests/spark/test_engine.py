"""The Spark engine (local[2]) gives what the local engine gives: the same GMM (parameters to
1e-6), the same predictions, the same k-fold results; its feature table is written once."""
import shutil
from pathlib import Path

import numpy as np
import pytest

from wavetrain.core.errors import AudioError
from wavetrain.data import load_dataset
from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, evaluate_model, train_model
from wavetrain.spark import engine

GMM = {"components": "3"}


def _same_gmm(a, b, rtol=1e-6):
    assert a.labels_ == b.labels_ and a.feature_dim_ == b.feature_dim_ and a.feature_rate_ == b.feature_rate_
    for key in ("em_passes", "converged"):
        assert a.train_info_[key] == b.train_info_[key]
    for name in ("weights_", "means_", "variances_", "score_mean_", "score_sd_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=1e-9, err_msg=name)


@pytest.fixture(scope="module")
def data_with_a_copy(demo_csv, tmp_path_factory):
    """The demo data plus one recording listed twice (under two names): read twice by both engines."""
    folder = tmp_path_factory.mktemp("copy")
    for f in demo_csv.parent.iterdir():
        shutil.copy(f, folder / f.name)
    lines = (folder / "metadata.csv").read_text().splitlines()
    first = lines[0] if not lines[0].lower().startswith("file") else lines[1]
    name = first.split(",")[0]
    shutil.copy(folder / name, folder / f"again_{name}")
    (folder / "metadata.csv").write_text("\n".join(lines + [first.replace(name, f"again_{name}", 1)]) + "\n")
    return folder / "metadata.csv"


@pytest.mark.parametrize("clips", [{}, {"clip_ms": "300", "clip_shift_ms": "200"}], ids=["whole", "clips"])
def test_gmm_on_spark_equals_the_local_fit(job, data_with_a_copy, clips):
    ds = load_dataset([data_with_a_copy])
    local, _ = train_model(ds, "state", "gmm", {**GMM, **clips}, RunOptions())
    on_spark, prep = train_model(ds, "state", "gmm", {**GMM, **clips}, RunOptions(), engine=job)
    assert len(prep.tasks()) > 1          # the data really was split over several tasks
    _same_gmm(on_spark, local)


def test_gmm_streamed_locally_equals_spark(job, demo_csv):
    """The local engine's other path (frames re-read from the store every pass) ends there too."""
    ds = load_dataset([demo_csv])
    local, _ = train_model(ds, "state", "gmm", {**GMM, "frame_cache_mb": "0"}, RunOptions())
    on_spark, _ = train_model(ds, "state", "gmm", {**GMM, "frame_cache_mb": "0"}, RunOptions(), engine=job)
    _same_gmm(on_spark, local)


def test_features_are_extracted_once_and_a_rerun_writes_the_same_part_files(job, demo_csv):
    ds = load_dataset([demo_csv])
    first = engine.extract_features(job, ds, "mfcc(coeffs=13)")
    assert first.extracted == len(ds) and not first.skipped
    files = {p: Path(p).read_bytes() for p in job.table.parts(first.keys[0])}
    again = engine.extract_features(job, ds, "mfcc(coeffs=13)")
    assert again.extracted == 0 and again.catalog == first.catalog
    # a task run twice (a retry, a speculative copy) writes the same file, with the same content
    path = next(iter(files))
    recs = sorted({rec for rec, _ in first.catalog if first.catalog[(rec, first.keys[0])] == path})
    grams = [(g.rec, g.gram, g.rate, g.shift, g.duration_ms) for g in job.table.read_part(path)]
    order = [g[0] for g in grams]
    assert sorted(order) == recs
    assert job.table.write_part(first.keys[0], iter(grams), order) == path
    assert Path(path).read_bytes() == files[path]
    assert {p: Path(p).read_bytes() for p in job.table.parts(first.keys[0])} == files


def test_a_table_read_back_gives_the_grams_the_local_source_computes(job, demo_csv):
    from wavetrain.features import parse_spec
    from wavetrain.stream.source import FeatureSource

    ds = load_dataset([demo_csv])
    prep = engine.extract_features(job, ds, "logmel(bands=16)")
    source = FeatureSource(parse_spec("logmel(bands=16)"))
    by_id = {rec.id: rec for rec in ds}
    seen = 0
    for path in job.table.parts(prep.keys[0]):
        for g in job.table.read_part(path, rows=1):        # one row at a time still joins blocks
            np.testing.assert_array_equal(g.gram, source.gram(by_id[g.rec]))
            seen += 1
    assert seen == len(ds)


def test_predictions_on_spark_are_the_local_engines_in_the_same_order(job, demo_csv, tmp_path):
    from wavetrain.pipeline.jobs import window_predictions

    ds = load_dataset([demo_csv])
    model, _ = train_model(ds, "state", "gmm", {**GMM, "clip_ms": "400"}, RunOptions())
    local, _ = window_predictions(model, ds, RunOptions())
    local_rows = [p.to_json("state") for p in local]
    there, skipped = window_predictions(model, ds, RunOptions(), engine=job)
    rows = [p.to_json("state") for p in there]
    assert not skipped and len(rows) == len(local_rows) > len(ds)
    assert rows == local_rows
    assert not list((tmp_path / "table").glob("_scratch/*"))      # the staging parts are gone


def test_kfold_on_spark_gives_the_local_results(job, demo_csv):
    ds = load_dataset([demo_csv])
    local = evaluate_kfold(ds, "state", "gmm", GMM, RunOptions(), folds=3)
    on_spark = evaluate_kfold(ds, "state", "gmm", GMM, RunOptions(), folds=3, engine=job)
    assert on_spark["confusion"] == local["confusion"]
    assert [f["accuracy"] for f in on_spark["folds"]] == [f["accuracy"] for f in local["folds"]]
    assert on_spark["accuracy"] == local["accuracy"] > 0.5


def test_evaluating_a_model_file_on_spark_gives_the_local_report(job, demo_csv):
    ds = load_dataset([demo_csv])
    model, _ = train_model(ds, "state", "gmm", GMM, RunOptions())
    local = evaluate_model(model, ds, "state", RunOptions())
    on_spark = evaluate_model(model, ds, "state", RunOptions(), engine=job)
    for key in ("confusion", "accuracy", "macro_f1", "recordings", "unseen_values"):
        assert on_spark[key] == local[key]


def test_a_bad_recording_is_one_error_or_skipped(job, demo_csv, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(demo_csv.parent, folder)
    import soundfile as sf

    victim = sorted(folder.glob("*.wav"))[0]
    sf.write(victim, np.zeros(5, np.float32), 16000)          # readable, but shorter than one frame
    ds = load_dataset([folder / "metadata.csv"])
    with pytest.raises(AudioError, match=victim.name):
        train_model(ds, "state", "gmm", GMM, RunOptions(), engine=job)
    model, prep = train_model(ds, "state", "gmm", GMM, RunOptions(skip_bad=True), engine=job)
    assert [r.path.name for r, _ in prep.skipped] == [victim.name] and len(prep.ds) == len(ds) - 1


def test_the_spark_plan_of_executors_does_not_grow_with_the_data(demo_csv, tmp_path):
    from wavetrain.models.registry import build
    from wavetrain.spark.plan import plan_spark
    from wavetrain.spark.session import SparkSettings

    ds = load_dataset([demo_csv])
    model = build("gmm", GMM)
    model.label_name_ = "state"
    small = plan_spark(ds.subset(range(6)), model, SparkSettings("local[2]"))
    whole = plan_spark(ds, model, SparkSettings("local[2]"))
    assert whole.executor_mb["table_read"] == small.executor_mb["table_read"]
    assert whole.executor_mb["extraction"] == small.executor_mb["extraction"]
    assert whole.driver_mb["recordings"] > small.driver_mb["recordings"]
    assert 150 < whole.executor_peak_mb < 400 and whole.settings["spark.executor.memory"] == "1g"
    assert "executor Python worker" in whole.format()
    # grams kept between passes: at most the bound, and at most a worker's share of the features
    assert 0 < whole.executor_mb["gram_cache"] <= 64 and whole.settings["gram_cache_mb"] == 64
    none = plan_spark(ds, model, SparkSettings("local[2]", {"spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE": "0"}))
    assert none.executor_mb["gram_cache"] == 0 and none.executor_peak_mb < whole.executor_peak_mb


def test_a_memory_limit_gives_the_gram_cache_what_the_workers_leave(demo_csv, monkeypatch):
    from wavetrain.core.errors import MemoryLimitError
    from wavetrain.models.registry import build
    from wavetrain.pipeline.memory import MB
    from wavetrain.spark import plan as spark_plan
    from wavetrain.spark.plan import plan_spark, plan_within
    from wavetrain.spark.session import SparkSettings

    monkeypatch.setattr(spark_plan, "current_rss", lambda: 100 * MB)    # (this test process's own size aside)

    ds = load_dataset([demo_csv])
    model = build("gmm", GMM)
    model.label_name_ = "state"
    key = "spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE"
    bare = plan_spark(ds, model, SparkSettings("local[2]", {key: "0"}))
    roomy, settings = plan_within(ds, model, SparkSettings("local[2]"), 1 << 30)
    assert roomy.executor_peak_mb * MB <= 1 << 30 and int(settings.conf[key]) > 64 * MB
    assert 0 < roomy.executor_mb["gram_cache"] <= roomy.executor_peak_mb - bare.executor_peak_mb
    tight, settings = plan_within(ds, model, SparkSettings("local[2]"), int((bare.executor_peak_mb + 1) * MB))
    assert tight.executor_mb["gram_cache"] < 1 and tight.executor_peak_mb <= bare.executor_peak_mb + 1
    kept, settings = plan_within(ds, model, SparkSettings("local[2]", {key: "0"}), 1 << 30)   # the user's bound stands
    assert kept.executor_mb["gram_cache"] == 0 and settings.conf[key] == "0"
    with pytest.raises(MemoryLimitError, match="executor's Python worker needs"):
        plan_within(ds, model, SparkSettings("local[2]"), int(bare.executor_peak_mb * MB / 2))
