"""The page draws a recording's spectrogram up to the file's own Nyquist frequency (an 8 kHz file
to 4 kHz, not to the browser's 11 kHz), decoded at the rate the server's answer gives, and names a
model trained with a preset by the preset and its family. Headless chromium as in test_browser.py
(127.0.0.1 only, bounded waits); the pure helper also in node."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from tests.serve.conftest import _train
from tests.serve.test_browser import CHROMIUM, open_page
from tests.serve.test_page import _helpers
from wavetrain.serve import ModelService, ServeConfig, create_app


def test_the_spectrum_is_drawn_to_the_files_own_nyquist_frequency():
    got = _helpers("console.log(JSON.stringify([spectrumTop(8000, 8000), spectrumTop(8000, 22050), "
                   "spectrumTop(48000, 22050), spectrumTop(undefined, 22050)]))")
    assert got[0] == {"top": 4000, "share": 1}
    assert got[1]["top"] == 4000 and got[1]["share"] == pytest.approx(4000 / 11025)
    assert got[2] == {"top": 11025, "share": 1}            # never above what was decoded
    assert got[3] == {"top": 11025, "share": 1}


@pytest.fixture(scope="module")
def speech_service(demo_csv, tmp_path_factory):
    path = _train(demo_csv, tmp_path_factory.mktemp("serve") / "speech.wt", "--label", "state", "--model",
                  "gmm-speech", "--set", "components=2", "--no-cache")
    return ModelService.from_file(path)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_an_8khz_upload_is_drawn_to_4khz_and_the_preset_is_named(speech_service, demo_files, tmp_path):
    x, rate = sf.read(str(demo_files["loose"]), dtype="float32")
    assert rate == 16000
    wav = tmp_path / "loose_8k.wav"
    sf.write(str(wav), x[::2], 8000, subtype="PCM_16")            # (the demo holds nothing above 4 kHz)
    app = create_app(speech_service, ServeConfig(max_bytes=4 << 20))
    with open_page(app) as tab:
        tab.wait_for("document.readyState === 'complete' && !!document.getElementById('file')")
        line = tab.wait_for("(() => { const t = document.getElementById('model').textContent; "
                            "return t.includes('speech.wt') && t; })()")
        assert "gmm-speech (gmm) classifier" in line, line
        tab.upload(wav)
        tab.wait_for("!document.getElementById('specbox').hidden", timeout=20)
        ds = tab.evaluate("Object.assign({}, document.getElementById('spec').dataset)")
        assert ds["ylabel"] == "frequency (kHz)"
        assert ds["yticks"].split() == ["0", "1", "2", "3", "4"]           # not to 10 (22.05 kHz)
        caption = tab.evaluate("document.getElementById('speccaption').textContent")
        assert "0\u20134 kHz" in caption and "8000 Hz" in caption, caption
        # the top row of the plot is drawn (the file's 4 kHz), not left as resampled silence
        top_row = tab.evaluate("(() => { const d = document.getElementById('spec').getContext('2d')"
                               ".getImageData(60, 9, 800, 3).data; let s = 0; for (let i = 0; "
                               "i < d.length; i += 4) s += d[i]; return s / (d.length / 4); })()")
        assert top_row > 0


def test_the_answer_gives_the_files_rate(gmm_app):
    from tests.serve.conftest import asgi, multipart, wav_bytes

    x = (0.1 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)).astype(np.float32)
    body, ctype = multipart(wav_bytes(x, 8000))
    r = asgi(gmm_app, "POST", "/v1/classify", body, {"content-type": ctype})
    assert r.status == 200 and r.json()["sample_rate"] == 8000
