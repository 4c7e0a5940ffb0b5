import numpy as np
import pytest
import soundfile as sf

from wavetrain.core.errors import AudioError
from wavetrain.data import load_dataset
from wavetrain.features import extract
from wavetrain.store import FeatureStore, MemoryCache
from wavetrain.stream import scheduler, source
from wavetrain.stream.feature_stream import FeatureStream
from wavetrain.stream.windows import Windowing

SPEC = "mfcc(coeffs=13) | delta(order=1)"


def test_one_pass_yields_every_window_once(demo_csv, tmp_path):
    ds = load_dataset(demo_csv)
    st = FeatureStream(ds, SPEC, label="state", windowing=Windowing(clip_ms=200, pad="none"),
                       store=FeatureStore(tmp_path), batch_windows=7)
    refs = [r for b in st.batches() for r in b.refs]
    assert len(refs) == len(set(refs)) == 4 * len(ds)  # 1 s = 49 frames of 20 ms: 4 whole 200 ms clips
    assert st.labels == ["bearing", "healthy", "loose"]
    again = [r for b in st.batches(shuffle=True, seed=3) for r in b.refs]
    assert sorted(again) == sorted(refs) and again != refs
    assert again == [r for b in st.batches(shuffle=True, seed=3) for r in b.refs]
    assert 0.0 <= st.stats.wait_fraction <= 1.0


def test_features_are_extracted_once_across_passes(demo_csv, tmp_path):
    ds = load_dataset(demo_csv)
    st = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path), cache=MemoryCache(1 << 20))
    for _ in range(3):
        for _ in st.batches():
            pass
    assert st.stats.extracted == len(ds)


def test_long_recordings_are_decoded_in_blocks(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32)
    sf.write(tmp_path / "long.wav", x, 16000, subtype="FLOAT")
    (tmp_path / "metadata.csv").write_text("long.wav,c=a\nlong.wav[500-2500],c=b\n")
    monkeypatch.setattr(source, "LONG_RECORDING_S", 0.4)
    import wavetrain.data.recording as rec_mod

    calls = []
    real = rec_mod.read_frames
    monkeypatch.setattr(rec_mod, "read_frames", lambda *a, **k: calls.append(a[2] - a[1]) or real(*a, **k))
    ds = load_dataset(tmp_path)
    st = FeatureStream(ds, SPEC, label="c")
    whole, seg = st.source.gram(ds[0]), st.source.gram(ds[1])
    np.testing.assert_allclose(whole, extract(x, 16000, SPEC), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(seg, extract(x[8000:40000], 16000, SPEC), rtol=1e-5, atol=1e-5)
    assert calls and max(calls) <= 0.25 * 16000


def test_skip_bad_skips_and_reports_once(demo_csv, tmp_path):
    good = sorted(demo_csv.parent.glob("*.wav"))[:2]
    sf.write(tmp_path / "short.wav", np.zeros(50, np.float32), 16000)
    (tmp_path / "metadata.csv").write_text(f"{good[0]},c=a\n{tmp_path / 'short.wav'},c=b\n{good[1]},c=b\n")
    ds = load_dataset(tmp_path)
    st = FeatureStream(ds, SPEC, label="c", skip_bad=True)
    for _ in range(2):
        n = sum(len(b) for b in st.batches())
    assert n == 2 and len(st.stats.skipped) == 1
    strict = FeatureStream(ds, SPEC, label="c")
    with pytest.raises(AudioError, match="short.wav"):
        for _ in strict.batches():
            pass


def test_short_recordings_are_handed_to_workers_in_bounded_groups(demo_csv, tmp_path, monkeypatch):
    ds = load_dataset(demo_csv)  # 1 s recordings
    monkeypatch.setattr(scheduler, "GROUP_S", 3.0)
    groups = []
    real = FeatureStream._windows_group
    monkeypatch.setattr(FeatureStream, "_windows_group",
                        lambda self, items: groups.append(list(items)) or real(self, items))
    st = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path), batch_windows=5)
    refs = [r[0] for b in st.batches(shuffle=True, seed=1) for r in b.refs]
    assert refs == st.order(True, 1)                       # every recording once, in order
    assert [i for g in groups for i in g] == refs
    assert max(len(g) for g in groups) == 3 and len(groups) == -(-len(ds) // 3)


def test_a_bad_recording_does_not_lose_its_group(demo_csv, tmp_path, monkeypatch):
    good = sorted(demo_csv.parent.glob("*.wav"))[:4]
    sf.write(tmp_path / "short.wav", np.zeros(50, np.float32), 16000)
    rows = [f"{good[0]},c=a", f"{good[1]},c=a", f"{tmp_path / 'short.wav'},c=b", f"{good[2]},c=b",
            f"{good[3]},c=b"]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    monkeypatch.setattr(scheduler, "GROUP_S", 100.0)       # all five in one group
    ds = load_dataset(tmp_path)
    st = FeatureStream(ds, SPEC, label="c", skip_bad=True, batch_windows=2)
    order = [r[0] for b in st.batches() for r in b.refs]
    assert order == [0, 1, 3, 4] and len(st.stats.skipped) == 1
    assert [r[0] for b in st.batches() for r in b.refs] == [0, 1, 3, 4]
    assert len(st.stats.skipped) == 1


def test_read_ahead_stays_bounded_when_memory_hits_and_misses_alternate(demo_csv, tmp_path, monkeypatch):
    """Each pending unit is one group or one in-memory recording, so the recordings taken from
    the order ahead of the consumer stay bounded whatever the mix of hits and misses."""
    ds = load_dataset(demo_csv)
    monkeypatch.setattr(scheduler, "GROUP_S", 2.5)
    st = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path), batch_windows=1, prefetch=2)
    grams = {rec.id: st.source.gram(rec) for rec in ds}
    taken = []
    monkeypatch.setattr(source.FeatureSource, "in_memory",
                        lambda self, rec: taken.append(1) or (grams[rec.id] if len(taken) % 3 == 0 else None))
    ahead = []
    for n, _ in enumerate(st.batches(), start=1):
        ahead.append(len(taken) - n)
    assert n == len(ds)
    assert max(ahead) <= 2 * 3 + 1  # prefetch units of at most 2 recordings (2.5 s), one being looked at


def test_grouping_never_opens_headers_on_the_consumer(demo_csv, tmp_path, monkeypatch):
    ds = load_dataset(demo_csv, check=False)           # headers not read yet
    monkeypatch.setattr(scheduler, "GROUP_S", 3.0)
    groups = []
    real = FeatureStream._windows_group
    monkeypatch.setattr(FeatureStream, "_windows_group",
                        lambda self, items: groups.append(len(items)) or real(self, items))
    st = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path))
    list(st.batches())
    assert set(groups) == {1}                          # unknown length: one per hand-off
    groups.clear()
    list(st.batches())                                 # the workers have read the headers
    assert max(groups) == 3


def test_wait_during_fitting_excludes_the_extraction_pass(demo_csv, tmp_path):
    ds = load_dataset(demo_csv)
    st = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path))
    st.precompute()
    s = st.stats
    assert s.features_total_s == pytest.approx(s.total_s) and s.features_wait_s == pytest.approx(s.wait_s)
    assert s.fit_wait_fraction == 0.0                  # no pass after extraction yet
    list(st.batches())
    fit_total, fit_wait = s.total_s - s.features_total_s, s.wait_s - s.features_wait_s
    assert fit_total > 0 and s.fit_wait_fraction == pytest.approx(fit_wait / fit_total)
    assert 0.0 <= s.fit_wait_fraction <= 1.0


def test_a_subset_knows_the_bad_recordings_already_found(demo_csv, tmp_path, monkeypatch):
    good = sorted(demo_csv.parent.glob("*.wav"))[:3]
    sf.write(tmp_path / "short.wav", np.zeros(50, np.float32), 16000)
    rows = [f"{good[0]},c=a", f"{tmp_path / 'short.wav'},c=b", f"{good[1]},c=b", f"{good[2]},c=a"]
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    ds = load_dataset(tmp_path)
    st = FeatureStream(ds, SPEC, label="c", skip_bad=True, store=FeatureStore(tmp_path / "s"))
    st.precompute()
    assert len(st.stats.skipped) == 1
    sub = st.subset([1, 2, 3])
    tried = []
    real = FeatureStream._windows
    monkeypatch.setattr(FeatureStream, "_windows",
                        lambda self, i, rec, g=None: tried.append(i) or real(self, i, rec, g))
    for _ in range(2):
        assert [r[0] for b in sub.batches() for r in b.refs] == [1, 2]
    assert 0 not in tried and sub.stats.skipped == []


@pytest.mark.parametrize("windowing", [Windowing(), Windowing(clip_ms=200, shift_ms=50),
                                       Windowing(clip_ms=200, shift_ms=800, pad="none")])
def test_expected_frames_from_known_durations_only(demo_csv, tmp_path, monkeypatch, windowing):
    from wavetrain.data.recording import Recording

    ds = load_dataset(demo_csv)
    st = FeatureStream(ds, SPEC, label="state", windowing=windowing, store=FeatureStore(tmp_path))
    for rec in ds:                                   # headers not read yet: unknown, without I/O
        rec._cache.pop("info", None)
    monkeypatch.setattr(Recording, "info", lambda self: (_ for _ in ()).throw(AssertionError("I/O")))
    assert st.expected_frames() is None
    monkeypatch.undo()
    actual = sum(g.shape[0] for b in st.batches() for g, y in zip(b.grams, b.y) if y >= 0)  # reads headers
    assert st.expected_frames() == actual


def test_store_reads_and_extractions_are_counted(demo_csv, tmp_path):
    ds = load_dataset(demo_csv)
    cold = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path))
    cold.precompute()
    assert (cold.stats.extracted, cold.stats.store_reads) == (len(ds), 0)
    warm = FeatureStream(ds, SPEC, label="state", store=FeatureStore(tmp_path), cache=MemoryCache(64 << 20))
    for _ in range(2):                                  # the second pass reads the memory cache
        for _ in warm.batches():
            pass
    assert (warm.stats.extracted, warm.stats.store_reads) == (0, len(ds))
