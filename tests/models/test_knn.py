"""knn, knn-anomaly and the bounded vector summary they share."""
import numpy as np
import pytest
import soundfile as sf
from scipy.spatial.distance import cdist

from wavetrain.cli.main import main
from wavetrain.evaluation.detection_metrics import roc_auc
from wavetrain.models import build, load_model, save_model
from wavetrain.models.vector_summary import VectorSummary, distances, nearest, subwindows
from wavetrain.train.array_stream import ArrayStream


def test_summary_stays_bounded_and_keeps_the_weight():
    rng = np.random.default_rng(0)
    s = VectorSummary(2, 5, capacity=30)
    for step in range(12):
        s.add(step % 2, rng.normal(size=(17, 5)))
        for c in range(2):
            assert s.label_vectors(c)[0].shape[0] <= 2 * 30       # the buffer, before finish()
    s.finish()
    for c in range(2):
        x, w = s.label_vectors(c)
        assert x.shape[0] <= 30
        assert w.sum() == pytest.approx(6 * 17) == s.seen[c]
    x, w, y = s.arrays()
    assert x.shape == (60, 5) and (np.bincount(y) == 30).all() and s.merges == 2 * (102 - 30)


def test_merge_semantics_on_a_hand_example():
    s = VectorSummary(1, 1, capacity=2)
    s.add(0, np.array([[0.0], [10.0], [10.5], [11.5]]))        # buffer full (2 x capacity)
    s.finish()
    x, w = s.label_vectors(0)
    # 10 and 10.5 merge first (nearest pair) into 10.25 (weight 2); then 10.25 and 11.5 (weights 2, 1)
    np.testing.assert_allclose(x[:, 0], [0.0, (2 * 10.25 + 11.5) / 3])
    np.testing.assert_allclose(w, [1.0, 3.0])
    s = VectorSummary(1, 2, capacity=1)
    s.add(0, np.array([[0.0, 0.0], [3.0, 3.0]]), weights=np.array([1.0, 2.0]))
    s.finish()
    x, w = s.label_vectors(0)
    np.testing.assert_allclose(x, [[2.0, 2.0]])
    np.testing.assert_allclose(w, [3.0])


def test_reduction_merges_the_exact_nearest_pair_each_time():
    """The maintained neighbour lists give the same merges as a brute-force search."""
    rng = np.random.default_rng(3)
    data = rng.normal(size=(40, 3))
    s = VectorSummary(1, 3, capacity=20)
    s.add(0, data)
    s.finish()
    x, w = list(data.copy()), [1.0] * 40
    while len(x) > 20:
        d = cdist(np.array(x), np.array(x))
        np.fill_diagonal(d, np.inf)
        i, j = sorted(np.unravel_index(np.argmin(d), d.shape))
        x[i] = (w[i] * x[i] + w[j] * x[j]) / (w[i] + w[j])
        w[i] += w[j]
        del x[j], w[j]
    got = s.label_vectors(0)
    np.testing.assert_allclose(got[0], np.array(x), atol=1e-9)
    np.testing.assert_allclose(got[1], w)


@pytest.mark.parametrize("distance,ref", [("euclidean", {"metric": "euclidean"}), ("l1", {"metric": "cityblock"}),
                                          ("lp", {"metric": "minkowski", "p": 3.0}),
                                          ("cosine", {"metric": "cosine"})])
def test_distances_match_scipy(distance, ref):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(37, 6)), rng.normal(size=(53, 6))
    np.testing.assert_allclose(distances(a, b, distance, p=3.0), cdist(a, b, **ref), atol=1e-9)
    idx, dist = nearest(a, b, 4, distance, p=3.0)
    full = cdist(a, b, **ref)
    np.testing.assert_array_equal(idx, np.argsort(full, axis=1, kind="stable")[:, :4])
    np.testing.assert_allclose(dist, np.sort(full, axis=1)[:, :4], atol=1e-9)


def test_subwindows_average_groups_of_frames():
    g = np.arange(10, dtype=np.float32).reshape(5, 2)
    np.testing.assert_allclose(subwindows(g, 2), [[1, 2], [5, 6], [8, 9]])
    np.testing.assert_allclose(subwindows(g, 1, normalize=True).mean(axis=0), [0, 0], atol=1e-12)


def _two_class(n=40, d=4, seed=0):
    rng = np.random.default_rng(seed)
    grams, y = [], []
    for i in range(n):
        c = i % 2
        grams.append((rng.normal(size=(1, d)) + 3.0 * c).astype(np.float32))
        y.append(c)
    return grams, y


def test_knn_learns_and_matches_sklearn_without_merges():
    from sklearn.neighbors import KNeighborsClassifier

    grams, y = _two_class()
    test, ty = _two_class(30, seed=1)
    model = build("knn", {"k": 1, "capacity": 100}).fit(ArrayStream(grams, y, ["a", "b"], batch_size=7))
    assert model.vectors_.shape[0] == 40 and model.train_info_["merges"] == 0
    ref = KNeighborsClassifier(1).fit(np.concatenate(grams), y)
    want = ref.predict(np.concatenate(test))
    got = model.predict_proba(test).argmax(axis=1)
    np.testing.assert_array_equal(got, want)
    assert np.mean(got == np.array(ty)) >= 0.95
    np.testing.assert_allclose(model.predict_proba(test).sum(axis=1), 1.0)
    assert (model.predict_proba(test) > 0).all()


def test_knn_with_few_summary_vectors_still_learns():
    grams, y = _two_class(200)
    model = build("knn", {"k": 3, "capacity": 8, "vote": "weight"}).fit(ArrayStream(grams, y, ["a", "b"]))
    assert np.bincount(model.vector_labels_).tolist() == [8, 8]
    assert model.weights_.sum() == 200
    test, ty = _two_class(40, seed=2)
    assert np.mean(np.array(model.predict(test)) == np.array(["a", "b"])[ty]) >= 0.95


def test_knn_unknown_distance():
    grams, y = _two_class()
    model = build("knn", {"k": 1, "unknown_distance": 5.0}).fit(ArrayStream(grams, y, ["a", "b"]))
    far = np.full((3, 4), 100.0, np.float32)
    names, _, info = model.predict_scores([grams[0], far])
    assert names == ["a", "unknown"] and info["nearest"][1] > 5.0


def test_knn_unknown_fpr_is_calibrated_on_held_out_recordings(tmp_path):
    grams, y = _two_class(200)
    data = ArrayStream(grams, y, ["a", "b"], groups=list(range(200)))
    model = build("knn", {"k": 3, "unknown_fpr": 0.1}).fit(data)
    assert model.train_info_["vectors_seen"] < sum(g.shape[0] for g in grams)      # the held-out part is left out
    fresh, _ = _two_class(400, seed=3)
    called = np.mean(np.array(model.predict(fresh)) == "unknown")
    assert 0.02 < called < 0.25                                                    # about unknown_fpr
    assert model.predict([np.full((3, 4), 100.0, np.float32)]) == ["unknown"]
    again = load_model(save_model(model, tmp_path / "k.wt"))
    assert again.predict(fresh) == model.predict(fresh)
    with pytest.raises(Exception, match="not both"):
        build("knn", {"unknown_fpr": 0.1, "unknown_distance": 1.0})


def test_knn_anomaly_separates_an_obvious_anomaly(tmp_path):
    rng = np.random.default_rng(0)
    normal = [rng.normal(size=(20, 6)).astype(np.float32) for _ in range(40)]
    model = build("knn-anomaly", {"k": 3, "capacity": 100, "subwindow_frames": 2})
    model.fit(ArrayStream(normal, [0] * 40, ["normal"]))
    test_normal = [rng.normal(size=(20, 6)).astype(np.float32) for _ in range(20)]
    anomalous = [(rng.normal(size=(20, 6)) + 1.5).astype(np.float32) for _ in range(20)]
    s = model.anomaly_score(test_normal + anomalous)
    assert roc_auc(np.r_[np.zeros(20), np.ones(20)], s) >= 0.9
    assert model.vectors_.shape[0] <= 100
    again = load_model(save_model(model, tmp_path / "a.wt"))
    np.testing.assert_allclose(again.anomaly_score(anomalous), model.anomaly_score(anomalous))
    assert again.threshold_ == model.threshold_


def test_knn_save_load_round_trip(tmp_path):
    grams, y = _two_class()
    model = build("knn", {"k": 3, "capacity": 10, "distance": "cosine"}).fit(ArrayStream(grams, y, ["a", "b"]))
    again = load_model(save_model(model, tmp_path / "k.wt"))
    np.testing.assert_array_equal(again.vectors_, model.vectors_)
    np.testing.assert_allclose(again.predict_proba(grams), model.predict_proba(grams))
    assert again.get_params() == model.get_params()


def _tones(root, n=6):
    rng = np.random.default_rng(0)
    rows = []
    t = np.arange(8000) / 16000
    for i in range(n):
        for state, f in (("normal", 400.0), ("anomaly", 2500.0)):
            x = 0.5 * np.sin(2 * np.pi * (f + 20 * i) * t) + 0.05 * rng.normal(size=t.size)
            name = f"{state}_{i}.wav"
            sf.write(root / name, x.astype(np.float32), 16000)
            rows.append(f"{name},state={state};take={i}")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    return root / "metadata.csv"


def test_cli_end_to_end(tmp_path, capsys):
    csv = _tones(tmp_path)
    model = tmp_path / "knn.wt"
    assert main(["train", "--data", str(csv), "--label", "state", "--model", "knn", "--set", "capacity=200",
                 "--features", "logmel(bands=16)", "-o", str(model), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "-m", str(model), "--data", str(csv), "--label", "state", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "accuracy  1.0000" in out
    assert main(["classify", "-m", str(model), str(tmp_path / "anomaly_0.wav")]) == 0
    assert "state=anomaly" in capsys.readouterr().out
    det = tmp_path / "det.wt"
    assert main(["train", "--data", str(csv), "--label", "state", "--normal", "normal", "--model", "knn-anomaly",
                 "--features", "logmel(bands=16)", "--set", "valid_fraction=0", "-o", str(det),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "-m", str(det), "--data", str(csv), "--label", "state", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "AUC 1.0000" in out
