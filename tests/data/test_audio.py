import numpy as np
import pytest
import soundfile as sf

from tests.conftest import tone
from wavetrain.core.errors import AudioError
from wavetrain.data import read_audio, read_info, write_audio


@pytest.mark.parametrize("subtype,tol", [("PCM_U8", 1e-2), ("PCM_16", 1e-4), ("PCM_24", 1e-6),
                                         ("PCM_32", 1e-6), ("FLOAT", 0), ("DOUBLE", 0)])
def test_wav_subtypes_read_as_float32(tmp_path, subtype, tol):
    x = tone()
    p = tmp_path / f"{subtype}.wav"
    sf.write(p, x, 16000, subtype=subtype)
    y, sr = read_audio(p)
    assert sr == 16000 and y.dtype == np.float32 and y.shape == x.shape
    assert np.max(np.abs(y - x)) <= tol + 1e-7


@pytest.mark.parametrize("fmt", ["flac", "ogg"])
def test_flac_and_ogg(tmp_path, fmt):
    x = tone()
    p = tmp_path / f"a.{fmt}"
    sf.write(p, x, 16000, format=fmt.upper(), subtype="PCM_16" if fmt == "flac" else "VORBIS")
    y, sr = read_audio(p)
    assert sr == 16000 and abs(len(y) - len(x)) < 2000
    assert np.corrcoef(y[:8000], x[:8000])[0, 1] > 0.9


def test_multichannel_averaged_to_mono_or_kept(tmp_path):
    left, right = tone(440), tone(880)
    p = tmp_path / "st.wav"
    sf.write(p, np.stack([left, right], axis=1), 16000, subtype="FLOAT")
    y, _ = read_audio(p)
    np.testing.assert_allclose(y, (left + right) / 2, atol=1e-6)
    y2, _ = read_audio(p, mono=False)
    assert y2.shape == (16000, 2)


def test_segment_selects_span(tmp_path):
    x = np.arange(16000, dtype=np.float32) / 16000
    p = tmp_path / "ramp.wav"
    sf.write(p, x, 16000, subtype="FLOAT")
    y, _ = read_audio(p, start_s=0.25, stop_s=0.5)
    np.testing.assert_allclose(y, x[4000:8000])
    with pytest.raises(AudioError, match="outside the recording"):
        read_audio(p, start_s=0.5, stop_s=2.0)


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(AudioError, match="missing.wav: file not found"):
        read_info(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioError, match="empty.wav: file is empty"):
        read_info(empty)
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF\x00\x00\x00\x00not really a wave file" * 20)
    with pytest.raises(AudioError, match="junk.wav: not a readable audio file"):
        read_info(junk)


def test_truncated_wav_is_detected(tmp_path):
    p = tmp_path / "full.wav"
    sf.write(p, tone(), 16000, subtype="PCM_16")
    cut = tmp_path / "cut.wav"
    cut.write_bytes(p.read_bytes()[:20000])
    with pytest.raises(AudioError, match="truncated"):
        read_info(cut)


def test_nan_samples_rejected(tmp_path):
    x = tone()
    x[100] = np.nan
    p = tmp_path / "nan.wav"
    sf.write(p, x, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match="NaN"):
        read_audio(p)


def test_write_audio_is_atomic_and_readable(tmp_path):
    p = tmp_path / "w.wav"
    write_audio(p, tone(), 8000)
    assert read_info(p).rate == 8000
    assert [f.name for f in tmp_path.iterdir()] == ["w.wav"]
    write_audio(tmp_path / "w.flac", tone(), 8000, sync=True)      # the format follows the suffix
    assert read_info(tmp_path / "w.flac").rate == 8000
    np.testing.assert_allclose(read_audio(tmp_path / "w.flac")[0], read_audio(p)[0], atol=1e-4)


def test_a_failed_audio_or_metadata_write_keeps_the_old_file(tmp_path, monkeypatch):
    import errno

    import wavetrain.core.outputs as outputs
    from wavetrain.core.outputs import OutputError
    from wavetrain.data import Recording, write_metadata

    wav, csv = tmp_path / "w.wav", tmp_path / "metadata.csv"
    write_audio(wav, tone(), 8000)
    csv.write_text("old\n")
    before = wav.read_bytes()

    def full(src, dst, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "replace", full)
    with pytest.raises(OutputError, match="cannot write audio .*w.wav: No space left on device; free some space"):
        write_audio(wav, -tone(), 8000)
    with pytest.raises(OutputError, match="cannot write metadata"):
        write_metadata(csv, [Recording(wav, {"a": "b"})])
    assert wav.read_bytes() == before and csv.read_text() == "old\n"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["metadata.csv", "w.wav"]
