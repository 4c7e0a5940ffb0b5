"""``wavetrain evaluate``'s progress (bars and a line per fold) goes to stderr whatever stdout's
format: with ``--json`` stdout is one JSON object and nothing else."""
import json

import pytest

from wavetrain.cli.main import main

GMM = ("--model", "gmm", "--set", "components=2", "--set", "max_iter=5")


def _evaluate(capsys, demo_csv, *extra):
    code = main(["evaluate", "--data", str(demo_csv), "--label", "state", *GMM, "--folds", "2", "--no-cache",
                 *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


@pytest.mark.parametrize("repeat", [1, 2])
def test_json_keeps_progress_on_stderr(capsys, demo_csv, monkeypatch, repeat):
    monkeypatch.setenv("WAVETRAIN_PROGRESS", "1")
    out, err = _evaluate(capsys, demo_csv, "--json", "--repeat", str(repeat))
    assert len(out.strip().splitlines()) == 1
    res = json.loads(out)
    assert res["model"] == "gmm" and len(res["folds"]) == 2
    assert "gmm EM" in err and "features" in err                    # the bars
    fold = "repeat 1/2 fold 1/2: accuracy " if repeat > 1 else "fold 1/2: accuracy "
    assert fold in err and "fold 2/2: accuracy " in err              # a line per fold
    assert "{" not in err


def test_json_progress_follows_the_same_rule_as_text(capsys, demo_csv, monkeypatch):
    """--no-progress (or stderr that is no terminal) drops the bars, with --json as without; the
    lines per fold stay, as they do for text."""
    monkeypatch.setenv("WAVETRAIN_PROGRESS", "1")
    outs = {}
    for fmt in ((), ("--json",)):
        out, err = _evaluate(capsys, demo_csv, "--no-progress", *fmt)
        assert "gmm EM" not in err and "fold 1/2: accuracy " in err
        outs[fmt] = (out, err)
    assert json.loads(outs[("--json",)][0])["accuracy"] == pytest.approx(
        float(outs[()][0].split()[1]), abs=5e-5)
    monkeypatch.delenv("WAVETRAIN_PROGRESS")                        # stderr is captured: no terminal
    _, err = _evaluate(capsys, demo_csv, "--json")
    assert "gmm EM" not in err and "fold 2/2: accuracy " in err
