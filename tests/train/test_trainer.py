"""Training loop: validation triggers, stopping rules, best weights, checkpoint/resume."""
import numpy as np
import pytest

from wavetrain.models import FitOptions, build
from wavetrain.train import HaltAfter
from wavetrain.train.array_stream import synthetic_stream
from wavetrain.train.checkpoint import checkpoint_path, load_checkpoint

BASE = dict(batch_size=8, frames=10, valid_fraction=0.25, seed=5)


@pytest.fixture(scope="module")
def stream():
    return synthetic_stream(48, 3, features=12, frames=(6, 12))


def test_valid_every_n_iterations(stream):
    m = build("cnn", dict(BASE, epochs=50, max_iters=10, valid_every_iters=3)).fit(stream)
    assert [h["iteration"] for h in m.history_] == [3, 6, 9, 10]
    assert "maximum iterations" in m.train_info_["stop_reason"]
    assert m.train_info_["iterations"] == 10


def test_valid_every_epoch_and_max_epochs(stream):
    m = build("cnn", dict(BASE, epochs=2)).fit(stream)
    assert [h["epoch"] for h in m.history_] == [1.0, 2.0]
    assert "maximum epochs" in m.train_info_["stop_reason"]


def test_target_score_stops(stream):
    m = build("cnn", dict(BASE, epochs=20, target_score=0.0)).fit(stream)
    assert len(m.history_) == 1 and "target score" in m.train_info_["stop_reason"]


def test_min_loss_stops(stream):
    m = build("cnn", dict(BASE, epochs=20, min_loss=50.0)).fit(stream)
    assert len(m.history_) == 1 and "minimum loss" in m.train_info_["stop_reason"]


def test_patience_stops_and_keeps_best_weights(stream):
    train, valid = stream.split_validation(0.3, seed=0)
    # a high rate makes the validation loss wander, so patience has something to do
    m = build("cnn", dict(BASE, epochs=15, lr=0.03, schedule="constant", patience=2, valid_every_iters=2)).fit(
        train, valid)
    losses = [h["valid_loss"] for h in m.history_]
    p = m.predict_proba(valid.grams)
    final = float(-np.log(p[np.arange(len(valid)), valid.y]).mean())
    assert final == pytest.approx(min(losses), rel=1e-5)
    if "no improvement" in m.train_info_["stop_reason"]:
        best = int(np.argmin(losses))
        assert len(losses) - 1 - best >= 2


def test_no_validation_keeps_last_weights(stream):
    m = build("cnn", dict(BASE, epochs=2, valid_fraction=0.0)).fit(stream)
    assert all(h["valid_loss"] is None and h["train_loss"] is not None for h in m.history_)


@pytest.mark.parametrize("family,opts", [("cnn", dict(optimizer="adam", schedule="cosine")),
                                         ("dcase", dict(optimizer="sgd", schedule="plateau", lr=0.05))])
def test_resume_after_kill_gives_same_weights(stream, tmp_path, family, opts):
    params = dict(BASE, epochs=3, valid_every_iters=3, **opts)
    full = build(family, params).fit(stream)
    ck = tmp_path / "ck"
    halted = build(family, params).fit(stream, options=FitOptions(checkpoint=str(ck), callbacks=(HaltAfter(8),)))
    assert halted.train_info_["halted"]
    state = load_checkpoint(ck)
    assert state["iteration"] == 6 and state["it_in_epoch"] == 1  # mid-epoch: 5 batches per epoch
    resumed = build(family, params).fit(stream, options=FitOptions(checkpoint=str(ck), resume=str(ck)))
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert [h["iteration"] for h in resumed.history_] == [h["iteration"] for h in full.history_]
    assert [h["valid_loss"] for h in resumed.history_] == [h["valid_loss"] for h in full.history_]
    assert load_checkpoint(ck)["iteration"] == full.train_info_["iterations"]


def test_resume_without_checkpoint_starts_fresh(stream, tmp_path):
    a = build("cnn", dict(BASE, epochs=1)).fit(stream, options=FitOptions(resume=str(tmp_path / "none")))
    b = build("cnn", dict(BASE, epochs=1)).fit(stream)
    np.testing.assert_array_equal(a.state_dict()["net.0.weight"], b.state_dict()["net.0.weight"])


def test_checkpoint_written_atomically_and_loads_without_pickle(stream, tmp_path):
    build("cnn", dict(BASE, epochs=1)).fit(stream, options=FitOptions(checkpoint=str(tmp_path)))
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_path(tmp_path).name]
    import torch

    torch.load(checkpoint_path(tmp_path), weights_only=True)


def test_corrupt_checkpoint_is_a_user_error(tmp_path):
    from wavetrain.core.errors import ModelFileError

    checkpoint_path(tmp_path).write_bytes(b"not a checkpoint")
    with pytest.raises(ModelFileError, match="checkpoint"):
        load_checkpoint(tmp_path)


def test_device_option(stream):
    import torch

    from wavetrain.core.errors import ParameterError

    m = build("cnn", dict(BASE, epochs=1)).fit(stream, options=FitOptions(device="cpu"))
    assert m.train_info_["device"] == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="device"):
            build("cnn", dict(BASE, epochs=1, device="cuda")).fit(stream)


def test_progress_bar_runs(stream, monkeypatch, capsys):
    monkeypatch.setenv("WAVETRAIN_PROGRESS", "1")
    build("cnn", dict(BASE, epochs=1)).fit(stream, options=FitOptions(progress=True))
    assert "train" in capsys.readouterr().err


def test_a_callback_keeps_its_state_across_a_resume(stream, tmp_path):
    """A callback's state_dict goes into the checkpoint and comes back when the run resumes."""
    from wavetrain.train import Callback

    class StepCounter(Callback):
        def __init__(self):
            self.steps = 0
            self.restored = None

        def on_step(self, loop, loss, n):
            self.steps += 1

        def state_dict(self):
            return {"step_counter": self.steps}

        def load_state_dict(self, state):
            self.restored = state["step_counter"]
            self.steps = self.restored

    params = dict(BASE, epochs=3, valid_every_iters=2)
    first = StepCounter()
    build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(tmp_path), callbacks=(first, HaltAfter(7))))
    assert first.steps == 7
    again = StepCounter()
    m = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(tmp_path), resume=str(tmp_path),
                                                            callbacks=(again,)))
    assert again.restored == 6                     # the last checkpoint: the validation at step 6
    assert again.steps == m.train_info_["iterations"]
