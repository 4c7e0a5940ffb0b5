"""write_atomic never writes through a link planted beside its target, and leaves nothing behind."""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.core.outputs import (
    HOST,
    OutputError,
    open_temporary,
    remove_stale_temporaries,
    staged_folder,
    write_atomic,
)

VICTIM_TEXT = b"precious, not to be replaced\n"


def _victim(tmp_path: Path) -> Path:
    """A file elsewhere that a planted link leads to."""
    folder = tmp_path / "elsewhere"
    folder.mkdir(exist_ok=True)
    victim = folder / "victim.txt"
    victim.write_bytes(VICTIM_TEXT)
    return victim


def _plant_old_names(target: Path, victim: Path) -> list[Path]:
    """Links at every temporary name the former scheme (``.<name>.tmp<pid>``) used for ``target``."""
    links = []
    for pid in {os.getpid(), os.getppid()}:
        link = target.with_name(f".{target.name}.tmp{pid}")
        link.symlink_to(victim)
        links.append(link)
    return links


def _assert_safe(out: Path, victim: Path, links: list[Path]) -> None:
    assert victim.read_bytes() == VICTIM_TEXT
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode), f"{out} is not a regular file"
    for link in links:
        assert link.is_symlink() and link.resolve() == victim.resolve()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_links_at_the_old_temporary_names_are_not_followed(tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "model.wt"
    links = _plant_old_names(out, victim)
    write_atomic(out, lambda f: f.write(b"new model"))
    assert out.read_bytes() == b"new model"
    _assert_safe(out, victim, links)
    assert _leftovers(tmp_path) == []


def test_a_link_planted_at_the_output_during_the_write_is_replaced_not_followed(tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "predictions.jsonl"
    out.write_bytes(b"old\n")

    def write(f):
        out.unlink()
        out.symlink_to(victim)              # swapped in after the checks, while writing
        f.write(b"new\n")

    write_atomic(out, write)
    assert out.read_bytes() == b"new\n"
    _assert_safe(out, victim, [])


def test_an_existing_link_at_the_output_is_refused(tmp_path):
    victim = _victim(tmp_path)
    out = tmp_path / "out.csv"
    out.symlink_to(victim)
    with pytest.raises(OutputError, match="not a regular file"):
        write_atomic(out, lambda f: f.write(b"x"))
    assert victim.read_bytes() == VICTIM_TEXT and out.is_symlink()


def test_a_taken_random_name_is_skipped(tmp_path, monkeypatch):
    victim = _victim(tmp_path)
    out = tmp_path / "a.wav"
    draws = iter(["0" * 16, "0" * 16, "1" * 16])
    monkeypatch.setattr("wavetrain.core.outputs.secrets.token_hex", lambda n: next(draws))
    planted = tmp_path / f".a.wav.{HOST}.{os.getpid()}.{'0' * 16}.tmp"
    planted.symlink_to(victim)
    tmp, fd = open_temporary(out)
    os.close(fd)
    assert tmp.name == f".a.wav.{HOST}.{os.getpid()}.{'1' * 16}.tmp" and stat.S_ISREG(os.lstat(tmp).st_mode)
    assert victim.read_bytes() == VICTIM_TEXT and planted.is_symlink()


def test_temporary_names_are_not_predictable(tmp_path):
    """64 random bits in each name; the host and pid beside them only tell a dead writer's."""
    names = set()
    for _ in range(3):
        tmp, fd = open_temporary(tmp_path / "x.csv")
        os.close(fd)
        names.add(tmp.name)
        assert re.fullmatch(rf"\.x\.csv\.{HOST}\.{os.getpid()}\.[0-9a-f]{{16}}\.tmp", tmp.name), tmp.name
    assert len(names) == 3


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), ValueError("bug")])
def test_a_failed_write_leaves_no_temporary_file_and_the_old_file(tmp_path, error):
    out = tmp_path / "metadata.csv"
    out.write_bytes(b"old\n")

    def write(f):
        f.write(b"half")
        raise error

    with pytest.raises(OutputError if isinstance(error, OSError) else ValueError) as e:
        write_atomic(out, write)
    if isinstance(error, OSError):
        assert "free some space" in str(e.value)
    assert out.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata.csv"]


def test_a_new_file_gets_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        out = write_atomic(tmp_path / "m.wt", lambda f: f.write(b"x"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644


def _tones(folder: Path) -> Path:
    folder.mkdir()
    rate = 8000
    t = np.arange(rate) / rate
    for i, hz in enumerate((300.0, 900.0)):
        sf.write(folder / f"t{i}.wav", (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate)
    (folder / "metadata.csv").write_text("t0.wav,state=low\nt1.wav,state=high\n")
    return folder


def _run(argv) -> int:
    return main([str(a) for a in argv])


def test_sound_from_audacity_does_not_follow_planted_links(tmp_path, capsys):
    data = _tones(tmp_path / "data")
    victim = _victim(tmp_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("0.1\t0.5\tlow\n")
    out = tmp_path / "out" / "metadata.csv"
    out.parent.mkdir()
    links = _plant_old_names(out, victim)
    assert _run(["sound", "from-audacity", labels, "--wav", data / "t0.wav", "--label", "state", "-o", out]) == 0
    _assert_safe(out, victim, links)
    assert "t0.wav[100-500],state=low" in out.read_text()


def test_sound_cut_does_not_follow_planted_links(tmp_path, capsys):
    data = _tones(tmp_path / "data")
    victim = _victim(tmp_path)
    out = tmp_path / "clips"
    out.mkdir()
    links = []
    for name in ("metadata.csv", "t0_0ms.wav", "t0_500ms.wav", "t1_0ms.wav", "t1_500ms.wav"):
        links += _plant_old_names(out / name, victim)
    assert _run(["sound", "cut", "--data", data, "--clip-ms", "500", "-o", out, "--overwrite"]) == 0
    for name in ("metadata.csv", "t0_0ms.wav", "t1_500ms.wav"):
        _assert_safe(out / name, victim, links)


def test_features_stage_folder_is_fresh(tmp_path, capsys):
    data = _tones(tmp_path / "data")
    out = tmp_path / "feats"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere-folder"
    elsewhere.mkdir()
    (out / f".partial-{os.getpid()}").symlink_to(elsewhere, target_is_directory=True)
    (tmp_path / f".feats.{HOST}.{os.getpid()}.{'0' * 16}.tmp").symlink_to(elsewhere, target_is_directory=True)
    assert _run(["features", "--data", data, "--spec", "mfcc", "-o", out, "--no-progress"]) == 0
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".npy") == ["000000_t0.wav.npy", "000001_t1.wav.npy"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()) == []


# -- temporary files of killed writers ------------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_are_removed_on_the_next_write(tmp_path):
    victim = _victim(tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    dead, hexs = _dead_pid(), "0123456789abcdef"
    stale = [folder / f".m.wt.{HOST}.{dead}.{hexs}.tmp", folder / f".x.csv.otherhost.1.{hexs}.tmp"]
    for f in stale:
        f.write_bytes(b"half")
    old = time.time() - 2 * 24 * 3600
    os.utime(stale[1], (old, old))                                  # another machine's, two days old
    stage = folder / f".parts.{HOST}.{dead}.{hexs}.tmp"             # a staged folder of a killed run
    (stage / "part1").mkdir(parents=True)
    (stage / "part1" / "metadata.csv").write_text("x.wav\n")
    kept = [folder / f".a.wav.{HOST}.{os.getpid()}.{hexs}.tmp",         # this process's own, in progress
            folder / f".b.wav.otherhost.1.{hexs}.tmp",                  # another machine's, recent
            folder / f".c.wav.{hexs}.tmp",                              # not of wavetrain's form
            folder / "notes.tmp"]
    for f in kept:
        f.write_bytes(b"keep")
    link = folder / f".d.wav.{HOST}.{dead}.{hexs}.tmp"                  # a link of that form: left alone
    link.symlink_to(victim)
    write_atomic(folder / "new.csv", lambda f: f.write(b"x\n"))
    assert not any(p.exists() for p in stale) and not stage.exists()
    assert all(p.read_bytes() == b"keep" for p in kept)
    assert link.is_symlink() and victim.read_bytes() == VICTIM_TEXT
    assert remove_stale_temporaries(folder) == 0                    # (once per folder and process)


def test_the_temporary_file_of_a_writer_killed_outright_goes_on_the_next_write(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    code = ("import os, signal, sys\n"
            "from wavetrain.core.outputs import open_temporary\n"
            f"tmp, fd = open_temporary({str(folder / 'model.wt')!r})\n"
            "os.write(fd, b'half a model')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", code])
    assert p.returncode == -signal.SIGKILL
    left = [f.name for f in folder.iterdir()]
    assert len(left) == 1 and left[0].startswith(".model.wt.") and left[0].endswith(".tmp")
    write_atomic(folder / "model.wt", lambda f: f.write(b"a model"))
    assert sorted(f.name for f in folder.iterdir()) == ["model.wt"]


# -- folders of outputs ----------------------------------------------------------------------------

def test_a_staged_folder_that_fails_leaves_no_output_and_no_stage(tmp_path):
    out = tmp_path / "clips"
    with pytest.raises(RuntimeError), staged_folder(out) as stage:
        (stage / "a.wav").write_bytes(b"a")
        raise RuntimeError("disk full half-way")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    out.mkdir()
    (out / "old.wav").write_bytes(b"old")
    with pytest.raises(RuntimeError), staged_folder(out) as stage:
        (stage / "old.wav").write_bytes(b"new")
        raise RuntimeError("interrupted")
    assert (out / "old.wav").read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["clips"]


def test_a_staged_folder_merges_into_an_existing_one(tmp_path):
    out = tmp_path / "parts"
    (out / "part1").mkdir(parents=True)
    (out / "part1" / "metadata.csv").write_text("old\n")
    (out / "keep.txt").write_text("mine\n")
    with staged_folder(out) as stage:
        (stage / "part1").mkdir()
        (stage / "part1" / "metadata.csv").write_text("new\n")
        (stage / "part2").mkdir()
        (stage / "part2" / "metadata.csv").write_text("two\n")
    assert (out / "part1" / "metadata.csv").read_text() == "new\n"
    assert (out / "part2" / "metadata.csv").read_text() == "two\n" and (out / "keep.txt").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts"]


def test_a_link_at_a_sub_folder_of_a_staged_folder_is_refused_before_anything_moves(tmp_path):
    out = tmp_path / "parts"
    out.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (out / "part2").symlink_to(foreign, target_is_directory=True)
    with pytest.raises(OutputError, match="part2 is a symbolic link"), staged_folder(out) as stage:
        for name in ("part1", "part2"):
            (stage / name).mkdir()
            (stage / name / "metadata.csv").write_text("x\n")
    assert list(foreign.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["part2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "parts"]


@pytest.mark.parametrize("tool", ["partition", "group"])
def test_a_link_at_a_part_or_group_folder_leading_elsewhere_is_refused(tool, tmp_path, capsys):
    data = _tones(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (out / ("part1" if tool == "partition" else "low")).symlink_to(foreign, target_is_directory=True)
    argv = ["sound", tool, "--data", data, "--label", "state", "-o", out, "--overwrite"]
    if tool == "partition":
        argv += ["--parts", "2"]
    capsys.readouterr()
    assert _run(argv) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert list(foreign.iterdir()) == []


@pytest.mark.parametrize("tool", ["cut", "augment", "group"])
def test_a_full_disk_leaves_no_partial_output_folder(tool, tmp_path, capsys, monkeypatch):
    """cut, augment and group --copy write their folder whole or not at all."""
    import wavetrain.core.outputs as outputs

    data = _tones(tmp_path / "data")
    real_open = outputs.open_temporary
    calls = []

    def full_after_one(path, **kw):
        calls.append(path)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, **kw)

    monkeypatch.setattr(outputs, "open_temporary", full_after_one)
    out = tmp_path / "out"
    argv = {"cut": ["sound", "cut", "--data", data, "--clip-ms", "300", "-o", out],
            "augment": ["sound", "augment", "--data", data, "--gain=-3:3", "-o", out],
            "group": ["sound", "group", "--data", data, "--label", "state", "--copy", "-o", out]}[tool]
    capsys.readouterr()
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert "free some space" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


# -- the demo and the feature store ---------------------------------------------------------------

def test_demo_refuses_a_non_empty_folder_and_links_planted_in_it(tmp_path, capsys):
    victim = _victim(tmp_path)
    out = tmp_path / "demo"
    out.mkdir()
    (out / "mine.txt").write_text("mine\n")
    capsys.readouterr()
    assert _run(["demo", "-o", out]) == 2
    assert "not empty; add --overwrite" in capsys.readouterr().err
    (out / "words").mkdir()
    (out / "words" / "seven_en-us_f1_0.flac").symlink_to(victim)
    assert _run(["demo", "-o", out, "--overwrite"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert victim.read_bytes() == VICTIM_TEXT
    shutil.rmtree(out / "words")
    (out / "words").symlink_to(victim.parent, target_is_directory=True)
    assert _run(["demo", "-o", out, "--overwrite"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim.txt"]


def test_the_feature_store_does_not_create_its_tag_through_a_dangling_link(tmp_path):
    from wavetrain.core.errors import CacheError
    from wavetrain.store import FeatureStore

    root = tmp_path / "cache"
    root.mkdir()
    target = tmp_path / "elsewhere" / "planted"
    target.parent.mkdir()
    (root / "CACHEDIR.TAG").symlink_to(target)
    with pytest.raises(CacheError, match="symbolic link"):
        FeatureStore(root)
    assert not target.exists()


def test_a_full_disk_under_an_audio_write_is_one_error_without_callback_noise(tmp_path, monkeypatch, capsys):
    """libsndfile writes through Python callbacks; an error raised inside one would be printed as an
    "Exception ignored" traceback before the real error: it is kept and raised once instead."""
    import io
    import sys

    import wavetrain.data.audio as audio

    class Full(io.BytesIO):
        def write(self, data):
            if self.tell() + len(data) > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

        def seek(self, offset, whence=0):
            if self.tell() >= 900:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().seek(offset, whence)

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u))
    monkeypatch.setattr(audio, "write_atomic", lambda p, write, **kw: write(Full()))
    with pytest.raises(OSError) as e:
        audio.write_audio(tmp_path / "a.wav", np.zeros(8000, np.float32), 8000)
    assert e.value.errno == errno.ENOSPC and seen == []
    assert capsys.readouterr().err == ""
