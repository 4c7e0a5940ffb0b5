from pathlib import Path

import numpy as np
import pytest

from wavetrain.core.errors import UserError
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.data.splits import duplicate_groups, holdout_split, kfold_indices, rare_values


@pytest.fixture(autouse=True)
def _files(tmp_path, monkeypatch):
    """Recordings need files (identical content is grouped by its hash): each is a few distinct bytes."""
    monkeypatch.chdir(tmp_path)


def _ds(n_speakers=6, per=5, segments=False, copies=()):
    recs = []
    for s in range(n_speakers):
        for i in range(per):
            word = ["yes", "no"][i % 2]
            seg = (0, 500) if segments else None
            path = Path(f"s{s}_{i}.wav")
            path.write_bytes(f"{s}-{i}".encode())
            recs.append(Recording(path, {"word": word, "speaker": f"s{s}"}, segment_ms=seg))
            if segments:
                recs.append(Recording(path, {"word": word, "speaker": f"s{s}"}, segment_ms=(500, 1000)))
    for s, i, new_speaker in copies:  # a renamed copy of recording (s, i) under another speaker
        path = Path(f"copy_s{s}_{i}_{new_speaker}.wav")
        path.write_bytes(f"{s}-{i}".encode())
        recs.append(Recording(path, {"word": ["yes", "no"][i % 2], "speaker": new_speaker}))
    return Dataset(recs, Path("."))


def test_identical_content_never_on_both_sides():
    # s0_1 copied under speaker s3, s2_0 copied under the same speaker s2 (renamed): without
    # grouping by content, k-fold would test on a recording it trained on
    ds = _ds(copies=[(0, 1, "s3"), (2, 0, "s2")])
    for group_by, stratify in ((None, None), ("speaker", None), (None, "word"), ("speaker", "word")):
        for seed in range(5):
            folds = kfold_indices(ds, 3, group_by=group_by, seed=seed, stratify=stratify)
            assert sorted(np.concatenate(folds).tolist()) == list(range(len(ds)))
            fold_of = {i: f for f, idx in enumerate(folds) for i in idx}
            for a in range(len(ds)):
                for b in range(len(ds)):
                    if ds[a].id == ds[b].id:
                        assert fold_of[a] == fold_of[b]
            if group_by:  # the copy ties s0 and s3 together: both whole speakers in one fold
                speakers = [{ds[i].labels["speaker"] for i in f} for f in folds]
                assert any({"s0", "s3"} <= sp for sp in speakers)
    train, valid = holdout_split(ds, 0.3, seed=0)
    assert not {ds[i].id for i in train} & {ds[i].id for i in valid}


def test_duplicate_groups_lists_copies():
    ds = _ds(n_speakers=2, per=2, copies=[(1, 1, "s0")])
    assert [[ds[i].name for i in g] for g in duplicate_groups(ds)] == [["s1_1.wav", "copy_s1_1_s0.wav"]]


def test_group_folds_never_share_a_speaker():
    ds = _ds()
    folds = kfold_indices(ds, 3, group_by="speaker", seed=1)
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(ds)))
    speakers = [{ds[i].labels["speaker"] for i in f} for f in folds]
    for a in range(3):
        for b in range(a + 1, 3):
            assert not speakers[a] & speakers[b]


def test_segments_of_one_file_stay_together():
    ds = _ds(segments=True)
    folds = kfold_indices(ds, 4, seed=0)
    for f in folds:
        paths_in = {ds[i].path for i in f}
        others = {ds[i].path for g in folds if g is not f for i in g}
        assert not paths_in & others


def test_too_few_groups_is_a_clear_error():
    with pytest.raises(UserError, match="only 6 values of 'speaker'"):
        kfold_indices(_ds(), 8, group_by="speaker")


def test_rare_values_reported():
    ds = _ds()
    Path("x.wav").write_bytes(b"x")
    ds.recordings.append(Recording(Path("x.wav"), {"word": "maybe", "speaker": "s0"}))
    assert rare_values(ds, "word", 3, group_by="speaker") == {"maybe": 1}


def test_holdout_by_group():
    ds = _ds()
    tr, va = holdout_split(ds, 0.34, group_by="speaker", seed=0)
    assert {ds[i].labels["speaker"] for i in tr}.isdisjoint({ds[i].labels["speaker"] for i in va})
    assert len(tr) + len(va) == len(ds)


def test_holdout_with_too_few_groups_holds_out_recordings(caplog):
    # two speakers and 10%: one whole speaker would be half the data (and leave one voice to train on)
    ds = _ds(n_speakers=2, per=10)
    tr, va = holdout_split(ds, 0.1, group_by="speaker", seed=0)
    assert len(va) == 2 and len(tr) == 18
    assert {ds[i].labels["speaker"] for i in tr} == {"s0", "s1"}
    assert "only 2 values of 'speaker'" in caplog.text
    tr, va = holdout_split(_ds(n_speakers=5, per=2), 0.1, group_by="speaker", seed=0)    # 5 groups: one held out
    assert len(va) == 2


def test_stratified_folds_balance_values_within_groups():
    # 16 speakers of varied sizes, each speaking one word: plain group folds balance fold sizes only
    # and can put most of a word in one fold; stratified ones spread each word, speakers kept whole
    rng = np.random.default_rng(0)
    recs = []
    for s in range(16):
        for i in range(int(rng.integers(3, 9))):
            path = Path(f"st_s{s}_{i}.wav")
            path.write_bytes(f"{s}-{i}".encode())
            recs.append(Recording(path, {"word": "yes" if s % 2 else "no", "speaker": f"s{s}"}))
    ds = Dataset(recs, Path("."))
    yes = np.array([r.labels["word"] == "yes" for r in ds])
    spread = {}
    for strat in (None, "word"):
        shares = []
        for seed in range(10):
            folds = kfold_indices(ds, 4, group_by="speaker", seed=seed, stratify=strat)
            speakers = [{ds[i].labels["speaker"] for i in f} for f in folds]
            assert all(not (speakers[a] & speakers[b]) for a in range(4) for b in range(a + 1, 4))
            shares.append(np.std([yes[f].mean() for f in folds]))
        spread[strat] = float(np.mean(shares))
    assert spread["word"] < 0.5 * spread[None]
