"""``wavetrain info``: a data set's sample rates and how many recordings carry each label; a model's
empty parameters say so."""
from __future__ import annotations

import json

import numpy as np
import soundfile as sf

from wavetrain.cli.main import main


def test_info_of_data_names_the_rates_and_the_recordings_a_label_is_on(tmp_path, capsys):
    for name, rate in (("a.wav", 16000), ("b.wav", 16000), ("c.wav", 8000)):
        sf.write(tmp_path / name, np.zeros(rate // 2, np.float32), rate)
    (tmp_path / "metadata.csv").write_text("a.wav,word=one;speaker=x\nb.wav,word=two\nc.wav,word=one\n")
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("3 recordings, ") and "at 8000 Hz (1), 16000 Hz (2)" in out[0]
    assert "label word: 2 values" in out and "label speaker: 1 values, on 1 of the 3 recordings" in out
    assert main(["info", str(tmp_path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["rates"] == {"8000": 1, "16000": 2} and s["labelled"] == {"word": 3, "speaker": 1}


def test_info_of_a_model_says_none_for_an_empty_parameter(tmp_path, demo_csv, capsys):
    model = tmp_path / "m.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=1",
                 "-o", str(model)]) == 0
    capsys.readouterr()
    assert main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert "  augment = (none)" in out and "augment = \n" not in out
