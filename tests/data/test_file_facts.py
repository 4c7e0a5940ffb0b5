"""Content hashes and audio headers are remembered across runs while the file is unchanged."""
import hashlib
import os
import time

import numpy as np
import pytest

from wavetrain.core.errors import AudioError
from wavetrain.data import file_content_hash, file_facts, read_info, write_audio

OLD = time.time() - 3600  # an mtime well outside the racy window


@pytest.fixture
def facts(tmp_path, monkeypatch):
    """A persistent memo in tmp_path; ``new_run()`` forgets the in-process memo (a new process)."""
    monkeypatch.setattr(file_facts, "_memo", {})
    db = tmp_path / "files.sqlite"
    file_facts.use(db)

    def new_run():
        file_facts.flush()
        file_facts.use(None)
        file_facts._memo.clear()
        file_facts.use(db)

    yield new_run
    file_facts.use(None)


def _wav(path, seed=0, seconds=0.5, mtime=OLD):
    y = 0.1 * np.random.default_rng(seed).standard_normal(int(8000 * seconds)).astype(np.float32)
    write_audio(path, y, 8000)
    os.utime(path, (mtime, mtime))
    return path


def _forbid_reading(monkeypatch):
    """Make hashing and header parsing fail loudly: a remembered fact must not need them."""
    import soundfile

    from wavetrain.data import recording

    monkeypatch.setattr(recording, "open", lambda *a, **k: pytest.fail("file was re-hashed"),
                        raising=False)
    monkeypatch.setattr(soundfile, "info", lambda *a: pytest.fail("header was re-read"))


def test_second_run_neither_hashes_nor_opens_unchanged_files(tmp_path, facts, monkeypatch):
    p = _wav(tmp_path / "a.wav")
    digest = file_content_hash(p)
    info = read_info(p)
    assert digest == hashlib.sha1(p.read_bytes()).hexdigest()
    facts()
    with monkeypatch.context() as m:
        _forbid_reading(m)
        assert file_content_hash(p) == digest
        assert read_info(p) == info


def test_a_changed_file_is_hashed_again_even_with_the_same_size_and_mtime(tmp_path, facts):
    p = _wav(tmp_path / "a.wav", seed=0)
    first = file_content_hash(p)
    facts()
    _wav(p, seed=1)  # same length, same mtime (set back by utime); the ctime moves
    second = file_content_hash(p)
    assert second != first
    assert second == hashlib.sha1(p.read_bytes()).hexdigest()
    assert read_info(p).frames == 4000


def test_recently_modified_files_are_not_remembered_across_runs(tmp_path, facts, monkeypatch):
    p = _wav(tmp_path / "fresh.wav", mtime=time.time())
    file_content_hash(p)
    facts()
    calls = []
    from wavetrain.data import recording

    monkeypatch.setattr(recording, "open", lambda *a, **k: calls.append(1) or open(*a, **k),  # noqa: SIM115
                        raising=False)
    file_content_hash(p)
    assert calls == [1]


def test_bad_files_are_not_remembered(tmp_path, facts):
    p = tmp_path / "bad.wav"
    p.write_bytes(b"not audio at all")
    os.utime(p, (OLD, OLD))
    for _ in range(2):
        with pytest.raises(AudioError, match="not a readable audio file"):
            read_info(p)
        facts()


def test_corrupt_memo_is_ignored(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(file_facts, "_memo", {})
    db = tmp_path / "files.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    file_facts.use(db)
    try:
        p = _wav(tmp_path / "a.wav")
        assert file_content_hash(p) == hashlib.sha1(p.read_bytes()).hexdigest()
        assert read_info(p).rate == 8000
        file_facts.flush()
    finally:
        file_facts.use(None)
    assert "file facts" in caplog.text


def test_cli_warm_run_uses_the_memo_and_cache_clear_removes_it(tmp_path, monkeypatch, capsys):
    from wavetrain.cli.main import main

    monkeypatch.setattr(file_facts, "_memo", {})
    data = tmp_path / "data"
    for i, cls in enumerate(["a", "a", "b", "b"]):
        (data / cls).mkdir(parents=True, exist_ok=True)
        _wav(data / cls / f"{i}.wav", seed=i)
    cache = tmp_path / "cache"
    args = ["train", "--data", str(data), "--label", "class", "--model", "gmm", "--set",
            "components=2", "--cache", str(cache), "--no-progress", "-o", str(tmp_path / "m.wt")]
    assert main(args) == 0
    file_facts.flush()
    assert (cache / "files.sqlite").exists()
    import json

    capsys.readouterr()
    assert main(["cache", "info", "--cache", str(cache), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files_remembered"] == 4
    file_facts.use(None)
    file_facts._memo.clear()
    with monkeypatch.context() as m:
        _forbid_reading(m)
        assert main(args) == 0
    file_facts.use(None)
    assert main(["cache", "clear", "--cache", str(cache)]) == 0
    assert not (cache / "files.sqlite").exists()


def test_a_forked_child_writes_only_its_own_facts(tmp_path, facts):
    import sqlite3

    parent_file, child_file = _wav(tmp_path / "p.wav", seed=1), _wav(tmp_path / "c.wav", seed=2)
    file_content_hash(parent_file)          # unsaved in the parent
    pid = os.fork()
    if pid == 0:  # child
        try:
            file_content_hash(child_file)
            file_facts.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    rows = {r[0] for r in sqlite3.connect(tmp_path / "files.sqlite").execute("SELECT path FROM files")}
    assert rows == {str(child_file)}
    file_facts.flush()
    rows = {r[0] for r in sqlite3.connect(tmp_path / "files.sqlite").execute("SELECT path FROM files")}
    assert rows == {str(child_file), str(parent_file)}


def test_racy_window_is_measured_from_the_stat_not_from_the_end_of_hashing(tmp_path, facts):
    p = _wav(tmp_path / "a.wav", mtime=time.time() - 1.5)
    st = os.stat(p)
    file_facts.put(str(p), st, "sha1", "0" * 40, seen_ns=st.st_mtime_ns + int(1.5e9))
    facts()
    assert file_facts.get(str(p), st, "sha1") is None


def test_damaged_rows_are_recomputed_not_trusted(tmp_path, facts):
    p = _wav(tmp_path / "a.wav")
    st = os.stat(p)
    file_facts.put(str(p), st, "sha1", 12345)
    file_facts.put(str(p), st, "info", "not a header")
    facts()
    assert file_content_hash(p) == hashlib.sha1(p.read_bytes()).hexdigest()
    assert read_info(p).frames == 4000
