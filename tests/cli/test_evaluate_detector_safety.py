"""``evaluate -m detector.wt``: the detector's own normal value (recorded in the model file) is
the default, so a set of anomalies alone is counted as anomalous."""
import json
import os

import pytest

from wavetrain.cli.main import main

MACHINES = "/work/shared/data/machines"
FAN_U1 = ["--data", MACHINES, "--where", "machine=fan", "--where", "unit=u1"]
pytestmark = pytest.mark.skipif(not os.path.isdir(MACHINES), reason="needs the machines data set")


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    path = tmp_path_factory.mktemp("det") / "fan.wt"
    assert main(["train", *FAN_U1, "--where", "split=train", "--label", "state", "--model", "normal-dist",
                 "--no-cache", "-o", str(path)]) == 0
    return path


def _evaluate(detector, capsys, *more):
    assert main(["evaluate", "-m", str(detector), *FAN_U1, "--where", "split=test", "--label", "state",
                 "--no-cache", "--json", *more]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_anomalies_alone_are_anomalous(detector, capsys):
    res, err = _evaluate(detector, capsys, "--where", "state=anomaly")
    assert res["normal_value"] == "normal"
    assert (res["normal"], res["anomalous"]) == (0, 20)
    assert res["fp"] == 0 and res["tp"] + res["fn"] == 20
    assert "state=normal is normal" in err


def test_normal_alone_and_explicit_normal(detector, capsys):
    res, _ = _evaluate(detector, capsys, "--where", "state=normal")
    assert (res["normal"], res["anomalous"]) == (20, 0)
    res, _ = _evaluate(detector, capsys, "--where", "state=anomaly", "--normal", "normal")
    assert (res["normal"], res["anomalous"]) == (0, 20)
    res, _ = _evaluate(detector, capsys)
    assert (res["normal"], res["anomalous"]) == (20, 20) and res["normal_value"] == "normal"


def test_a_normal_value_that_is_neither_there_nor_the_detectors_is_refused(detector, capsys):
    assert main(["evaluate", "-m", str(detector), *FAN_U1, "--where", "split=test", "--label", "state",
                 "--no-cache", "--normal", "healthy"]) == 2
    assert "--normal healthy: no recording has state=healthy" in capsys.readouterr().err
