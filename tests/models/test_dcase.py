"""dcase-specific behaviour; the shared contract is tests/models/test_contract.py."""
import numpy as np

from wavetrain.models import build, load_model, save_model
from wavetrain.train.array_stream import synthetic_stream

TINY = dict(epochs=2, batch_size=8, frames=12, valid_fraction=0.25, seed=1)


def test_defaults():
    m = build("dcase")
    assert m.params["features"] == "logmel(bands=128)" and m.params["dropout"] == 0.5


def test_batch_norm_statistics_are_saved(tmp_path):
    stream = synthetic_stream(48, 3, features=16)
    fitted = build("dcase", TINY).fit(stream)
    assert any("running_mean" in k for k in fitted.state_dict())
    again = load_model(save_model(fitted, tmp_path / "d.wt"))
    np.testing.assert_allclose(again.predict_proba(stream.grams), fitted.predict_proba(stream.grams),
                               rtol=1e-6, atol=1e-7)
