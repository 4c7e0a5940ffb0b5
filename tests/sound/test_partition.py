"""wavetrain sound partition: stratified, group-safe, balanced splits."""
from __future__ import annotations

from collections import Counter

import pytest

from tests.sound.conftest import fails, run
from wavetrain.data import load_dataset
from wavetrain.data.metadata import read_metadata


def _parts(folder, names):
    return {n: read_metadata(folder / n / "metadata.csv") for n in names}


def _check_ratio(ds_path, parts, label, ratio):
    total = Counter(r.labels[label] for r in load_dataset(ds_path, check=False))
    train = Counter(r.labels[label] for r in parts["train"])
    for v, n in total.items():
        assert abs(train[v] - ratio * n) <= 1, (v, train[v], n)


def test_ratio_stratified_and_relative(tones, tmp_path, capsys):
    out = tmp_path / "split"
    text = run(capsys, ["sound", "partition", "--data", tones, "--label", "state", "--ratio", "0.75", "--seed", "3",
                        "-o", out])
    assert "partition: train" in text and "test" in text
    parts = _parts(out, ["train", "test"])
    _check_ratio(tones, parts, "state", 0.75)
    line = (out / "train" / "metadata.csv").read_text().splitlines()[0]
    assert line.startswith("../../tones/")                      # relative paths, nothing copied
    assert not list((out / "train").glob("*.wav"))
    names = {r.path.name for r in parts["train"]} | {r.path.name for r in parts["test"]}
    assert len(names) == 25
    # identical audio on one side
    side = {r.path.name: n for n, rs in parts.items() for r in rs}
    assert side["low0.wav"] == side["copy_of_low0.wav"]


def test_group_by_never_on_two_sides(tones, tmp_path, capsys):
    out = tmp_path / "g"
    text = run(capsys, ["sound", "partition", "--data", tones, "--label", "state", "--ratio", "0.7", "--group-by",
                        "speaker", "-o", out])
    parts = _parts(out, ["train", "test"])
    speakers = {n: {r.labels["speaker"] for r in rs} for n, rs in parts.items()}
    assert speakers["train"] and speakers["test"] and not speakers["train"] & speakers["test"]
    assert f"test speaker: {', '.join(sorted(speakers['test']))};" in text      # says which went to test
    text = run(capsys, ["sound", "partition", "--data", tones, "--label", "state", "--parts", "2", "--group-by",
                        "speaker", "-o", tmp_path / "p", "--overwrite"])
    for name, rs in _parts(tmp_path / "p", ["part1", "part2"]).items():
        assert f"{name} speaker: {', '.join(sorted({r.labels['speaker'] for r in rs}))}" in text


def test_parts_balance(tones, tmp_path, capsys):
    out = tmp_path / "p"
    run(capsys, ["sound", "partition", "--data", tones, "--label", "state", "--parts", "3", "--balance", "-o", out])
    parts = _parts(out, ["part1", "part2", "part3"])
    seen = []
    for rs in parts.values():
        counts = Counter(r.labels["state"] for r in rs)
        assert len(set(counts.values())) == 1 and len(counts) == 3, counts
        seen += [r.path.name for r in rs]
    assert len(seen) == len(set(seen))


def test_seed_reproducible(tones, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for o in (a, b):
        run(capsys, ["sound", "partition", "--data", tones, "--label", "state", "--ratio", "0.5", "--seed", "7",
                     "-o", o])
    assert (a / "test" / "metadata.csv").read_text() == (b / "test" / "metadata.csv").read_text()


def test_spoken_words(spoken, tmp_path, capsys):
    out = tmp_path / "sw"
    run(capsys, ["sound", "partition", "--data", spoken, "--label", "word", "--ratio", "0.8", "-o", out])
    _check_ratio(spoken, _parts(out, ["train", "test"]), "word", 0.8)
    out2 = tmp_path / "sw2"
    run(capsys, ["sound", "partition", "--data", spoken, "--label", "word", "--ratio", "0.8", "--group-by", "speaker",
                 "-o", out2])
    parts = _parts(out2, ["train", "test"])
    assert not {r.labels["speaker"] for r in parts["train"]} & {r.labels["speaker"] for r in parts["test"]}
    share = len(parts["train"]) / (len(parts["train"]) + len(parts["test"]))
    assert 0.7 <= share <= 0.9


@pytest.mark.parametrize("args, expect", [
    (["--label", "colour", "--ratio", "0.8"], "no label named 'colour'"),
    (["--label", "state", "--ratio", "1.5"], "--ratio 1.5"),
    (["--label", "state", "--where", "state=nothing"], "no recording left"),
    (["--label", "state", "--parts", "40"], "folds=40"),
    (["--label", "state", "--group-by", "room"], "group_by='room'"),
])
def test_errors(tones, tmp_path, capsys, args, expect):
    fails(capsys, ["sound", "partition", "--data", tones, *args, "-o", tmp_path / "x"], expect)
    assert not (tmp_path / "x").exists()


def test_existing_output(tones, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["sound", "partition", "--data", tones, "--label", "state", "-o", out]
    run(capsys, argv)
    fails(capsys, argv, "--overwrite")
    run(capsys, [*argv, "--overwrite"])
