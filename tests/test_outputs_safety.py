"""write_atomic never writes through a link planted beside its target, and leaves nothing behind."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.core.outputs import OutputError, open_temporary, write_atomic

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
    planted = tmp_path / f".a.wav.{'0' * 16}.tmp"
    planted.symlink_to(victim)
    tmp, fd = open_temporary(out)
    os.close(fd)
    assert tmp.name == f".a.wav.{'1' * 16}.tmp" and stat.S_ISREG(os.lstat(tmp).st_mode)
    assert victim.read_bytes() == VICTIM_TEXT and planted.is_symlink()


def test_temporary_names_are_not_predictable(tmp_path):
    names = set()
    for _ in range(3):
        tmp, fd = open_temporary(tmp_path / "x.csv")
        os.close(fd)
        names.add(tmp.name)
        assert str(os.getpid()) not in tmp.name.split(".")
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
    assert _run(["features", "--data", data, "--spec", "mfcc", "-o", out, "--no-progress"]) == 0
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".npy") == ["000000_t0.wav.npy", "000001_t1.wav.npy"]
    assert not [p for p in out.iterdir() if p.name.startswith(".partial-") and not p.is_symlink()]
