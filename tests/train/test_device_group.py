"""The device group: the throughput rule's convergence (against the finite-difference rule on the
same cases), rows that add up, the aggregated gradient equal to one device's, and training on
two CPU replicas end to end."""
import numpy as np
import pytest

from wavetrain.core.errors import ParameterError
from wavetrain.train.device_group import (
    DeviceGroup,
    FixedBalancer,
    GradientBalancer,
    ThroughputBalancer,
    make_balancer,
    split_rows,
)

torch = pytest.importorskip("torch")

B = 64


def _simulate(balancer, cost_per_row, steps, *, overhead=None, slow_at=None, slow_factor=2.0, noise=0.0, seed=0):
    """Run ``steps`` steps of a balancer on devices whose compute time is ``overhead + cost * rows``
    (the first device's cost ``slow_factor`` times higher from step ``slow_at``); the first
    device's share after each step."""
    rng = np.random.default_rng(seed)
    costs = np.array(cost_per_row, dtype=float)
    fixed = np.zeros(len(costs)) if overhead is None else np.array(overhead, dtype=float)
    shares = []
    for i in range(steps):
        if slow_at is not None and i == slow_at:
            costs[0] *= slow_factor
        rows = split_rows(B, balancer.fractions())
        seconds = [(a + r * c) * (1 + noise * rng.standard_normal()) for r, c, a in zip(rows, costs, fixed)]
        balancer.observe(rows, seconds)
        shares.append(split_rows(B, balancer.fractions())[0] / B)
    return np.array(shares)


def test_rows_add_up_and_keep_a_minimum():
    assert split_rows(64, [0.75, 0.25]) == [48, 16]
    assert split_rows(10, [0.999, 0.001]) == [9, 1]          # every device keeps a row
    assert sum(split_rows(97, [0.2, 0.3, 0.5])) == 97
    assert split_rows(3, [1, 1, 1, 1]) == [1, 1, 1, 0]


def test_the_throughput_rule_finds_a_3_to_1_split_within_5_steps_and_a_slowdown_within_10():
    shares = _simulate(ThroughputBalancer(2), [1.0, 3.0], 30, slow_at=15)
    assert np.all(np.abs(shares[4:15] - 0.75) <= 0.02)
    x_star = (1 / 2) / (1 / 2 + 1 / 3)                      # the first device now 2x slower
    assert np.all(np.abs(shares[15 + 9:] - x_star) <= 0.02)
    assert shares[20:].var() <= 1e-4                         # no sustained oscillation


def test_the_throughput_rule_holds_steady_under_timing_noise():
    shares = _simulate(ThroughputBalancer(2), [1.0, 3.0], 40, noise=0.03)
    assert abs(shares[10:].mean() - 0.75) <= 0.02 and shares[10:].var() <= 1e-4


#: A GPU-like device: ten times faster per row than the CPU but with a fixed cost per step of 50
#: CPU rows; equal times need 0 + 1·n0 = 50 + 0.1·(64 − n0).
OVERHEAD_CASE = dict(cost_per_row=[1.0, 0.1], overhead=[0.0, 50.0])
X_OVERHEAD = (50 + 0.1 * B) / 1.1 / B


def test_with_a_large_fixed_overhead_the_linear_model_equalises_times_and_the_pure_rate_does_not():
    linear = _simulate(ThroughputBalancer(2), steps=20, **OVERHEAD_CASE)
    rate = _simulate(ThroughputBalancer(2, linear=False), steps=20, **OVERHEAD_CASE)
    assert np.all(np.abs(linear[2:] - X_OVERHEAD) <= 0.02)          # from the third step on
    assert linear[2:].var() <= 1e-4
    assert np.all(np.abs(rate[:10] - X_OVERHEAD) > 0.02)             # still off after 10 steps
    rows = split_rows(B, [X_OVERHEAD, 1 - X_OVERHEAD])
    t0, t1 = rows[0] * 1.0, 50 + rows[1] * 0.1
    assert abs(t0 - t1) / t0 < 0.03                                  # the times it settles on are equal


def test_the_linear_model_holds_under_noise_and_follows_a_slowdown_with_an_overhead():
    shares = _simulate(ThroughputBalancer(2), steps=40, noise=0.03, **OVERHEAD_CASE)
    assert abs(shares[5:].mean() - X_OVERHEAD) <= 0.03
    slowed = _simulate(ThroughputBalancer(2), steps=30, slow_at=15, **OVERHEAD_CASE)
    x2 = (50 + 0.1 * B) / 2.1 / B                                    # the CPU's cost per row doubled
    assert np.all(np.abs(slowed[15 + 5:] - x2) <= 0.02)


def test_the_balancer_state_resumes_the_same_shares():
    a = ThroughputBalancer(2)
    _simulate(a, steps=6, **OVERHEAD_CASE)
    b = ThroughputBalancer(2)
    b.restore(a.state())
    assert b.fractions() == a.fractions() and b.overhead == a.overhead
    np.testing.assert_array_equal(_simulate(b, steps=5, **OVERHEAD_CASE), _simulate(a, steps=5, **OVERHEAD_CASE))
    old = ThroughputBalancer(2)
    old.restore({"rate": [30.0, 10.0]})                              # a checkpoint from before the model
    assert old.fractions(64) == pytest.approx([0.75, 0.25])


def test_the_finite_difference_rule_is_slower_and_oscillates_on_the_same_case():
    fd = _simulate(GradientBalancer(2), [1.0, 3.0], 30, noise=0.03)
    tp = _simulate(ThroughputBalancer(2), [1.0, 3.0], 30, noise=0.03)
    assert np.abs(tp[4:] - 0.75).max() < np.abs(fd[4:] - 0.75).max()
    assert fd[10:].var() > tp[10:].var()


def test_balance_specs():
    assert isinstance(make_balancer("throughput", 3), ThroughputBalancer)
    assert isinstance(make_balancer("fixed:0.3,0.7", 2), FixedBalancer)
    assert make_balancer("fixed:1,3", 2).fractions() == [0.25, 0.75]
    for bad, n in (("fixed:0.3", 2), ("gradient", 3), ("fast", 2), ("fixed:a,b", 2)):
        with pytest.raises(ParameterError):
            make_balancer(bad, n)


def _net():
    from wavetrain.models.cnn import build_cnn

    torch.manual_seed(0)
    return build_cnn(12, 20, 3, dropout=0.0)


def test_the_aggregated_gradient_equals_the_single_device_gradient():
    from wavetrain.train.steps import SingleDevice

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 1, 20, 12)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    cpu = torch.device("cpu")
    one = SingleDevice(_net(), cpu, optimizer="sgd", lr=0.1, momentum=0.0)
    group = DeviceGroup(_net(), [cpu, cpu, cpu], FixedBalancer([5, 3, 8]), optimizer="sgd", lr=0.1, momentum=0.0)
    for _ in range(3):
        l1, l2 = one.step(x, y), group.step(x, y)
        assert l2 == pytest.approx(l1, rel=1e-5)
    for (name, a), b in zip(one.net.state_dict().items(), group.net.state_dict().values()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    for rep in group.replicas[1:]:                           # every replica holds the new weights
        for a, b in zip(group.net.parameters(), rep.net.parameters()):
            assert torch.equal(a, b)


def test_a_simulated_slow_device_gets_a_smaller_share():
    cpu = torch.device("cpu")
    group = DeviceGroup(_net(), [cpu, cpu], ThroughputBalancer(2), delays=[0.0, 0.004], optimizer="sgd", lr=0.01)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 1, 20, 12)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    for _ in range(8):
        group.step(x, y)
    report = group.report()
    assert report["device_shares"][0] > 0.6 and len(report["device_seconds"]) == 2
    assert group.report() == {}                              # since the last report
    state = group.state_dict()
    fresh = DeviceGroup(_net(), [cpu, cpu], ThroughputBalancer(2), optimizer="sgd", lr=0.01)
    fresh.load_state_dict(state)                             # a resumed run keeps its shares
    assert fresh.split(32) == group.split(32)


def test_training_on_two_cpu_replicas_records_the_shares(demo_csv):
    from wavetrain.data import load_dataset
    from wavetrain.models.base import FitOptions
    from wavetrain.models.registry import build
    from wavetrain.pipeline.jobs import RunOptions, make_stream

    ds = load_dataset([demo_csv]).labelled("state")
    model = build("cnn", {"features": "logmel(bands=16)", "epochs": "2", "batch_size": "8", "valid_fraction": "0.25"})
    stream = make_stream(ds, model, RunOptions(), label="state")
    model.fit(stream, options=FitOptions(devices=("cpu", "cpu")))
    assert model.train_info_["device"] == "cpu,cpu"
    shares = [h["device_shares"] for h in model.history_ if "device_shares" in h]
    assert shares and all(len(s) == 2 and abs(sum(s) - 1) < 1e-6 for s in shares)


def test_a_simulated_fixed_overhead_counts_in_the_measured_times_and_the_group_equalises_them():
    cpu = torch.device("cpu")
    group = DeviceGroup(_net(), [cpu, cpu], ThroughputBalancer(2), delays=[0.003, 0.0003], overheads=[0.0, 0.15],
                        optimizer="sgd", lr=0.01)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 1, 20, 12)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    for _ in range(8):
        group.step(x, y)
    seconds = np.array([s for _, s in group._log])
    assert np.all(seconds[:, 1] >= 0.15)                             # the overhead is in every step's time
    assert seconds[-2:].max(axis=1).sum() / seconds[-2:].min(axis=1).sum() <= 1.5
    assert group.split(64)[0] > 32                                   # the overhead moved rows to device 0
    group.close()


def test_rows_for_a_replica():
    from wavetrain.train.device_group import _to_replica

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = _to_replica(a, torch.device("cpu"))
    assert t.device.type == "cpu" and np.shares_memory(t.numpy(), a)     # a CPU replica: no copy
    if torch.cuda.is_available():
        g = _to_replica(a, torch.device("cuda:0"))
        assert g.device.type == "cuda" and torch.equal(g.cpu(), torch.from_numpy(a))


def test_the_history_plot_shows_the_split(tmp_path):
    from wavetrain.train.history_plot import build_history_figure

    history = [{"epoch": float(e), "iteration": e * 4, "train_loss": 1.0 / e, "valid_loss": None,
                "device_shares": [0.7, 0.3], "device_seconds": [0.01, 0.01]} for e in (1, 2, 3)]
    fig = build_history_figure(history)
    assert [ax.get_label() for ax in fig.axes] == ["loss", "shares"]
    assert [line.get_ydata()[0] for line in fig.axes[1].lines] == [0.7, 0.3]


@pytest.mark.parametrize("argv, message", [
    (("--model", "cnn", "--devices", "cpu,tpu"), "expected one of cpu, cuda or cuda:N"),
    (("--model", "cnn", "--devices", "cpu,cpu", "--balance", "fixed:1"), "expected 2 comma-separated fractions"),
    (("--model", "cnn", "--devices", "cpu,cpu", "--balance", "fastest"), "expected throughput, gradient or fixed"),
    (("--model", "cnn", "--devices", "cpu,cpu", "--engine", "spark"), "--engine spark does not train on one"),
    (("--model", "knn", "--devices", "cpu,cpu"), "--devices: knn trains on one device"),
    (("--model", "autoencoder", "--devices", "cpu,cpu"), "--devices: autoencoder trains on one device"),
])
def test_wrong_device_groups_are_one_line(demo_csv, tmp_path, capsys, argv, message):
    from wavetrain.cli.main import main

    code = main(["train", "--data", str(demo_csv), "--label", "state", "-o", str(tmp_path / "m.wt"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_killed_device_group_run_resumes_to_the_same_weights_and_shares(tmp_path):
    from wavetrain.models import FitOptions, build
    from wavetrain.train import HaltAfter
    from wavetrain.train.array_stream import synthetic_stream
    from wavetrain.train.checkpoint import load_checkpoint

    stream = synthetic_stream(48, 3, features=12, frames=(6, 12))
    params = dict(batch_size=8, frames=10, valid_fraction=0.25, seed=5, epochs=3, valid_every_iters=3,
                  dropout=0.0, optimizer="sgd", lr=0.05)
    group = {"devices": ("cpu", "cpu"), "balance": "fixed:0.25,0.75"}    # fixed shares: exact sums
    full = build("cnn", params).fit(stream, options=FitOptions(**group))
    ck = tmp_path / "ck"
    halted = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(ck), callbacks=(HaltAfter(8),),
                                                                 **group))
    assert halted.train_info_["halted"]
    resumed = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(ck), resume=str(ck), **group))
    for k, a in full.state_dict().items():
        np.testing.assert_allclose(resumed.state_dict()[k], a, rtol=1e-5, atol=1e-7, err_msg=k)
    assert [h["device_shares"] for h in resumed.history_] == [h["device_shares"] for h in full.history_]
    # the throughput rule's state travels in the checkpoint too
    tp = build("cnn", params).fit(stream, options=FitOptions(checkpoint=str(tmp_path / "tp"), devices=("cpu", "cpu"),
                                                             callbacks=(HaltAfter(8),)))
    assert tp.train_info_["halted"]
    rates = load_checkpoint(tmp_path / "tp")["balancer"]["rate"]
    assert len(rates) == 2 and all(r is not None and r > 0 for r in rates)


def test_averaging_every_h_steps_keeps_replicas_apart_between_averages_and_equal_after():
    cpu = torch.device("cpu")
    group = DeviceGroup(_net(), [cpu, cpu], FixedBalancer([1, 1]), sync="average:2", optimizer="sgd", lr=0.1,
                        momentum=0.0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 1, 20, 12)).astype(np.float32)
    y = rng.integers(0, 3, 16)

    def same() -> bool:
        return all(torch.equal(a, b) for a, b in zip(group.replicas[0].net.parameters(),
                                                     group.replicas[1].net.parameters()))

    losses = [group.step(x, y) for _ in range(2)]            # warm-up: gradients added, replicas equal
    assert same()
    losses.append(group.step(x, y))                          # step 3: each replica on its own rows
    assert not same()
    losses.append(group.step(x, y))                          # step 4: averaged
    assert same()
    group.step(x, y)
    read = group.weights()                                   # the average, the replicas left apart
    assert not same()
    group.close()                                            # the end: averaged
    assert same() and losses[-1] < losses[0]
    for k, v in group.net.state_dict().items():
        assert torch.equal(read[k], v), k


def test_sync_specs():
    from wavetrain.train.device_group import parse_sync

    assert parse_sync("allreduce") == 0 and parse_sync("average:4") == 4
    for bad in ("average", "average:0", "average:x", "mean:2"):
        with pytest.raises(ParameterError, match="expected allreduce or average:H"):
            parse_sync(bad)
