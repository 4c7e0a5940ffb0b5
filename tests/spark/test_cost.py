"""What Spark passes cost: executors keep decoded grams between passes (a second pass over a task
whose grams a worker holds reads no Parquet) and give exactly what an uncached read gives."""
import os

import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.features import parse_spec
from wavetrain.spark import shards
from wavetrain.spark.shards import GramCache, cache_bytes, part_windows
from wavetrain.spark.table import BLOCK_FRAMES, FeatureTable
from wavetrain.stream.windows import Windowing

SPEC = parse_spec("mfcc(coeffs=13)")
CLIPS = Windowing(clip_ms=300, shift_ms=200)


class CountingTable(FeatureTable):
    """A feature table that counts the part files it opens."""

    opened = 0

    def _read_part(self, path, wanted, rows):
        type(self).opened += 1
        yield from super()._read_part(path, wanted, rows)


@pytest.fixture
def table(tmp_path):
    """Three part files; one recording longer than a Parquet row (several blocks)."""
    t = CountingTable(str(tmp_path / "table"))
    rng = np.random.default_rng(0)
    paths = []
    for p in range(3):
        recs = [f"r{p}{i}" for i in range(4)]
        frames = [BLOCK_FRAMES + 300 if (p, i) == (1, 2) else 60 + 7 * i for i in range(4)]
        grams = [(rec, rng.normal(size=(n, 13)).astype(np.float32), 16000, 0.01, n * 10)
                 for rec, n in zip(recs, frames)]
        paths.append(t.write_part(SPEC.key, grams, recs))
    CountingTable.opened = 0
    return t, paths


def _tasks(paths):
    """A task per part file (one recording listed twice), then a task of a subset (a fold)."""
    return [(paths[0], {"r00": [(0, 0)], "r01": [(1, 1)], "r03": [(2, 0), (9, 0)]}),
            (paths[1], {f"r1{i}": [(3 + i, i % 2)] for i in range(4)}),
            (paths[2], {"r21": [(7, 1)], "r23": [(8, 0)]}),
            (paths[1], {"r13": [(10, 1)], "r11": [(11, 0)]})]


def _windows(table, tasks, windowing=CLIPS):
    return [list(part_windows(table, t, SPEC, windowing)) for t in tasks]


def _assert_same(a, b):
    assert len(a) == len(b)
    for wa, wb in zip(a, b):
        assert [x[1:] for x in wa] == [x[1:] for x in wb]          # labels, ordinals, spans, in order
        for x, y in zip(wa, wb):
            assert x[0].dtype == y[0].dtype and np.array_equal(x[0], y[0])


@pytest.mark.parametrize("windowing", [CLIPS, Windowing()], ids=["clips", "whole"])
def test_a_second_pass_reads_no_parquet_and_gives_what_an_uncached_read_gives(table, monkeypatch, windowing):
    t, paths = table
    tasks = _tasks(paths)
    monkeypatch.setitem(shards._PROCESS, "cache", GramCache(0))
    plain = _windows(t, tasks, windowing)
    assert CountingTable.opened == len(tasks)

    monkeypatch.setitem(shards._PROCESS, "cache", GramCache(64 * 2 ** 20))
    CountingTable.opened = 0
    first = _windows(t, tasks, windowing)
    assert CountingTable.opened == 3                      # the fold's task found its grams kept
    second = _windows(t, tasks, windowing)
    assert CountingTable.opened == 3                      # the second pass read nothing
    _assert_same(first, plain)
    _assert_same(second, plain)
    stats = shards.process_cache().stats()
    assert stats["reads"] == 3 and stats["misses"] == 9 and stats["hits"] == 2 + 11      # 11 recordings a pass
    assert stats["bytes"] <= stats["max_bytes"]


def test_a_cache_smaller_than_the_pass_keeps_its_bound_and_reads_only_what_it_lacks(table, monkeypatch):
    t, paths = table
    tasks = _tasks(paths)
    monkeypatch.setitem(shards._PROCESS, "cache", GramCache(0))
    plain = _windows(t, tasks)
    small = GramCache(200 * 13 * 4 + 12 * shards.PLACE_BYTES)      # a few short grams, not the long one
    monkeypatch.setitem(shards._PROCESS, "cache", small)
    for _ in range(3):
        _assert_same(_windows(t, tasks), plain)
        assert small.bytes <= small.max_bytes
    assert 0 < small.stats()["entries"] < 12 and small.hits > 0
    CountingTable.opened = 0
    _windows(t, tasks)
    assert 0 < CountingTable.opened <= len(tasks)


def test_the_cache_size_is_bytes_or_a_size_with_a_unit():
    assert cache_bytes(None) == cache_bytes("") == shards.DEFAULT_GRAM_CACHE == 64 * 2 ** 20
    assert cache_bytes("128M") == cache_bytes("128m") == cache_bytes("128MB") == 128 * 2 ** 20
    assert cache_bytes("1g") == 2 ** 30 and cache_bytes("0") == 0 and cache_bytes("4096") == 4096
    for bad in ("lots", "-1", "64 X", "1e9"):
        with pytest.raises(ParameterError, match="WAVETRAIN_SPARK_GRAM_CACHE"):
            cache_bytes(bad)


def test_a_reused_python_worker_reads_no_parquet_in_the_next_pass(job, demo_csv):
    """Every task of a pass reads all part files; a task of the next pass on a worker of the first
    reads none (Spark reuses its Python workers)."""
    from wavetrain.data import load_dataset
    from wavetrain.spark import engine

    sc = job.spark.sparkContext
    assert sc.getConf().get("spark.python.worker.reuse", "true") == "true"
    prep = engine.extract_features(job, load_dataset([demo_csv]), "mfcc(coeffs=13)")
    tasks, table, spec = prep.tasks(), job.table, prep.source.spec
    assert len(tasks) > 1

    def one_pass(_):
        cache = shards.process_cache()
        before = cache.reads
        windows = sum(1 for t in tasks for _ in part_windows(table, t, spec, Windowing()))
        return os.getpid(), cache.reads - before, windows

    first = sc.parallelize(range(2), 2).map(one_pass).collect()
    second = sc.parallelize(range(2), 2).map(one_pass).collect()
    assert all(reads == len(tasks) for _, reads, _ in first)
    again = [reads for pid, reads, _ in second if pid in {p for p, _, _ in first}]
    assert again and all(reads == 0 for reads in again)
    assert {w for _, _, w in first + second} == {len(prep.ds)}


def test_a_later_run_finds_its_recordings_in_the_table_without_reading_the_audio(demo_csv, tmp_path, monkeypatch):
    """The table's manifest keeps the files' content hashes: a run over unchanged files reads none
    of their bytes to find their recordings in the table."""
    import shutil

    from wavetrain.data import file_facts, load_dataset
    from wavetrain.data import recording as recording_module
    from wavetrain.spark.extract import extract_missing
    from wavetrain.spark.table import MANIFEST
    from wavetrain.stream.source import FeatureSource

    folder = tmp_path / "data"
    folder.mkdir()
    lines = demo_csv.read_text().splitlines()[:4]
    for line in lines:
        name = line.split(",")[0]
        shutil.copy(demo_csv.parent / name, folder / name)
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(file_facts, "RACY_S", 0.0)     # files just written are remembered across runs too
    monkeypatch.setattr(file_facts, "_memo", {})
    monkeypatch.setattr(file_facts, "_db", None)
    try:
        table = FeatureTable(str(tmp_path / "table"))
        table.remember_files()
        ds = load_dataset([folder / "metadata.csv"])
        source = FeatureSource(SPEC)
        table.write_part(source.spec_key, ((r.id, np.zeros((2, 13), np.float32), 16000, 0.01, 20) for r in ds),
                         [r.id for r in ds])
        first = [r.id for r in ds]
        file_facts.use(None)                      # the run ends
        assert (tmp_path / "table" / MANIFEST).is_file()

        monkeypatch.setattr(file_facts, "_memo", {})      # a new run: nothing remembered in the process
        opened = []

        def counting_open(path, *args, **kwargs):
            opened.append(path)
            return open(path, *args, **kwargs)  # noqa: SIM115 (the caller closes it)

        monkeypatch.setattr(recording_module, "open", counting_open, raising=False)
        again = load_dataset([folder / "metadata.csv"])
        res = extract_missing(None, FeatureTable(str(tmp_path / "table")), again, source)
        assert res.present == len(again) == 4 and res.extracted == 0 and not res.bad
        assert [r.id for r in again] == first and opened == []
    finally:
        file_facts.use(None)
