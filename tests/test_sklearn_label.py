"""The label name of a model saved from :class:`~wavetrain.sklearn.SoundClassifier`: ``label=`` or
the name of a pandas Series ``y``, stored in the model file and printed by ``wavetrain classify``
(``digit=3``, not a placeholder)."""
from __future__ import annotations

import numpy as np
import pytest

from wavetrain.cli.main import main
from wavetrain.data import write_audio
from wavetrain.data.demo import machine_sound
from wavetrain.models.modelfile import read_model_file
from wavetrain.sklearn import InvalidParameterError, SoundClassifier

STATES = ("healthy", "bearing", "loose")


def _clips(per_state=4, seed=0):
    rng = np.random.default_rng(seed)
    X, y = [], []
    for _ in range(per_state):
        for s in STATES:
            X.append(machine_sound(s, seconds=0.5, shaft_hz=rng.uniform(15, 40), snr_db=20.0, rng=rng))
            y.append(s)
    return X, y


def _classify_lines(capsys, model, wav) -> list[str]:
    capsys.readouterr()
    assert main(["classify", "-m", str(model), str(wav)]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_label_given_is_the_saved_models_and_classify_prints_it(tmp_path, capsys):
    X, y = _clips()
    clf = SoundClassifier("gmm", components=2, label="state").fit(X, y)
    assert clf.label_ == "state" and clf.get_params()["label"] == "state"
    path = clf.save(tmp_path / "clf.wt")
    assert read_model_file(path)[0]["label_name"] == "state"
    wav = tmp_path / "one.wav"
    write_audio(wav, X[1], 16000)
    lines = _classify_lines(capsys, path, wav)
    assert any("state=bearing" in line for line in lines), lines
    assert not any("label=" in line for line in lines), lines
    back = SoundClassifier.load(path)
    assert back.label == "state" and back.label_ == "state" and back.get_params() == clf.get_params()


def test_a_pandas_series_names_the_label(tmp_path):
    pd = pytest.importorskip("pandas")
    X, y = _clips()
    clf = SoundClassifier("gmm", components=2).fit(X, pd.Series(y, name="condition"))
    assert clf.label_ == "condition" and clf.model_.label_name_ == "condition"
    assert clf.label is None                        # the setting is left as given
    assert read_model_file(clf.save(tmp_path / "c.wt"))[0]["label_name"] == "condition"
    # a Series without a text name (a column number) and a plain list: the default name
    assert SoundClassifier("gmm", components=2).fit(X, pd.Series(y, name=0)).label_ == "label"
    assert SoundClassifier("gmm", components=2).fit(X, y).model_.label_name_ == "label"
    # label= wins over the Series' name
    assert SoundClassifier("gmm", components=2, label="s").fit(X, pd.Series(y, name="x")).label_ == "s"
    with pytest.raises(ValueError, match="y is named 'a=b'"):
        SoundClassifier("gmm", components=2).fit(X, pd.Series(y, name="a=b"))


@pytest.mark.parametrize("bad", ["", " digit", "a=b", "x;y", "two\nlines", 3])
def test_a_label_that_is_no_label_name_is_refused_when_given(bad):
    with pytest.raises(InvalidParameterError, match="label="):
        SoundClassifier("gmm", label=bad)
    clf = SoundClassifier("gmm", label="digit")
    with pytest.raises(InvalidParameterError, match="label="):
        clf.set_params(label=bad)
    assert clf.label == "digit"
