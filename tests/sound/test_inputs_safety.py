"""No sound tool writes over, around or inside what it reads, even with --overwrite; --overwrite
removes only the tool's own earlier outputs."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import soundfile as sf

from tests.sound.conftest import RATE, fails, run, tone
from wavetrain.core.outputs import OutputError, refuse_inputs
from wavetrain.data.dataset import input_paths


def _digest(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links as their target) and its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def small(tmp_path) -> Path:
    """``ds/``: four short tones with a metadata.csv."""
    root = tmp_path / "ds"
    root.mkdir()
    rows = []
    for i, state in enumerate(("low", "low", "high", "high")):
        sf.write(root / f"r{i}.wav", tone(300.0 if state == "low" else 2500.0, 0.6, seed=i), RATE)
        rows.append(f"r{i}.wav,state={state};speaker=s{i % 2}\n")
    (root / "metadata.csv").write_text("".join(rows))
    return root


@pytest.fixture
def classes(tmp_path) -> Path:
    """``classes/<state>/*.wav``: a folder of class sub-folders."""
    root = tmp_path / "classes"
    for state, hz in (("low", 300.0), ("high", 2500.0)):
        (root / state).mkdir(parents=True)
        for i in range(2):
            sf.write(root / state / f"{state}{i}.wav", tone(hz, 0.6, seed=i), RATE)
    return root


def test_cut_into_its_own_data_set_is_refused(small, capsys):
    before = _digest(small)
    for data in (small, small / "metadata.csv"):
        fails(capsys, ["sound", "cut", "--data", data, "--clip-ms", "200", "-o", small, "--overwrite"],
              "contains the input")
    assert _digest(small) == before


def test_splice_over_an_input_recording_or_metadata_is_refused(small, tmp_path, capsys):
    before = _digest(small)
    fails(capsys, ["sound", "splice", "--data", small, "-o", small / "r0.wav", "--overwrite"], "the input")
    fails(capsys, ["sound", "splice", "--data", small / "metadata.csv", "-o", small / "r0.wav", "--overwrite"],
          "is the input")
    fails(capsys, ["sound", "splice", "--data", small / "metadata.csv", "-o", small / "metadata.wav", "--overwrite"],
          f"{small / 'metadata.csv'}: is the input")                 # OUT.csv would be the input
    link = tmp_path / "link"
    link.symlink_to(small, target_is_directory=True)          # another spelling of the same folder
    fails(capsys, ["sound", "splice", "--data", small / "metadata.csv", "-o", link / "r1.wav", "--overwrite"],
          "is the input")
    fails(capsys, ["sound", "splice", "--data", small / "metadata.csv", "-o", link / "metadata.wav", "--overwrite"],
          "is the input")
    assert _digest(small) == before
    assert not (small / "metadata.wav").exists()


def test_augment_and_to_audacity_into_inputs_are_refused(small, tmp_path, capsys):
    before = _digest(small)
    fails(capsys, ["sound", "augment", "--data", small, "--gain", "3", "-o", small, "--overwrite"], "the input")
    other = tmp_path / "other"
    run(capsys, ["sound", "cut", "--data", small, "--clip-ms", "300", "-o", other])
    fails(capsys, ["sound", "augment", "--data", other, "--mix", small, "--gain", "1", "-o", small,
                   "--overwrite"], "contains the input")
    run(capsys, ["sound", "augment", "--data", other, "--mix", small, "--gain", "1", "-o", small / "sub"])
    fails(capsys, ["sound", "to-audacity", "--data", small, "-o", tmp_path, "--overwrite"], "contains the input")
    assert {k: v for k, v in _digest(small).items() if not k.startswith("sub/")} == before


def test_outputs_inside_a_class_folder_input_are_refused(classes, capsys):
    before = _digest(classes)
    fails(capsys, ["sound", "cut", "--data", classes, "--clip-ms", "200", "-o", classes / "clips"],
          "lies inside the input")
    fails(capsys, ["sound", "group", "--data", classes, "--label", "class", "-o", classes / "g"],
          "lies inside the input")
    fails(capsys, ["sound", "splice", "--data", classes, "-o", classes / "all.wav"], "lies inside the input")
    assert _digest(classes) == before and sorted(p.name for p in classes.iterdir()) == ["high", "low"]


def test_partition_and_group_refuse_a_part_folder_that_leads_to_an_input(small, tmp_path, capsys):
    before = _digest(small)
    out = tmp_path / "parts"
    out.mkdir()
    (out / "part1").symlink_to(small, target_is_directory=True)
    fails(capsys, ["sound", "partition", "--data", small, "--label", "state", "-o", out, "--overwrite"],
          "is a symbolic link")
    g = tmp_path / "groups"
    g.mkdir()
    (g / "low").symlink_to(small, target_is_directory=True)
    fails(capsys, ["sound", "group", "--data", small, "--label", "state", "--copy", "-o", g, "--overwrite"],
          "is a symbolic link")
    assert _digest(small) == before


def test_from_audacity_over_its_label_track_is_refused(small, tmp_path, capsys):
    txt = tmp_path / "labels.txt"
    txt.write_text("0.1\t0.3\tlow\n")
    fails(capsys, ["sound", "from-audacity", txt, "--wav", small / "r0.wav", "--label", "state", "-o", txt,
                   "--overwrite"], "is the input")
    assert txt.read_text() == "0.1\t0.3\tlow\n"


def test_label_over_its_input_metadata_is_refused(small, tmp_path, capsys):
    model = tmp_path / "m.wt"
    run(capsys, ["train", "--data", small, "--label", "state", "--model", "knn", "--clip-ms", "200", "-o", model])
    before = _digest(small)
    fails(capsys, ["sound", "label", "-m", model, "--data", small, "-o", small / "metadata.csv", "--overwrite"],
          "is the input")
    fails(capsys, ["sound", "label", "-m", model, "--data", small, "-o", model, "--overwrite"], "is the input")
    assert _digest(small) == before


def test_partition_overwrite_removes_only_its_stale_parts(small, tmp_path, capsys):
    out = tmp_path / "parts"
    base = ["sound", "partition", "--data", small, "--label", "state", "-o", out]
    run(capsys, [*base, "--parts", "2"])
    (out / "part3").mkdir()
    (out / "part3" / "metadata.csv").write_text("r0.wav,state=low\n")    # as a 3-part run left it
    (out / "test").mkdir()
    (out / "test" / "metadata.csv").write_text("r1.wav,state=low\n")
    (out / "test" / "notes.txt").write_text("mine")                      # not only the tool's file
    (out / "part9.txt").write_text("mine too")
    run(capsys, [*base, "--parts", "2", "--overwrite"])
    assert sorted(p.name for p in out.iterdir()) == ["part1", "part2", "part9.txt", "test"]
    assert (out / "test" / "notes.txt").read_text() == "mine" and (out / "test" / "metadata.csv").exists()
    assert (out / "part9.txt").read_text() == "mine too"


def test_refuse_inputs_checks_every_output_before_any_write(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "metadata.csv").write_text("a.wav\n")
    inputs = input_paths([data])
    assert inputs == [data / "metadata.csv"]
    refuse_inputs([tmp_path / "out.wav", tmp_path / "elsewhere"], inputs)
    with pytest.raises(OutputError, match=r"-o .*metadata.csv: is the input .*metadata.csv"):
        refuse_inputs([tmp_path / "out.wav", data / "metadata.csv"], inputs)
    with pytest.raises(OutputError, match="contains the input"):
        refuse_inputs([tmp_path], inputs)


def test_refuse_inputs_sees_through_links_and_dots(tmp_path):
    out = tmp_path / "out" / "all.wav"
    out.parent.mkdir()
    link = tmp_path / "a.wav"
    link.symlink_to(out)                                   # an input recording that leads to the output
    with pytest.raises(OutputError, match="is the input"):
        refuse_inputs([out], [link])
    dotted = tmp_path / "out" / ".." / "out" / "x.wav"
    with pytest.raises(OutputError, match="lies inside the input"):
        refuse_inputs([dotted], [tmp_path / "out"])
    refuse_inputs([tmp_path / "outer.wav"], [tmp_path / "out"])     # a shared name prefix is not inside
