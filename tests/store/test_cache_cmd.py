"""``wavetrain cache info|clear``."""
from __future__ import annotations

import argparse
import json

import pytest

from tests.store.store_helpers import SPEC, gram, rec_id
from wavetrain.cli import cache_cmd
from wavetrain.core.errors import CacheError
from wavetrain.store import FeatureStore, entry_bytes


def _run(argv):
    parser = argparse.ArgumentParser(prog="wavetrain")
    cache_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def filled(root):
    store = FeatureStore(root)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    store.get(rec_id(0), SPEC)
    store.get(rec_id(9), SPEC)
    return root


def test_info_json(filled, capsys):
    assert _run(["cache", "info", "--cache", str(filled), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 3 and info["bytes"] == 3 * entry_bytes(100, 64)
    assert (info["hits"], info["misses"], info["hit_rate"]) == (1, 1, 0.5)
    assert info["root"] == str(filled)


def test_info_text(filled, capsys):
    assert _run(["cache", "info", "--cache", str(filled)]) == 0
    out = capsys.readouterr().out
    assert "entries   3" in out and "75.2 KiB" in out and "hit rate 50.0%" in out


def test_clear(filled, capsys):
    assert _run(["cache", "clear", "--cache", str(filled)]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert FeatureStore(filled).info()["entries"] == 0


def test_default_cache_from_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WAVETRAIN_CACHE", str(tmp_path / "env-cache"))
    assert _run(["cache", "info", "--json"]) == 0               # not created yet: empty
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    assert not (tmp_path / "env-cache").exists()                 # info creates nothing
    FeatureStore().put(rec_id(1), SPEC, gram(1))
    assert _run(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 1
    assert _run(["cache", "clear"]) == 0


def test_bad_cache_folders(tmp_path):
    with pytest.raises(CacheError, match="does not exist"):
        _run(["cache", "info", "--cache", str(tmp_path / "missing")])
    (tmp_path / "file").write_text("x")
    with pytest.raises(CacheError, match="not a folder"):
        _run(["cache", "clear", "--cache", str(tmp_path / "file")])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("keep me")
    with pytest.raises(CacheError, match="not a wavetrain feature cache"):
        _run(["cache", "clear", "--cache", str(tmp_path / "docs")])
    assert (tmp_path / "docs" / "notes.txt").exists()


def test_action_is_required():
    with pytest.raises(SystemExit):
        _run(["cache"])


def test_through_main(filled, tmp_path, capsys):
    main = pytest.importorskip("wavetrain.cli.main").main
    assert main(["cache", "info", "--cache", str(filled), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 3
    assert main(["cache", "info", "--cache", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_default_limit_env_and_none(monkeypatch, tmp_path):
    import argparse

    from wavetrain.cli.common import DEFAULT_CACHE_LIMIT, cache_limit, parse_size

    args = argparse.Namespace(cache_limit=None)
    monkeypatch.delenv("WAVETRAIN_CACHE_LIMIT", raising=False)
    assert cache_limit(args) == parse_size(DEFAULT_CACHE_LIMIT) == 20 << 30
    monkeypatch.setenv("WAVETRAIN_CACHE_LIMIT", "3G")
    assert cache_limit(args) == 3 << 30
    assert cache_limit(argparse.Namespace(cache_limit="none")) is None
    assert cache_limit(argparse.Namespace(cache_limit="512M")) == 512 << 20


def test_eviction_is_reported_after_the_run(demo_csv, tmp_path, capsys):
    from wavetrain.cli.main import main

    # 300K holds the index files (about 200 KB with their logs) and a few of the 24 grams (360 KB)
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--cache",
                 str(tmp_path / "c"), "--cache-limit", "300K", "--no-progress", "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr().err
    assert code == 0 and "feature store: evicted" in err and "--cache-limit" in err
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--cache",
                 str(tmp_path / "d"), "--no-progress", "-o", str(tmp_path / "m2.wt")])
    assert code == 0 and "evicted" not in capsys.readouterr().err


def test_bad_limit_names_its_source_and_oversized_grams_are_reported(demo_csv, tmp_path, capsys, monkeypatch):
    import argparse

    from wavetrain.cli.common import cache_limit
    from wavetrain.cli.main import main
    from wavetrain.core.errors import ParameterError

    monkeypatch.setenv("WAVETRAIN_CACHE_LIMIT", "20GB_")
    with pytest.raises(ParameterError, match="WAVETRAIN_CACHE_LIMIT: size '20GB_'"):
        cache_limit(argparse.Namespace(cache_limit=None))
    monkeypatch.delenv("WAVETRAIN_CACHE_LIMIT")
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--cache",
                 str(tmp_path / "c"), "--cache-limit", "1K", "--no-progress", "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr().err
    assert code == 0 and "did not store" in err and "do not fit the limit" in err
    assert "1 KiB" in err


def test_a_full_disk_does_not_fail_training(capsys, tmp_path, monkeypatch):
    """Every store write refused (ENOSPC): training still succeeds and says what was not stored."""
    import errno

    from wavetrain.cli.main import main
    from wavetrain.data.demo import make_demo_dataset
    from wavetrain.store import _format

    csv = make_demo_dataset(tmp_path / "d", per_combo=1, speeds=(15.0,), snrs=(10.0, 20.0), seconds=0.5)

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_format, "write_entry", full)
    code = main(["train", "--data", str(csv), "--label", "state", "--model", "gmm", "--set", "components=1",
                 "--cache", str(tmp_path / "c"), "-o", str(tmp_path / "m.wt")])
    err = capsys.readouterr().err
    assert code == 0 and (tmp_path / "m.wt").is_file()
    assert "the disk refused 6 writes" in err and "No space left on device" in err
    assert not list((tmp_path / "c" / "tmp").iterdir())
