"""Audacity label tracks: the read/write round trip, point labels, spectral lines, bad lines."""
from __future__ import annotations

import os

import pytest

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import OutputError
from wavetrain.data.audacity import LabelError, read_labels, write_labels


def test_round_trip(tmp_path):
    rows = [(0.0, 1.5, "dog bark"), (2.25, 2.25, "click"), (3.0, 4.123456, "")]
    p = write_labels(tmp_path / "a.txt", rows)
    text = p.read_text()
    assert text.splitlines()[0] == "0.000000\t1.500000\tdog bark"
    assert text.splitlines()[1] == "2.250000\t2.250000\tclick"
    assert read_labels(p) == rows
    assert [f for f in os.listdir(tmp_path)] == ["a.txt"]      # no temporary file left


def test_reads_what_audacity_writes(tmp_path):
    p = tmp_path / "labels.txt"
    p.write_bytes(b"0.500000\t1.000000\tspeech\n\\\t120.5\t3400.0\n"
                  b"1.000000\t1.000000\tpoint\r\n\n2\t3\n4.5\t5,5\tcomma decimal\n")
    assert read_labels(p) == [(0.5, 1.0, "speech"), (1.0, 1.0, "point"), (2.0, 3.0, ""),
                              (4.5, 5.5, "comma decimal")]


def test_hand_written_spaces_and_single_time(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("1 2 two words\n7\n")
    assert read_labels(p) == [(1.0, 2.0, "two words"), (7.0, 7.0, "")]


def test_text_with_tabs_or_newlines_is_one_label(tmp_path):
    p = write_labels(tmp_path / "t.txt", [(0, 1, "a\tb\nc")])
    assert read_labels(p) == [(0.0, 1.0, "a b c")]


@pytest.mark.parametrize("content, words", [
    ("abc\t1\tx\n", "line 1: start 'abc'"),
    ("0\t1\tok\n2\t1\tback\n", "line 2: end 1 s is before start 2 s"),
    ("-1\t1\tneg\n", "line 1: start '-1'"),
    ("0\tnan\tx\n", "line 1: end 'nan'"),
])
def test_bad_lines_name_file_and_line(tmp_path, content, words):
    p = tmp_path / "bad.txt"
    p.write_text(content)
    with pytest.raises(LabelError, match=words) as e:
        read_labels(p)
    assert isinstance(e.value, UserError) and "\n" not in str(e.value) and "bad.txt" in str(e.value)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(LabelError, match="no such label file"):
        read_labels(tmp_path / "nope.txt")
    with pytest.raises(LabelError, match="is a folder"):
        read_labels(tmp_path)


def test_write_refuses_bad_times_and_paths(tmp_path):
    with pytest.raises(LabelError):
        write_labels(tmp_path / "a.txt", [(2, 1, "x")])
    with pytest.raises(LabelError):
        write_labels(tmp_path / "a.txt", [(float("inf"), float("inf"), "x")])
    assert not (tmp_path / "a.txt").exists()
    with pytest.raises(OutputError):
        write_labels(tmp_path / "missing" / "a.txt", [(0, 1, "x")])


def test_write_replaces_atomically(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old\n")
    write_labels(p, [])
    assert p.read_text() == ""
    write_labels(p, iter([(0, 0.5, "g")]))
    assert read_labels(p) == [(0.0, 0.5, "g")]
