"""Augmentation inside training, streamed: the spec, its determinism per (seed, recording, draw),
what each family sees (a GMM's EM passes the same frames, a neural model's epochs fresh ones),
clean store, cache and validation, the CLI end to end and flat memory."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli.main import main
from wavetrain.core.errors import SpecError
from wavetrain.data import load_dataset
from wavetrain.features.augment import NOISE_COLORS, PRESETS, Augmenter, noise_of, parse_augment
from wavetrain.models import build, load_model
from wavetrain.pipeline.jobs import RunOptions, make_stream, prediction_stream
from wavetrain.pipeline.memory import current_rss, plan
from wavetrain.store import FeatureStore, MemoryCache
from wavetrain.stream.feature_stream import FeatureStream
from wavetrain.stream.windows import Windowing

SPEC = "logmel(bands=16, window_ms=25, shift_pct=80)"
FULL = ("noise(snr=5:20) | gain(db=-6:6) | shift(ms=0:100) | speed(factor=0.9:1.1) | pitch(semitones=-2:2) | "
        "reverb(rt60=0.1:0.8) | bandlimit(low=0:300, high=3000:8000) | specaugment(time=2, freq=2, width=8)")
WAVE = "noise(snr=5:20) | reverb(rt60=0.1:0.5) | bandlimit(low=0:300, high=3000:7000)"


def grams(stream, **kw) -> list[np.ndarray]:
    return [np.array(g) for b in stream.batches(**kw) for g in b.grams]


def digest(gs) -> str:
    h = hashlib.sha1()
    for g in gs:
        h.update(np.ascontiguousarray(g, dtype=np.float32).tobytes())
    return h.hexdigest()


def stream(ds, augment=None, **kw) -> FeatureStream:
    return FeatureStream(ds, SPEC, label="state", augment=parse_augment(augment) if augment else None, **kw)


# -- the spec -------------------------------------------------------------------------------------
def test_the_full_spec_parses_with_every_parameter_written_out():
    a = parse_augment(FULL)
    assert [s.name for s in a.stages] == ["noise", "gain", "shift", "speed", "pitch", "reverb", "bandlimit",
                                          "specaugment"]
    assert a.waveform and a.masks
    assert a.stages[0]["snr"] == (5.0, 20.0) and a.stages[0]["p"] == (1.0, 1.0)
    assert parse_augment(a.key).key == a.key                     # the canonical form parses back
    assert not parse_augment("") and not parse_augment(None) and not parse_augment("   ")
    only_masks = parse_augment("specaugment(time=1, freq=1, p=0.5)")
    assert only_masks.masks and not only_masks.waveform


@pytest.mark.parametrize("text, col, words", [
    ("noise(snrr=3)", 7, "unknown parameter 'snrr' for noise"),
    ("gain(db=6:-6)", 9, "low > high"),
    ("gain | echo", 8, "unknown stage 'echo'"),
    ("gain(db=x)", 9, "expected a number or a range"),
    ("gain(p=2)", 8, "outside [0, 1]"),
    ("gain(db=1", 10, "expected ',' or ')'"),
    ("gain(db=1) speed", 12, "expected '|' or end of spec"),
    ("specaugment(time=2) | gain", 23, "must come before specaugment"),
    ("specaugment(time=1.5)", 18, "expected an integer"),
    ("noise(dir=/no/such/folder)", 11, "is not a folder"),
    ("bandlimit(low=0:5000, high=3000:8000)", 1, "every low must be below every high"),
    ("mixup(alpha=0) | gain", 13, "'0' is outside [0.001, 100]"),
    ("room(p=0.5)", 1, "room is a preset and takes no parameters; to change them write its stages out: pad("),
    ("specaugment | room", 15, "pad changes the audio and must come before specaugment"),
    ("rooms", 1, "or a preset: room"),
    ("room | copies", 8, "copies says how many augmented copies of each recording a pass holds and must come first"),
    ("copies(n=2, p=0.5)", 1, "copies takes no p"),
])
def test_spec_errors_are_one_line_with_the_column(text, col, words):
    with pytest.raises(SpecError) as e:
        parse_augment(text)
    msg = str(e.value)
    assert "\n" not in msg and f"at column {col}:" in msg and words in msg


def test_a_preset_stands_for_its_stages_and_more_may_follow():
    a = parse_augment(" gain(db=1) | room | pitch(semitones=-1:1) | specaugment")
    assert [s.name for s in a.stages] == ["gain", "pad", "reverb", "bandlimit", "noise", "pitch", "specaugment"]
    assert a.key == parse_augment(f"gain(db=1) | {PRESETS['room']} | pitch(semitones=-1:1) | specaugment").key
    assert a.stages[4]["color"] == "any" and parse_augment(a.key).key == a.key   # the file records the stages


def test_draws_depend_on_seed_recording_and_draw_only():
    x = np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 0.1
    a = parse_augment(WAVE)
    one = a.apply(x, 16000, seed=0, content_id="ab" * 12, draw=1)
    assert np.array_equal(one, a.apply(x, 16000, seed=0, content_id="ab" * 12, draw=1))
    for other in (dict(seed=1, content_id="ab" * 12, draw=1), dict(seed=0, content_id="cd" * 12, draw=1),
                  dict(seed=0, content_id="ab" * 12, draw=2)):
        assert not np.array_equal(one, a.apply(x, 16000, **other))
    assert one.dtype == np.float32 and one.shape == x.shape
    never = parse_augment("gain(db=6, p=0)")
    assert np.array_equal(never.apply(x, 16000, seed=0, content_id="ab", draw=0), x)


def _band_power(y: np.ndarray, lo: float, hi: float, rate: int = 16000) -> float:
    p = np.abs(np.fft.rfft(y)) ** 2
    f = np.fft.rfftfreq(y.size, 1 / rate)
    return float(p[(f >= lo) & (f < hi)].sum() / p.sum())


def _which(y: np.ndarray) -> str:
    """The colour of a noise, told from its spectrum."""
    if _band_power(y, 4100, 8000) < 1e-6:
        return "babble"                                  # nothing outside the speech band
    mag = np.abs(np.fft.rfft(y))[int(40 * y.size / 16000):int(400 * y.size / 16000)]
    if mag.max() > 100 * np.median(mag):
        return "hum"                                     # lines
    low = _band_power(y, 20, 200)
    return "white" if low < 0.05 else "pink" if low < 0.3 else "brown"


def test_noise_colors_have_their_spectra():
    rng = np.random.default_rng(0)
    n = 32000
    noises = {c: noise_of(c, n, 16000, np.random.default_rng(1)) for c in NOISE_COLORS}
    for c, y in noises.items():
        assert y.shape == (n,) and np.std(y) == pytest.approx(1.0, abs=0.02), c
    low = {c: _band_power(y, 20, 200) for c, y in noises.items()}
    assert low["brown"] > low["pink"] > 5 * low["white"]            # -6, -3 and 0 dB per octave
    hum = np.abs(np.fft.rfft(noises["hum"]))
    peak_hz = np.argmax(hum[1:]) * 16000 / n + 16000 / n
    assert min(abs(peak_hz - 50), abs(peak_hz - 60)) < 1.0            # the mains fundamental leads
    assert _band_power(noises["hum"], 40, 4100) > 0.95
    babble = noises["babble"]
    assert _band_power(babble, 90, 4100) > 0.98                       # speech band only
    seg = babble.reshape(-1, 1600).std(axis=1)                         # 100 ms segments
    white = noises["white"].reshape(-1, 1600).std(axis=1)
    assert seg.std() / seg.mean() > 5 * white.std() / white.mean()    # syllable-rate envelopes
    assert {_which(noise_of("any", n, 16000, np.random.default_rng(s))) for s in range(30)} == set(NOISE_COLORS)
    assert {c: _which(y) for c, y in noises.items()} == {c: c for c in NOISE_COLORS}
    with pytest.raises(ValueError, match="unknown noise color 'green'"):
        noise_of("green", 10, 16000, rng)


def test_pad_grows_the_recording_and_noise_covers_it_at_the_snr_of_the_sound():
    x = (0.3 * np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)).astype(np.float32)
    a = parse_augment("pad(before=100, after=250) | noise(snr=10, color=pink)")
    y = a.apply(x, 16000, seed=0, content_id="ab", draw=0)
    assert y.shape == (8000 + 1600 + 4000,)
    noise = y.astype(np.float64) - np.concatenate([np.zeros(1600), x, np.zeros(4000)])
    assert np.all(np.abs(noise[:1600]) > 0)                            # the padding is noisy too
    snr = 10 * np.log10(np.mean(x.astype(np.float64) ** 2) / np.mean(noise ** 2))
    assert snr == pytest.approx(10.0, abs=0.01)                        # against the sound, not the padding
    drawn = parse_augment("pad(before=0:300, after=0:300)")
    sizes = {drawn.apply(x, 16000, seed=0, content_id="ab", draw=d).size for d in range(6)}
    assert len(sizes) == 6 and all(8000 <= s <= 8000 + 9600 for s in sizes)
    assert drawn.work_bytes(8000, 16000) > parse_augment("gain(db=1)").work_bytes(8000, 16000)

# -- the stream -----------------------------------------------------------------------------------
def test_same_seed_same_augmented_grams_other_seed_other_grams(demo_csv):
    ds = load_dataset(demo_csv)
    clean = grams(stream(ds))
    st = stream(ds, FULL, augment_seed=7)
    a, b, c = grams(st, seed=3), grams(st, seed=3), grams(st, seed=4)
    assert digest(a) == digest(b) != digest(c)
    assert digest(a) != digest(clean)
    assert st.stats.augmented == 3 * len(ds) and st.stats.extracted == 0
    assert digest(grams(stream(ds, FULL, augment_seed=8), seed=3)) != digest(a)     # the model's seed counts
    assert digest(grams(stream(ds, FULL, augment_seed=7), seed=3)) == digest(a)     # a new stream: the same


def test_copies_put_several_draws_of_each_recording_in_one_pass(demo_csv):
    ds = load_dataset(demo_csv)
    one = stream(ds, WAVE, augment_seed=7)
    three = stream(ds, f"copies(n=3) | {WAVE}", augment_seed=7)
    got = grams(three, seed=2)                                   # draws 6, 7 and 8 of each recording
    want = [g for d in (6, 7, 8) for g in grams(one, seed=d)]
    assert len(got) == len(want) == 3 * len(grams(one, seed=0))
    assert sorted(digest([g]) for g in got) == sorted(digest([g]) for g in want)
    assert digest(grams(three, seed=2)) == digest(got)           # a GMM's passes: the same copies
    assert three.stats.augmented == 2 * 3 * len(ds)                  # two passes of three copies
    assert len(grams(three.subset(range(4)), seed=0)) == 3 * len(grams(one.subset(range(4)), seed=0))


def test_specaugment_masks_windows_and_leaves_the_cached_grams_clean(demo_csv):
    ds = load_dataset(demo_csv)
    cache = MemoryCache(8 << 20)
    clean = grams(stream(ds, cache=cache))
    st = stream(ds, "specaugment(time=2, freq=2, width=4)", cache=cache, windowing=Windowing(clip_ms=200))
    masked = grams(st, seed=1)
    assert digest(masked) == digest(grams(st, seed=1)) != digest(grams(st, seed=2))
    assert st.stats.augmented == 0                          # the audio is not touched: clean grams, cached
    assert digest(grams(stream(ds, cache=cache))) == digest(clean)      # the cache still holds clean grams
    # a masked window holds runs equal to its mean; its unmasked cells are the clean window's
    plain = grams(stream(ds, windowing=Windowing(clip_ms=200)))
    assert len(plain) == len(masked)
    changed = [not np.array_equal(m, p) for m, p in zip(masked, plain)]
    assert sum(changed) > len(changed) // 2
    m, p = next((m, p) for m, p, c in zip(masked, plain, changed) if c)
    same = m == p
    assert same.mean() > 0.3


def test_the_store_and_the_memory_cache_never_hold_augmented_grams(demo_csv, tmp_path):
    ds = load_dataset(demo_csv)
    store, cache = FeatureStore(tmp_path / "store"), MemoryCache(8 << 20)
    aug = stream(ds, WAVE, store=store, cache=cache)
    aug.precompute()                                        # clean grams, into store and cache
    assert aug.stats.extracted == len(ds) and store.info()["entries"] == len(ds)
    first = digest(grams(aug, seed=0))
    for seed in (0, 1, 2):
        grams(aug, seed=seed)
    assert store.info()["entries"] == len(ds) and aug.stats.extracted == len(ds)     # nothing stored
    assert aug.stats.augmented == 4 * len(ds)               # every augmented pass extracts again
    assert digest(grams(aug, seed=0)) == first              # the cache's clean grams were not served
    # a later clean run reads the clean grams from the store (and the shared memory cache)
    fresh = stream(ds, store=FeatureStore(tmp_path / "fresh"))
    later = stream(ds, store=FeatureStore(tmp_path / "store"))
    assert digest(grams(later)) == digest(grams(fresh)) != first
    assert later.stats.extracted == 0 and later.stats.store_reads == len(ds)
    assert digest(grams(stream(ds, cache=cache))) == digest(grams(fresh))


def test_validation_windows_are_never_augmented(demo_csv):
    ds = load_dataset(demo_csv)
    st = stream(ds, WAVE)
    train, valid = st.split_validation(0.25, seed=0)
    assert train.augment is not None and valid.augment is None
    clean_valid = stream(ds).split_validation(0.25, seed=0)[1]
    assert digest(grams(valid, seed=5)) == digest(grams(clean_valid, seed=5))
    assert valid.stats.augmented == 0 and train.augment.key == st.augment.key


def test_only_training_streams_augment(demo_csv):
    ds = load_dataset(demo_csv)
    model = build("gmm", {"augment": WAVE, "components": 2, "features": SPEC})
    opts = RunOptions()
    assert make_stream(ds, model, opts, label="state").augment is not None       # the model learns from it
    model.fit(make_stream(ds, model, opts, label="state"))
    assert make_stream(ds, model, opts, label="state").augment is None           # fitted: predicted
    assert prediction_stream(model, ds, opts).augment is None
    assert make_stream(ds, build("gmm", {"features": SPEC}), opts, label="state").augment is None   # default off


def test_gmm_em_passes_see_the_same_augmented_frames(demo_csv, caplog):
    ds = load_dataset(demo_csv)
    model = build("gmm", {"augment": WAVE, "components": 2, "features": SPEC, "frame_cache_mb": 0,
                          "accelerate": False, "max_iter": 5, "tol": 0.0})
    st = make_stream(ds, model, RunOptions(), label="state")
    passes: list[str] = []
    inner = st.batches

    def recorded(**kw):
        got = []
        for b in inner(**kw):
            got.extend(np.array(g) for g in b.grams)
            yield b
        passes.append(digest(got))

    st.batches = recorded                                   # type: ignore[method-assign]
    with caplog.at_level("WARNING"):
        model.fit(st)
    assert len(passes) >= 3 and len(set(passes)) == 1
    # (frame_cache_mb=0 asks for no cache: the passes read the stream, without a warning to raise it)
    assert passes[0] != digest(grams(stream(ds)))           # augmented, not clean
    history = [h["loglik"] for h in model.history_ if "loglik" in h]
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(history, history[1:]))      # EM stays monotone


def test_neural_epochs_see_fresh_augmentations(demo_csv):
    from wavetrain.train.shuffle import shuffled_windows

    ds = load_dataset(demo_csv)
    st = stream(ds, WAVE)
    e1 = digest(sorted((g for g, _ in shuffled_windows(st, buffer=4, seed=0, epoch=1)), key=lambda g: g.sum()))
    e2 = digest(sorted((g for g, _ in shuffled_windows(st, buffer=4, seed=0, epoch=2)), key=lambda g: g.sum()))
    again = digest(sorted((g for g, _ in shuffled_windows(st, buffer=4, seed=0, epoch=1)), key=lambda g: g.sum()))
    assert e1 == again != e2


def test_a_neural_epoch_with_copies_is_that_many_times_longer(demo_csv):
    ds = load_dataset(demo_csv)
    steps = {}
    for copies in (1, 3):
        model = build("cnn", {"augment": f"copies(n={copies}) | gain(db=-3:3)", "features": SPEC, "epochs": 1,
                              "batch_size": 4, "valid_fraction": 0})
        model.fit(make_stream(ds, model, RunOptions(), label="state"))
        steps[copies] = model.train_info_["iterations"], model.history_[-1]["lr"]
    assert steps[3][0] == 3 * steps[1][0] > 0
    for total, last_lr in steps.values():                       # the cosine schedule planned every step
        assert last_lr == pytest.approx(1e-3 * (0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * (total - 1) / total))))


def test_noise_from_a_folder_reads_one_segment_per_draw(demo_csv, tmp_path, monkeypatch):
    from wavetrain.features import augment as aug_mod

    folder = tmp_path / "noise"
    folder.mkdir()
    rng = np.random.default_rng(1)
    sf.write(folder / "long.wav", (0.1 * rng.standard_normal(3 * 8000)).astype(np.float32), 8000)
    sf.write(folder / "short.flac", (0.1 * rng.standard_normal(2000)).astype(np.float32), 16000)
    (folder / "notes.txt").write_text("not audio")
    reads: list[tuple[int, int]] = []
    real = aug_mod.read_frames

    def counting(path, start, stop, **kw):
        reads.append((start, stop))
        return real(path, start, stop, **kw)

    monkeypatch.setattr(aug_mod, "read_frames", counting)
    ds = load_dataset(demo_csv)
    st = stream(ds, f"noise(snr=0:5, dir='{folder}')")
    a = grams(st, seed=1)
    assert len(reads) == len(ds)                          # one segment per recording and draw
    assert all(stop - start <= 8001 for start, stop in reads)   # never a whole 3 s file for a 1 s clip
    assert digest(a) == digest(grams(st, seed=1)) != digest(grams(stream(ds)))
    with pytest.raises(Exception, match="no audio files"):
        (tmp_path / "empty").mkdir()
        grams(stream(ds, f"noise(dir={tmp_path / 'empty'})"), seed=0)


def test_memory_stays_flat_over_augmented_passes(demo_csv):
    ds = load_dataset(demo_csv)
    st = stream(ds, FULL, cache=MemoryCache(4 << 20), windowing=Windowing(clip_ms=200))
    for seed in range(3):
        grams(st, seed=seed)
    before = current_rss()
    for seed in range(3, 15):
        for _ in st.batches(seed=seed):
            pass
    assert current_rss() - before < 40 << 20


def test_the_plan_counts_the_augmented_decoding(demo_csv):
    ds = load_dataset(demo_csv)
    plain = plan(ds, build("gmm", {"features": SPEC}))
    augmented = plan(ds, build("gmm", {"features": SPEC, "augment": WAVE}))
    assert "augment" not in plain.components_mb and not plain.notes
    assert augmented.components_mb["augment"] > 0 and not augmented.phased
    assert any("every training pass decodes" in n for n in augmented.notes)
    assert "every training pass decodes" in augmented.format()
    only_masks = plan(ds, build("gmm", {"features": SPEC, "augment": "specaugment(time=1)"}))
    assert "augment" not in only_masks.components_mb


# -- the command line -----------------------------------------------------------------------------
@pytest.mark.parametrize("family, extra, spec", [
    ("gmm", ["--set", "components=2"], "copies(n=2) | room"),
    ("cnn", ["--set", "epochs=2", "--set", "batch_size=8"],
     "noise(snr=10:20) | reverb(rt60=0.1:0.3) | bandlimit(low=0:200, high=4000:7000) | specaugment(time=1) | mixup"),
])
def test_train_with_augment_end_to_end(capsys, demo_csv, tmp_path, family, extra, spec):
    out = tmp_path / f"{family}.wt"
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", family, "--features",
                 "logmel(bands=16)", "--set", f"augment={spec}", *extra, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "augmented extractions (every pass's augmented audio)" in err     # (not "0 extractions" alone)
    m = load_model(out)
    assert parse_augment(m.params["augment"]).key == parse_augment(spec).key
    assert main(["evaluate", "-m", str(out), "--data", str(demo_csv), "--label", "state", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert 0.0 <= res["accuracy"] <= 1.0


def test_a_bad_augment_spec_is_a_one_line_error(capsys, demo_csv, tmp_path):
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set",
                 "augment=noise(snr=5:20) | echo(ms=3)", "-o", str(tmp_path / "x.wt")])
    err = capsys.readouterr().err
    assert code == 2 and "invalid augment spec at column 19: unknown stage 'echo'" in err
    assert Augmenter().key == ""


# -- vocal tract length perturbation --------------------------------------------------------------
def test_warp_extracts_each_draw_with_its_own_warped_filter_bank(demo_csv):
    """``warp(factor=…)``: the audio is left as it is and each draw's gram is the recording's at its
    drawn warp (the same draw, the same warp); with p=0 nothing changes."""
    from wavetrain.features import extract
    from wavetrain.features.spec import warped_specs

    ds = load_dataset(demo_csv)
    aug = parse_augment("warp(factor=0.85:1.15)")
    assert aug.waveform and aug.warps and not aug.masks
    st = stream(ds, aug, augment_seed=5)
    got = grams(st, seed=2)
    assert st.stats.augmented == len(ds)
    factors = [aug.warp_factor(seed=5, content_id=r.id, draw=2) for r in ds]
    assert len(set(factors)) == len(ds) and all(0.85 <= f <= 1.15 for f in factors)
    for g, rec, f in zip(got, ds, factors):
        x, sr = rec.load(None)
        np.testing.assert_allclose(g, extract(x, sr, warped_specs(SPEC, (f,))), rtol=1e-5, atol=1e-5)
    assert digest(grams(st, seed=2)) == digest(got)
    assert digest(grams(stream(ds, "warp(factor=0.85:1.15, p=0)", augment_seed=5), seed=2)) == digest(grams(stream(ds)))


def test_warp_needs_a_mel_filter_bank(capsys, demo_csv, tmp_path):
    code = main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--features", "fft(bins=16)",
                 "--set", "augment=warp(factor=0.9:1.1)", "-o", str(tmp_path / "x.wt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "warps a mel filter bank" in err[0]
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--features", SPEC,
                 "--set", "components=2", "--set", "augment=copies(n=2) | warp(factor=0.9:1.1)",
                 "-o", str(tmp_path / "ok.wt")]) == 0
