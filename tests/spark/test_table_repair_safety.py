"""A damaged feature table is repaired, not a crash: a part file that cannot be read is removed
(one warning) and its recordings extracted again; temporary files of runs that died are swept,
those of live runs kept."""
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from wavetrain.core.errors import UserError
from wavetrain.pipeline.jobs import RunOptions, train_model
from wavetrain.spark.table import STALE_SECONDS, FeatureTable

GMM = {"components": "2", "features": "logmel(bands=8)"}

KEY = "logmel(bands=4)"


def _grams(*recs):
    return [(r, np.full((5, 4), i, np.float32), 16000, 0.01, 50) for i, r in enumerate(recs)]


def _damage(path, how):
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2] if how == "truncated" else os.urandom(len(data)))


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty"])
def test_a_part_that_cannot_be_read_is_removed_with_one_warning(tmp_path, caplog, how):
    table = FeatureTable(str(tmp_path / "t"))
    good = table.write_part(KEY, _grams("a", "b"), ["a", "b"])
    bad = table.write_part(KEY, _grams("c", "d"), ["c", "d"])
    if how == "empty":
        Path(bad).write_bytes(b"")
    else:
        _damage(bad, how)
    with caplog.at_level(logging.WARNING, logger="wavetrain.spark.table"):
        catalog = table.catalog([KEY])
    assert catalog == {("a", KEY): good, ("b", KEY): good}
    assert not os.path.exists(bad) and table.parts(KEY) == [good]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad in warnings[0] and "extracted again" in warnings[0]
    assert "\n" not in warnings[0]


def _flip_features(path):
    """Overwrite bytes in the middle of the first row group's feature column (``x``): the file
    still opens and its ``rec`` column reads, but a page fails its checksum."""
    import pyarrow.parquet as pq

    chunk = pq.ParquetFile(path).metadata.row_group(0).column(7)
    assert chunk.path_in_schema == "x"
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    at = start + chunk.total_compressed_size // 2
    data = bytearray(Path(path).read_bytes())
    data[at:at + 16] = bytes(b ^ 0xFF for b in data[at:at + 16])
    Path(path).write_bytes(bytes(data))


def test_a_part_whose_pages_fail_their_checksum_is_removed_and_named_in_one_line(tmp_path):
    table = FeatureTable(str(tmp_path / "t"))
    rng = np.random.default_rng(0)
    grams = [(r, rng.random((3000, 13), dtype=np.float32), 16000, 0.01, 30000) for r in ("a", "b")]
    path = table.write_part(KEY, iter(grams), ["a", "b"])
    _flip_features(path)
    assert table.catalog([KEY]) == {("a", KEY): path, ("b", KEY): path}     # it opens
    with pytest.raises(UserError, match="is damaged .*checksum.*run the command again") as caught:
        list(table.read_part(path))
    assert path in str(caught.value) and "\n" not in str(caught.value)
    assert not os.path.exists(path) and table.catalog([KEY]) == {}


def test_a_read_that_fails_for_another_reason_is_left_to_a_retry(tmp_path, monkeypatch):
    table = FeatureTable(str(tmp_path / "t"))
    path = table.write_part(KEY, _grams("a"), ["a"])

    def lost(*args):
        raise OSError("connection reset by peer")
        yield

    monkeypatch.setattr(table, "_read_part", lost)
    with pytest.raises(OSError, match="connection reset"):
        list(table.read_part(path))
    assert os.path.exists(path)


def _age(path, seconds):
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_sweep_removes_stale_temporary_files_of_other_runs_and_keeps_live_ones(tmp_path):
    root = tmp_path / "t"
    earlier = FeatureTable(str(root))
    earlier.write_part(KEY, _grams("a"), ["a"])
    folder = os.path.dirname(earlier.parts(KEY)[0])
    dead = [os.path.join(folder, f".tmp-0123-{earlier.run}-ab12cd34.parquet"),
            os.path.join(folder, ".tmp-4567-89abcdef.parquet")]              # the older name form
    live = os.path.join(folder, ".tmp-0123-feedface0000-99999999.parquet")
    for p in dead + [live]:
        Path(p).write_bytes(b"half a part")
    for p in dead:
        _age(p, STALE_SECONDS + 60)
    dead_predictions = earlier.scratch("predictions")
    Path(f"{dead_predictions}/.part-000000.1234abcd").write_text("{}\n")
    for p in (f"{dead_predictions}/.part-000000.1234abcd", dead_predictions):
        _age(p, STALE_SECONDS + 60)
    other_training = earlier.scratch("train")          # a checkpoint folder: swept only by its own run
    _age(other_training, STALE_SECONDS + 60)

    now = FeatureTable(str(root))
    mine = os.path.join(folder, f".tmp-0123-{now.run}-00000000.parquet")
    Path(mine).write_bytes(b"being written")
    _age(mine, STALE_SECONDS + 60)                         # this run's own files are never stale
    assert now.sweep() == 3
    assert not any(os.path.exists(p) for p in dead) and not os.path.exists(dead_predictions)
    assert os.path.exists(live) and os.path.exists(mine) and os.path.isdir(other_training)
    assert len(now.parts(KEY)) == 1 and now.catalog([KEY]) == {("a", KEY): now.parts(KEY)[0]}


def test_sweep_of_this_run_removes_all_its_temporary_files_at_once(tmp_path):
    table = FeatureTable(str(tmp_path / "t"))
    table.write_part(KEY, _grams("a"), ["a"])
    folder = os.path.dirname(table.parts(KEY)[0])
    mine = os.path.join(folder, f".tmp-0123-{table.run}-00000000.parquet")
    other = os.path.join(folder, ".tmp-0123-feedface0000-00000000.parquet")
    for p in (mine, other):
        Path(p).write_bytes(b"half a part")
    stage, training = table.scratch("predictions"), table.scratch("train")
    Path(f"{stage}/.part-000001.abcd1234").write_text("{}\n")
    assert table.sweep(mine=True) == 3
    assert not os.path.exists(mine) and not os.path.exists(stage) and not os.path.exists(training)
    assert os.path.exists(other) and len(table.parts(KEY)) == 1


def test_sweep_of_a_table_not_made_yet_is_nothing(tmp_path):
    assert FeatureTable(str(tmp_path / "none")).sweep() == 0
    assert FeatureTable(str(tmp_path / "none")).sweep(mine=True) == 0
    assert not (tmp_path / "none").exists()


def test_a_run_token_travels_with_the_table_to_executors(tmp_path):
    import pickle

    table = FeatureTable(str(tmp_path / "t"))
    again = pickle.loads(pickle.dumps(table))
    assert again.run == table.run and again.root == table.root
    assert FeatureTable(str(tmp_path / "t")).run != table.run


def test_a_damaged_part_is_extracted_again_on_spark(job, demo_csv, caplog):
    from wavetrain.data import load_dataset
    from wavetrain.spark import engine

    ds = load_dataset([demo_csv])
    first = engine.extract_features(job, ds, "logmel(bands=8)")
    key = first.keys[0]
    parts = job.table.parts(key)
    assert len(parts) > 1
    damaged = parts[0]
    lost = sorted(rec for (rec, k), p in first.catalog.items() if p == damaged)
    _damage(damaged, "truncated")
    folder = os.path.dirname(damaged)
    leftover = os.path.join(folder, ".tmp-0123-deadbeef0000-00000000.parquet")
    Path(leftover).write_bytes(b"a task killed half-way")
    _age(leftover, STALE_SECONDS + 60)
    with caplog.at_level(logging.WARNING, logger="wavetrain.spark.table"):
        again = engine.extract_features(job, ds, "logmel(bands=8)")
    assert again.extracted == len(lost) > 0
    assert sorted(again.catalog) == sorted(first.catalog)
    assert [r for r in caplog.records if r.levelno == logging.WARNING and damaged in r.getMessage()]
    assert not os.path.exists(leftover)
    for path in job.table.parts(key):                   # every part reads back whole
        assert list(job.table.read_part(path))


def test_a_part_damaged_inside_stops_the_job_in_one_line_and_the_next_run_extracts_it(job, demo_csv):
    from wavetrain.data import load_dataset
    from wavetrain.spark import engine

    ds = load_dataset([demo_csv])
    first = engine.extract_features(job, ds, "logmel(bands=8)")
    damaged = job.table.parts(first.keys[0])[0]
    lost = sum(1 for p in first.catalog.values() if p == damaged)
    _flip_features(damaged)
    with pytest.raises(UserError, match="is damaged") as caught:
        train_model(ds, "state", "gmm", GMM, RunOptions(), engine=job)
    assert damaged in str(caught.value) and "\n" not in str(caught.value)
    assert not os.path.exists(damaged)
    model, prep = train_model(ds, "state", "gmm", GMM, RunOptions(), engine=job)
    assert prep.extracted == lost and model.labels_ == ["bearing", "healthy", "loose"]
