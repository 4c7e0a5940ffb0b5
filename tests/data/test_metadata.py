import numpy as np
import pytest
import soundfile as sf

from tests.conftest import tone
from wavetrain.core.errors import AudioError, MetadataError, UserError
from wavetrain.data import load_dataset, read_metadata, write_metadata


def _wav(path, seconds=1.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, tone(seconds=seconds), 16000, subtype="PCM_16")
    return path


def test_three_column_format_with_segments_and_trailing_columns(tmp_path):
    _wav(tmp_path / "a.wav")
    _wav(tmp_path / "sub" / "b.wav")
    (tmp_path / "metadata.csv").write_text(
        "a.wav,class=on;speaker=s1,mic=top\n"
        "sub/b.wav[100-600],class=off;speaker=s2,,\n"
        "a.wav,,\n")
    recs = read_metadata(tmp_path / "metadata.csv")
    assert len(recs) == 3
    assert recs[0].labels == {"class": "on", "speaker": "s1"} and recs[0].tags == {"mic": "top"}
    assert recs[1].path == tmp_path / "sub" / "b.wav" and recs[1].segment_ms == (100, 600)
    assert recs[1].name == "b.wav[100-600]" and recs[1].duration_s == pytest.approx(0.5)
    assert recs[2].labels == {}
    x, sr = recs[1].load()
    assert len(x) == 8000


def test_old_header_with_sensor_column_is_accepted(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "m.csv").write_text("File,Sensor,Labels\na.wav,mic1,state=ok\n")
    (rec,) = read_metadata(tmp_path / "m.csv")
    assert rec.labels == {"state": "ok"}


def test_malformed_lines_name_file_and_line(tmp_path):
    (tmp_path / "m.csv").write_text("a.wav,class=on\nb.wav,class\n")
    with pytest.raises(MetadataError, match=r"m.csv:2: malformed labels 'class'"):
        read_metadata(tmp_path / "m.csv")
    (tmp_path / "m.csv").write_text("a.wav[500-100],class=on\n")
    with pytest.raises(MetadataError, match=r"m.csv:1: segment \[500-100\] ends before it starts"):
        read_metadata(tmp_path / "m.csv")
    (tmp_path / "m.csv").write_text("a.wav,x=1,t=2,extra\n")
    with pytest.raises(MetadataError, match=r"m.csv:1: 4 columns"):
        read_metadata(tmp_path / "m.csv")


def test_write_then_read_round_trip(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "m.csv").write_text("a.wav[0-500],k=v;w=x,t=1\n")
    recs = read_metadata(tmp_path / "m.csv")
    write_metadata(tmp_path / "copy.csv", recs)
    again = read_metadata(tmp_path / "copy.csv")
    assert [(r.path, dict(r.labels), dict(r.tags), r.segment_ms) for r in again] == \
           [(r.path, dict(r.labels), dict(r.tags), r.segment_ms) for r in recs]


def test_missing_file_in_metadata_is_reported_or_skipped(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "metadata.csv").write_text("a.wav,c=x\nmissing.wav,c=y\n")
    with pytest.raises(AudioError, match=r"missing.wav: file not found \(declared at .*metadata.csv:2\)"):
        load_dataset(tmp_path)
    ds = load_dataset(tmp_path, skip_bad=True)
    assert len(ds) == 1 and len(ds.skipped) == 1


def test_folder_of_class_subfolders(tmp_path):
    _wav(tmp_path / "dog" / "1.wav")
    _wav(tmp_path / "dog" / "2.wav")
    _wav(tmp_path / "cat" / "1.wav")
    ds = load_dataset(tmp_path)
    assert ds.counts("anything") == {"dog": 2, "cat": 1}  # any --label name maps to the folder
    assert ds.folder_labels


def test_unknown_label_lists_the_labels(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "metadata.csv").write_text("a.wav,word=yes;speaker=s1\n")
    with pytest.raises(MetadataError, match="no label named 'wrd'; labels here: word, speaker"):
        load_dataset(tmp_path).values("wrd")


def test_identity_is_content_and_segment(tmp_path):
    a = _wav(tmp_path / "a.wav")
    (tmp_path / "b.wav").write_bytes(a.read_bytes())
    (tmp_path / "metadata.csv").write_text("a.wav,c=1\nb.wav,c=1\na.wav[0-500],c=1\n")
    r = load_dataset(tmp_path).recordings
    assert r[0].id == r[1].id != r[2].id


def test_nonexistent_path(tmp_path):
    with pytest.raises(UserError, match="no such file or folder"):
        load_dataset(tmp_path / "nope")


def test_resample_on_load(tmp_path):
    _wav(tmp_path / "a.wav")
    (tmp_path / "metadata.csv").write_text("a.wav,c=1\n")
    x, sr = load_dataset(tmp_path)[0].load(8000)
    assert sr == 8000 and len(x) == 8000 and x.dtype == np.float32


def test_empty_metadata_is_a_clear_error(tmp_path):
    (tmp_path / "metadata.csv").write_text("File,Labels\n")
    with pytest.raises(MetadataError, match="lists no recordings"):
        load_dataset(tmp_path)


def test_several_paths_from_any_iterable(tmp_path):
    paths = []
    for i in range(3):
        sf.write(tmp_path / f"t{i}.wav", tone(), 16000)
        paths.append(tmp_path / f"t{i}.wav")
    as_list = [r.path for r in load_dataset(paths)]
    assert [r.path for r in load_dataset(tuple(paths))] == as_list
    assert [r.path for r in load_dataset(p for p in paths)] == as_list          # a generator
    assert [r.path for r in load_dataset(map(str, paths))] == as_list           # strings
    assert len(as_list) == 3
