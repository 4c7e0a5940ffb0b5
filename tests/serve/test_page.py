"""The web page of ``wavetrain serve`` without a browser: its HTML (the spectrogram hidden until
there is one) and its script's pure helpers run in node (axis ticks, score bars), skipped where
node is not installed. The browser test (test_browser.py) checks the same page drawn."""
from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from wavetrain.serve.page import PAGE

NODE = shutil.which("node") or shutil.which("nodejs")


class _Elements(HTMLParser):
    """Each element's tag, attributes and the ids of the elements it is inside."""

    def __init__(self):
        super().__init__()
        self.found: dict[str, tuple[str, dict, list[str]]] = {}
        self.stack: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.found[a["id"]] = (tag, a, [i for _, i in self.stack if i])
        if tag not in ("meta", "input", "br", "img", "link"):
            self.stack.append((tag, a.get("id")))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass


def test_the_spectrogram_is_hidden_until_there_is_one():
    page = _Elements()
    page.feed(PAGE)
    tag, attrs, _ = page.found["specbox"]
    assert tag == "figure" and "hidden" in attrs
    canvas_tag, _, inside = page.found["spec"]
    assert canvas_tag == "canvas" and "specbox" in inside
    assert "specbox" in page.found["speccaption"][2]
    style = PAGE.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "#000" not in style                            # no black box, drawn or not
    script = PAGE.split("<script>", 1)[1].split("</script>", 1)[0]
    # hidden again when a new file is sent, shown once its spectrogram is drawn
    assert script.index('$("specbox").hidden = true') < script.index('$("specbox").hidden = false')
    assert script.index("drawSpectrogram(audio, res);") < script.index('$("specbox").hidden = false')


def _helpers(calls: str):
    """Run the page's pure helpers and then ``calls`` (JavaScript printing JSON) in node."""
    if NODE is None:
        pytest.skip("node is not installed")
    script = PAGE.split("<script>", 1)[1].split("</script>", 1)[0]
    helpers = script.split("// -- pure helpers", 1)[1].split("// -- end of pure helpers --", 1)[0]
    helpers = helpers.split("\n", 1)[1]
    out = subprocess.run([NODE, "-e", helpers + "\n" + calls], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_axis_ticks_are_round_values_with_units():
    got = _helpers("console.log(JSON.stringify([timeTicks(1.0, 830), timeTicks(0.37, 830), timeTicks(600, 830), "
                   "freqTicks(11025, 252), freqTicks(1000, 252)]))")
    one, short, long_, khz, hz = got
    assert one["label"] == "time (s)"
    assert [t["text"] for t in one["ticks"]] == [f"{i / 10:.1f}" for i in range(11)]
    assert [t["text"] for t in short["ticks"]] == [f"{i * 0.05:.2f}" for i in range(8)]
    assert [t["text"] for t in long_["ticks"]] == [str(100 * i) for i in range(7)]
    assert khz["label"] == "frequency (kHz)" and [t["text"] for t in khz["ticks"]] == ["0", "2", "4", "6", "8", "10"]
    assert [t["value"] for t in khz["ticks"]] == [0, 2000, 4000, 6000, 8000, 10000]
    assert hz["label"] == "frequency (Hz)" and [t["value"] for t in hz["ticks"]] == [0, 200, 400, 600, 800, 1000]
    for axis in got:
        values = [t["value"] for t in axis["ticks"]]
        assert values == sorted(values) and values[0] == 0


def test_loglik_scores_are_bars_relative_to_the_best_labelled_with_the_difference():
    preds = [{"label": "loose", "score": -12.35}, {"label": "healthy", "score": -28.85},
             {"label": "bearing", "score": -40.35}, {"label": "x", "score": None}]
    bars = _helpers(f"console.log(JSON.stringify(scoreBars({json.dumps(preds)}, 'mean_loglik')))")
    assert [b["width"] for b in bars[:3]] == pytest.approx([1.0, 1 - 16.5 / 28.0, 0.0])
    assert [b["text"] for b in bars] == ["0 (best)", "\u221216.500", "\u221228.000", "\u2013"]
    assert bars[1]["title"] == "mean log-likelihood -28.850" and bars[3]["width"] == 0
    same = _helpers("console.log(JSON.stringify(scoreBars([{label: 'a', score: -3}], 'mean_loglik')))")
    assert same == [{"width": 1, "text": "0 (best)", "title": "mean log-likelihood -3.000"}]


def test_probabilities_are_bars_of_their_value():
    preds = [{"label": "a", "score": 0.7}, {"label": "b", "score": 0.25}, {"label": "c", "score": None}]
    bars = _helpers(f"console.log(JSON.stringify(scoreBars({json.dumps(preds)}, 'probability')))")
    assert [b["width"] for b in bars] == [0.7, 0.25, 0]
    assert [b["text"] for b in bars] == ["0.700", "0.250", "\u2013"]
