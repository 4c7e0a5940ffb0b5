"""The ensemble family: members with their own features from one combined spec, combined by
mean probability, vote or weighted vote."""
import json

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.core.errors import UserError
from wavetrain.features import CombinedSpec, extract, parse_spec
from wavetrain.models import build, load_model, save_model
from wavetrain.models.ensemble import Columns, EnsembleClassifier
from wavetrain.stream.batches import mapped
from wavetrain.train.array_stream import ArrayStream

A, B = "logmel(bands=8)", "mfcc(coeffs=5, window_ms=25, shift_pct=40)"
MEMBERS = json.dumps([{"model": "gmm", "components": 2, "features": A},
                      {"model": "gmm", "components": 3, "features": B, "seed": 1}])


def _data(n=40, seed=0):
    """Windows of 8 + 5 columns; the value shifts columns 0-3 (member A's) and 8-10 (member B's)."""
    rng = np.random.default_rng(seed)
    grams, y = [], []
    for i in range(n):
        c = i % 2
        g = rng.normal(0, 1, (15 + i % 4, 13)).astype(np.float32)
        g[:, :4] += 2.5 * c
        g[:, 8:11] -= 2.0 * c
        grams.append(g)
        y.append(c)
    return grams, y


def _stream(grams, y):
    return ArrayStream(grams, y, ["off", "on"], batch_size=8)


def test_spec_is_the_members_combined():
    m = build("ensemble", {"members": MEMBERS})
    spec = m.feature_spec
    assert isinstance(spec, CombinedSpec) and spec.parts == (parse_spec(A), parse_spec(B))
    assert m.params["features"] == str(spec) and parse_spec(m.params["features"]) == spec
    assert m.runtime_imports == ()
    # members with the same spec share its columns; all alike: the one spec itself
    same = build("ensemble", {"members": "gmm,gmm"})
    assert same.feature_spec == build("gmm").feature_spec and same.member_parts_ == [0, 0]


def test_learns_and_each_member_equals_the_member_alone():
    grams, y = _data()
    ens = build("ensemble", {"members": MEMBERS}).fit(_stream(grams, y))
    test, ty = _data(seed=1)
    assert np.mean(np.array(ens.predict(test)) == np.array(["off", "on"])[ty]) > 0.95
    assert ens.columns_.tolist() == [[0, 8], [8, 13]]
    p = ens.predict_proba(test)
    assert p.shape == (len(test), 2) and np.allclose(p.sum(axis=1), 1)
    members = json.loads(ens.params["members"])
    alone = []
    for (a, b), table in zip([(0, 8), (8, 13)], members):
        params = {k: v for k, v in table.items() if k != "model"}
        gmm = build("gmm", params).fit(_stream([g[:, a:b] for g in grams], y))
        np.testing.assert_array_equal(gmm.predict_proba([g[:, a:b] for g in test]),
                                      ens.members_[len(alone)].predict_proba([g[:, a:b] for g in test]))
        alone.append(gmm.predict_proba([np.ascontiguousarray(g[:, a:b]) for g in test]))
    np.testing.assert_allclose(p, np.mean(alone, axis=0))   # combine=mean
    names, scores, details = ens.predict_scores(test)
    assert names == ens.predict(test) and set(details) == {"agreement"}
    assert ((details["agreement"] >= 0) & (details["agreement"] <= 1)).all()
    assert ens.train_info_["weights"] == [1.0, 1.0] and len(ens.train_info_["members"]) == 2
    assert {h["member"] for h in ens.history_} <= {0, 1}


def test_vote_and_weighted():
    grams, y = _data()
    test, _ = _data(seed=2)
    vote = build("ensemble", {"members": MEMBERS, "combine": "vote"}).fit(_stream(grams, y))
    p = vote.predict_proba(test)
    assert set(np.unique(p)) <= {0.0, 0.5, 1.0}
    given = build("ensemble", {"members": MEMBERS, "combine": "weighted", "weights": "3,1"}).fit(_stream(grams, y))
    own = given.members_[0].predict_proba([g[:, :8] for g in test]).argmax(axis=1)
    assert given.predict(test) == [given.labels_[i] for i in own]   # the heavier member decides
    assert given.weights_.tolist() == [3.0, 1.0]
    auto = build("ensemble", {"members": MEMBERS, "combine": "weighted", "valid_fraction": 0.25})
    auto.fit(_stream(grams, y))
    accs = [m["valid_accuracy"] for m in auto.train_info_["members"]]
    assert all(0.5 < a <= 1 for a in accs) and auto.weights_.tolist() == pytest.approx(accs, abs=1e-3)


def test_vote_tie_goes_to_the_higher_mean_probability():
    grams, y = _data()
    ens = build("ensemble", {"members": MEMBERS, "combine": "vote"}).fit(_stream(grams, y))
    g = np.zeros((10, 13), np.float32)
    g[:, :4] += 2.5        # member A says "on", member B (columns 8-10 near 0 = "off") disagrees
    p, mean, probas = ens._combined([g])
    if probas[0].argmax() != probas[1].argmax():
        assert p[0].tolist() == [0.5, 0.5]
        assert ens.predict([g]) == [ens.labels_[int(mean[0].argmax())]]


def test_save_load_round_trip(tmp_path):
    grams, y = _data()
    ens = build("ensemble", {"members": MEMBERS, "combine": "weighted", "valid_fraction": 0.25})
    ens.fit(_stream(grams, y))
    path = save_model(ens, tmp_path / "e.wt")
    back = load_model(path)
    assert isinstance(back, EnsembleClassifier) and back.params == ens.params
    assert back.feature_spec == ens.feature_spec
    np.testing.assert_array_equal(back.predict_proba(grams), ens.predict_proba(grams))
    np.testing.assert_array_equal(back.weights_, ens.weights_)
    assert back.predict(grams) == ens.predict(grams)


def test_a_members_view_keeps_the_stream_capabilities():
    from wavetrain.stream.batches import CountsFrames, SplitsValidation

    grams, y = _data()
    view = mapped(_stream(grams, y), Columns(8, 13), 5)
    assert isinstance(view, SplitsValidation) and isinstance(view, CountsFrames)
    assert view.feature_dim == 5 and view.expected_frames() == _stream(grams, y).expected_frames()
    train, valid = view.split_validation(0.25, 0)
    assert train.feature_dim == valid.feature_dim == 5
    batch = next(iter(valid.batches()))
    assert all(g.shape[1] == 5 and g.flags.c_contiguous for g in batch.grams)


@pytest.mark.parametrize("params, message", [
    ({"members": "gmm"}, "two or more members, got 1"),
    ({"members": "gmm,,cnn"}, "member 1 is empty"),
    ({"members": "gmm,nosuch"}, r"members\[1\] \(nosuch\): unknown model 'nosuch'"),
    ({"members": "gmm,normal-dist"}, "normal-dist is an anomaly detector; members must be classifiers"),
    ({"members": "gmm,ensemble"}, "an ensemble cannot be a member"),
    ({"members": '[{"model": "gmm"}, {"model": "gmm", "clip_ms": 500}]'}, "clip_ms is the ensemble's"),
    ({"members": '[{"model": "gmm"}, {"model": "gmm", "components": 0}]'}, r"members\[1\] \(gmm\): gmm.components"),
    ({"members": '[{"model": "gmm"}, {"components": 2}]'}, "needs model ="),
    ({"members": "[1, 2"}, "invalid JSON list"),
    ({"members": "gmm,gmm-speech", "features": "mfcc"}, "features is derived from the members' feature specs"),
    ({"members": "gmm,gmm-speech", "weights": "1,2"}, "only with combine=weighted"),
    ({"members": "gmm,gmm-speech", "combine": "weighted", "weights": "1"}, "expected 2 non-negative numbers"),
    ({"members": '[{"model": "gmm", "features": "mfcc + logmel"}, {"model": "gmm"}]'}, "combined spec"),
    ({"members": '[{"model": "gmm", "features": "mfcc(rate=8000)"}, {"model": "gmm"}]'}, "must share rate="),
])
def test_bad_member_lists_are_one_line_errors(params, message):
    with pytest.raises(UserError, match=message) as e:
        build("ensemble", params)
    assert "\n" not in str(e.value)


def test_the_derived_features_may_be_given_back():
    m = build("ensemble", {"members": MEMBERS})
    again = build("ensemble", {"members": m.params["members"], "features": m.params["features"]})
    assert again.params == m.params


def test_toml_member_tables(tmp_path):
    spec = tmp_path / "ens.toml"
    spec.write_text('model = "ensemble"\ncombine = "vote"\n[[members]]\nmodel = "gmm"\ncomponents = 2\n'
                    f'features = "{A}"\n[[members]]\nmodel = "gmm-speech"\ncomponents = 4\n')
    m = build(str(spec))
    tables = json.loads(m.params["members"])
    assert [t["model"] for t in tables] == ["gmm", "gmm"] and tables[1]["components"] == 4
    assert tables[1]["features"].startswith("mfcc(bands=40, coeffs=13, window_ms=25")   # the preset's


def test_memory_estimate_is_largest_member_plus_the_others_state():
    m = build("ensemble", {"members": MEMBERS})
    g0, g1 = m.members_
    est = m.memory_estimate(13, 3, 4096, 10**6, 100)
    t0, t1 = g0.memory_estimate(8, 3, 4096, 10**6, 100), g1.memory_estimate(5, 3, 4096, 10**6, 100)
    s0, s1 = g0.memory_estimate(8, 3, 0, 0, 0), g1.memory_estimate(5, 3, 0, 0, 0)
    assert est == max(t0 + 4096 * 8 * 4 + s1, t1 + 4096 * 5 * 4 + s0)
    assert max(t0, t1) < est < t0 + t1 + 4096 * 13 * 4


def test_memory_estimate_counts_a_coarser_members_own_frames():
    """dcase's log-mel every 20 ms beside gmm-speech's MFCC every 10 ms: dcase trains on half
    of the rows, and its estimate is that of half the frames."""
    ens = build("ensemble", {"members": json.dumps([{"model": "gmm-speech"}, {"model": "dcase"}])})
    dims = [int(b - a) for a, b in ens._columns(16000, 1, ens.feature_spec.feature_dim(16000))]
    dcase = ens.members_[1]
    half = dcase.memory_estimate(dims[1], 10, 2048, 10**5, 75)
    assert ens._frame_share(1) == 0.5 and ens._frame_share(0) == 1.0
    est = ens.memory_estimate(sum(dims), 10, 4096, 2 * 10**5, 150)
    state0 = ens.members_[0].memory_estimate(dims[0], 10, 0, 0, 0)
    assert est == max(half + 4096 * dims[1] * 4 + state0,
                      ens.members_[0].memory_estimate(dims[0], 10, 4096, 2 * 10**5, 150) + 4096 * dims[0] * 4
                      + dcase.memory_estimate(dims[1], 10, 0, 0, 0))
    assert est < dcase.memory_estimate(dims[1], 10, 4096, 2 * 10**5, 150)


# ---- end to end ---------------------------------------------------------------------------------
def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_train_classify_evaluate(capsys, demo_csv, tmp_path):
    spec = tmp_path / "ens.toml"
    spec.write_text('model = "ensemble"\n[[members]]\nmodel = "gmm"\ncomponents = 4\nfeatures = "logmel(bands=32)"\n'
                    '[[members]]\nmodel = "gmm"\ncomponents = 4\nfeatures = "mfcc(coeffs=13, window_ms=25)"\n')
    out_model = tmp_path / "e.wt"
    code, out, err = run(capsys, "train", "--data", str(demo_csv), "--label", "state", "--model", str(spec),
                         "-o", str(out_model))
    assert code == 0, err
    wav = sorted(demo_csv.parent.glob("bearing_*.wav"))[0]
    code, out, err = run(capsys, "classify", "-m", str(out_model), "--json", str(wav))
    assert code == 0, err
    rec = json.loads(out)
    assert rec["value"] in ("healthy", "bearing", "loose") and sum(rec["scores"].values()) == pytest.approx(1)
    code, out, err = run(capsys, "evaluate", "--data", str(demo_csv), "--label", "state", "--model", "ensemble",
                         "--set", 'members=[{"model": "gmm", "components": 4}, {"model": "gmm", "components": 4, '
                         '"features": "mfcc(coeffs=13)"}]', "--folds", "2", "--group-by", "machine", "--json")
    assert code == 0, err
    assert json.loads(out)["accuracy"] > 0.8


@pytest.mark.parametrize("argv, message", [
    (["--set", "members=gmm"], "two or more members"),
    (["--set", "members=gmm,normal-dist"], "anomaly detector"),
    (["--set", "members=gmm,gmm-speech", "--features", "mfcc"], "derived from the members"),
])
def test_cli_bad_members_exit_2(capsys, demo_csv, tmp_path, argv, message):
    code, out, err = run(capsys, "train", "--data", str(demo_csv), "--label", "state", "--model", "ensemble",
                         *argv, "-o", str(tmp_path / "x.wt"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_predicts_through_the_stream_with_one_extraction_per_recording(demo_csv):
    from wavetrain.data import load_dataset
    from wavetrain.store import MemoryCache
    from wavetrain.stream.feature_stream import FeatureStream

    ds = load_dataset(demo_csv)
    model = build("ensemble", {"members": '[{"model": "gmm", "components": 2}, '
                                          '{"model": "gmm", "components": 2, "features": "mfcc(coeffs=8)"}]'})
    stream = FeatureStream(ds, model.feature_spec, label="state", cache=MemoryCache(1 << 28))
    model.fit(stream)
    assert stream.stats.extracted == len(ds)          # every member's passes read the one gram
    want = build("gmm").feature_spec.feature_dim(16000) + 8
    assert model.feature_dim_ == model.feature_spec.feature_dim(16000) == want


def test_unknown_fpr_calibrated_on_held_out_recordings(tmp_path):
    grams, y = _data(200)
    ens = build("ensemble", {"members": MEMBERS, "unknown_fpr": 0.1}).fit(
        ArrayStream(grams, y, ["off", "on"], batch_size=8, groups=list(range(200))))
    assert 0 < ens.unknown_threshold_ <= 1 and ens.train_info_["unknown_threshold"] == ens.unknown_threshold_
    fresh, _ = _data(200, seed=5)
    called = np.mean(np.array(ens.predict(fresh)) == "unknown")
    assert called < 0.3
    again = load_model(save_model(ens, tmp_path / "e.wt"))
    assert again.predict(fresh) == ens.predict(fresh)
    # between the two values: the members disagree or are unsure
    middle = [np.concatenate([np.full((16, 4), 1.25), np.zeros((16, 4)), np.full((16, 3), -1.0), np.zeros((16, 2))],
                             axis=1).astype(np.float32)]
    assert ens.predict(middle) == ["unknown"]


def test_a_member_on_a_coarser_frame_grid_sees_its_own_frames_once(tmp_path):
    """mfcc every 10 ms first, logmel every 20 ms second: the combined gram repeats each logmel
    frame on two rows; the logmel member trains and predicts on its own frames, as alone."""
    fine, coarse = "mfcc(coeffs=5, window_ms=25, shift_pct=40)", "logmel(bands=8)"
    members = json.dumps([{"model": "gmm", "components": 2, "features": fine},
                          {"model": "gmm", "components": 2, "features": coarse}])
    rng = np.random.default_rng(0)
    t = np.arange(16150) / 16000

    def signals(k):
        return [(np.sin(2 * np.pi * (300 + 900 * (i % 2)) * t) + 0.3 * rng.standard_normal(t.size)).astype(np.float32)
                for i in range(k)]

    train, test = signals(12), signals(6)
    y = [i % 2 for i in range(12)]
    ens = build("ensemble", {"members": members})
    grams = [extract(x, 16000, ens.feature_spec) for x in train]
    stream = _stream(grams, y)
    stream.rate = 16000
    ens.fit(stream)
    own = [extract(x, 16000, parse_spec(coarse)) for x in train]
    assert (len(grams[0]), len(own[0])) == (99, 49)
    seen = next(iter(mapped(stream, Columns(5, 13, ens._member_rows(1, 16000)), 8).batches())).grams
    np.testing.assert_array_equal(seen[0], own[0])
    alone = build("gmm", {"components": 2, "features": coarse}).fit(_stream(own, y))
    probe = [extract(x, 16000, ens.feature_spec) for x in test]
    np.testing.assert_array_equal(ens._member_probas(probe)[1],
                                  alone.predict_proba([extract(x, 16000, parse_spec(coarse)) for x in test]))
    back = load_model(save_model(ens, tmp_path / "e.wt"))
    np.testing.assert_array_equal(back.predict_proba(probe), ens.predict_proba(probe))
    # a model file from before members saw their own frames keeps feeding them the aligned rows
    old = build("ensemble", {"members": members})
    old.labels_, old.feature_dim_, old.feature_rate_ = ens.labels_, ens.feature_dim_, ens.feature_rate_
    old.load_state_dict({k: v for k, v in ens.state_dict().items() if k != "own_frames"})
    assert old._member_rows(1, 16000) is None and back._member_rows(1, 16000) is not None


def test_a_finer_member_listed_later_is_warned_about_once(caplog, monkeypatch):
    from wavetrain.models import ensemble
    monkeypatch.setattr(ensemble, "_WARNED", set())
    grams, y = _data()            # MEMBERS: logmel every 20 ms first, mfcc every 10 ms second
    for _ in range(2):
        build("ensemble", {"members": MEMBERS}).fit(_stream(grams, y))
    warned = [r.getMessage() for r in caplog.records if "finer frames" in r.getMessage()]
    assert len(warned) == 1 and "member 2 (gmm, mfcc every 10.0 ms)" in warned[0]
    caplog.clear()
    fine_first = json.dumps(list(reversed(json.loads(MEMBERS))))
    swapped = [np.concatenate([g[:, 8:], g[:, :8]], axis=1) for g in grams]
    build("ensemble", {"members": fine_first}).fit(_stream(swapped, y))
    assert not [r for r in caplog.records if "finer frames" in r.getMessage()]
