"""Combined feature specs ``A + B``: grammar, identity, geometry, extraction and alignment."""
import hashlib

import numpy as np
import pytest

from wavetrain.core.errors import SpecError
from wavetrain.features import CombinedSpec, FeatureSpec, combine_specs, extract, extract_blocks, parse_spec
from wavetrain.features.combined import nearest_frames, part_rows
from wavetrain.features.spec import replace

RATE = 16000


@pytest.fixture
def noise():
    return (0.1 * np.random.default_rng(3).standard_normal(RATE)).astype(np.float32)


@pytest.mark.parametrize("text", [
    "mfcc(coeffs=20) + logmel(bands=64) | normalize",
    "mfcc(coeffs=13) | delta(order=2) + logmel(bands=8, window_ms=25, shift_pct=40)",
    "logmel(bands=8) + rms + stats(whole=true)",
])
def test_round_trip_and_key(text):
    spec = parse_spec(text)
    assert isinstance(spec, CombinedSpec) and isinstance(spec, FeatureSpec)
    again = parse_spec(str(spec))
    assert again == spec and hash(again) == hash(spec) and str(again) == str(spec) and again.key == spec.key
    assert " + " in str(spec) and len(spec.key) == 16
    assert spec.parts == tuple(parse_spec(t) for t in str(spec).split(" + "))
    assert spec != spec.parts[0] and spec.key != spec.parts[0].key


def test_key_is_stable_and_order_matters():
    a = parse_spec("mfcc(coeffs=20) + logmel(bands=64)")
    assert a.key == parse_spec(" MFCC( coeffs = 20 )+LOGMEL(bands=64, window='hann')").key
    # fixed across processes and versions: the store is content-addressed by it
    assert a.key == "940d69d332933034" == hashlib.sha256(str(a).encode()).hexdigest()[:16]
    assert a.key != parse_spec("logmel(bands=64) + mfcc(coeffs=20)").key
    assert combine_specs(["mfcc(coeffs=20)", "logmel(bands=64)"]) == a
    assert combine_specs([a, "rms"]).parts == (*a.parts, parse_spec("rms"))   # flattened
    assert combine_specs(["mfcc"]) == parse_spec("mfcc")


def test_precedence_each_part_has_its_processors():
    spec = parse_spec("mfcc | delta + logmel | normalize")
    assert [p.name for p in spec.parts] == ["mfcc", "logmel"]
    assert [c.stage for c in spec.parts[0].processors] == ["delta"]
    assert [c.stage for c in spec.parts[1].processors] == ["normalize"]


def test_geometry():
    spec = parse_spec("mfcc(coeffs=20) + logmel(bands=64, window_ms=25, shift_pct=40) + rms(rate=none)")
    assert spec.feature_dim(RATE) == 20 + 64 + 1
    assert spec.part_dims(RATE) == [20, 64, 1]
    assert spec.n_frames(RATE, RATE) == spec.parts[0].n_frames(RATE, RATE) == 49
    assert spec.frame_shift_s(RATE) == spec.parts[0].frame_shift_s(RATE) == 0.02
    assert spec.rate is None and spec.per_axis is False and spec.name == "mfcc+logmel+rms"
    assert spec.extractor == spec.parts[0].extractor
    r = parse_spec("mfcc(rate=8000) + logmel(rate=8000)")
    assert r.rate == 8000 and r.n_frames(RATE, RATE) == r.parts[0].n_frames(RATE, RATE)
    moved = replace(parse_spec("mfcc + logmel"), rate=22050)
    assert isinstance(moved, CombinedSpec) and all(p.rate == 22050 for p in moved.parts)


@pytest.mark.parametrize("text, where, what", [
    ("mfcc +", 7, "expected an extractor name"),
    ("mfcc + logmel(rate=8000)", 8, "must share rate="),
    ("mfcc + logmel(per_axis=true)", 8, "must share per_axis="),
    ("mfcc logmel", 6, "expected '|', '+' or end of spec"),
    ("mfcc + delta", 8, "is a processor"),
])
def test_errors_name_the_column(text, where, what):
    with pytest.raises(SpecError, match=what) as e:
        parse_spec(text)
    assert f"column {where}" in str(e.value) and "\n" not in str(e.value)


def test_built_objects_refused_with_a_message():
    spec = parse_spec("mfcc + logmel")
    with pytest.raises(SpecError, match="one extractor per part"):
        spec.build_extractor()


def test_parts_columns_equal_each_part_alone_on_the_same_grid(noise):
    spec = parse_spec("mfcc(coeffs=20) | delta + logmel(bands=64) | normalize + rms")
    g = extract(noise, RATE, spec)
    assert g.shape == (49, spec.feature_dim(RATE)) and g.dtype == np.float32
    start = 0
    for part in spec.parts:
        alone = extract(noise, RATE, part)
        np.testing.assert_array_equal(g[:, start:start + alone.shape[1]], alone)
        start += alone.shape[1]
    assert start == g.shape[1]
    # a batch gives the same rows
    batch = extract(np.stack([noise, noise[::-1].copy()]), RATE, spec)
    np.testing.assert_allclose(batch[0], g, rtol=1e-4, atol=1e-4)  # FFT chunks differ: float rounding


def test_alignment_takes_the_nearest_frame_centre(noise):
    # grid: 40 ms every 20 ms (centres 20, 40, 60, ... ms); other part: 25 ms every 10 ms
    # (centres 12.5, 22.5, 32.5, ... ms)
    spec = parse_spec("logmel(bands=8) + logmel(bands=4, window_ms=25, shift_pct=40)")
    g = extract(noise, RATE, spec)
    b = extract(noise, RATE, spec.parts[1])
    grid_c = 20.0 + 20.0 * np.arange(g.shape[0])
    part_c = 12.5 + 10.0 * np.arange(b.shape[0])
    want = np.abs(grid_c[:, None] - part_c[None, :]).argmin(axis=1)  # no ties here
    np.testing.assert_array_equal(nearest_frames(spec.parts[0], spec.parts[1], len(noise), RATE), want)
    np.testing.assert_array_equal(g[:, 8:], b[want])
    np.testing.assert_array_equal(g[:, :8], extract(noise, RATE, spec.parts[0]))


def test_alignment_ties_go_to_the_later_frame_and_clip_at_the_ends():
    # grid centres 20, 40, ... ms; other part 20 ms windows every 20 ms: centres 10, 30, 50 ms
    grid, other = parse_spec("logmel(window_ms=40)"), parse_spec("logmel(window_ms=20, shift_pct=100)")
    idx = nearest_frames(grid, other, RATE, RATE)
    assert list(idx[:3]) == [1, 2, 3]              # 20 ms is as near 10 as 30 ms: the later one
    assert idx[-1] == other.n_frames(RATE, RATE) - 1  # never past the part's last frame
    # a coarser part: each of its frames serves the grid frames nearest it
    coarse = parse_spec("logmel(window_ms=200, shift_pct=50)")   # centres 100, 200, ... ms
    assert list(nearest_frames(grid, coarse, RATE, RATE)[:8]) == [0] * 7 + [1]   # 140 ms -> 100, 160 -> 200


def test_a_whole_clip_part_is_repeated(noise):
    spec = parse_spec("logmel(bands=8) + stats(whole=true)")
    g = extract(noise, RATE, spec)
    whole = extract(noise, RATE, spec.parts[1])
    assert whole.shape[0] == 1
    np.testing.assert_array_equal(g[:, 8:], np.repeat(whole, g.shape[0], axis=0))


def test_resampling_is_done_once_for_all_parts(noise):
    spec = parse_spec("logmel(bands=8, rate=8000) + mfcc(coeffs=5, rate=8000)")
    g = extract(noise, RATE, spec)
    np.testing.assert_array_equal(g[:, :8], extract(noise, RATE, spec.parts[0]))
    np.testing.assert_array_equal(g[:, 8:], extract(noise, RATE, spec.parts[1]))


def test_blocks_read_each_block_once_and_match_whole_extraction():
    x = (0.1 * np.random.default_rng(5).standard_normal(RATE * 5)).astype(np.float32)
    spec = parse_spec("logmel(bands=8) | normalize + mfcc(coeffs=6, window_ms=25, shift_pct=40) | delta")
    reads = []

    def read(a, b):
        reads.append((a, b))
        return x[a:b]

    got = extract_blocks(read, len(x), RATE, spec, block_s=0.37)
    want = extract(x, RATE, spec)
    assert got is not None and got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=5e-5)
    covered = sum(b - a for a, b in reads)
    assert covered < 1.2 * len(x)          # about one decode: blocks overlap by one sub-window
    assert extract_blocks(lambda a, b: x[a:b], len(x), RATE, "logmel + stats(whole=true)") is None
    assert extract_blocks(lambda a, b: x[a:b], len(x), RATE, "logmel(rate=8000) + mfcc(rate=8000)") is None


def test_store_key_and_stream_accept_a_combined_spec(tmp_path):
    from wavetrain.stream.source import FeatureSource

    src = FeatureSource("mfcc(coeffs=5) + logmel(bands=8)", rate=8000)
    assert src.spec_key == src.spec.key
    rs, key = src._resampling  # a recording at another rate: the resampling spec, keyed apart
    assert isinstance(rs, CombinedSpec) and all(p.rate == 8000 for p in rs.parts) and key != src.spec_key


@pytest.mark.parametrize("n", [8000, 12345, 16000, 16150, 16300, 24001])
def test_part_rows_give_back_a_coarser_parts_own_frames(n):
    fine = "mfcc(coeffs=13, window_ms=25, shift_pct=40)"    # 10 ms
    coarse = "logmel(bands=8)"                               # 20 ms: each frame aligned to two rows
    spec = parse_spec(f"{fine} + {coarse}")
    x = (0.1 * np.random.default_rng(n).standard_normal(n)).astype(np.float32)
    g, alone = extract(x, RATE, spec), extract(x, RATE, parse_spec(coarse))
    rows = part_rows(spec, 1, g.shape[0], RATE)
    assert rows is not None and (np.diff(rows) > 0).all()
    own = g[rows, 13:]
    # each of the part's frames once, in order; only the last may be left out
    assert len(alone) - 1 <= len(own) <= len(alone)
    np.testing.assert_array_equal(own, alone[:len(own)])
    # the first part, and parts on the same or a finer grid, keep every row
    assert part_rows(spec, 0, g.shape[0], RATE) is None
    assert part_rows(parse_spec(f"{coarse} + {fine}"), 1, len(alone), RATE) is None
    assert part_rows(parse_spec(f"{fine} + logmel(bands=8, window_ms=25, shift_pct=40)"), 1, g.shape[0], RATE) is None
