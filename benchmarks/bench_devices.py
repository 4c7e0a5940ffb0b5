"""Device groups with simulated unequal devices: how close a group gets to the ideal speed-up,
and how the throughput and finite-difference rules settle.

A simulated device is a CPU replica that sleeps a fixed time per row after its compute (the
sleeps run in parallel like separate devices; the compute itself is kept small: a cnn on
20 x 12 inputs). For each case, 60 steps of batches of 64 with each rule, after 10 warm-up steps:

* ``3:1`` — one device three times slower than the other (per-row delays 4 ms and 12 ms);
* ``3:1, slowed`` — the same, the fast device slowed 2x at step 30 (the optimum moves);
* ``1:1:2`` — three devices.

Reported: steps per second of the group against the fastest device alone, the ideal speed-up
Σr/max r, their ratio (target ≥ 0.9), the first device's share (mean and variance once settled),
and steps to settle within 0.02 of the optimum. The input stall of a whole training run with a
device group is in its history (``data_wait_fraction``). Writes ``benchmarks/results/devices.json``.

    .venv/bin/python benchmarks/bench_devices.py [--steps 60] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

B = 64
BASE_DELAY = 0.004      # seconds per row of the fastest device (its compute: well under 1 ms per row)


def _group(delays, rule):
    import torch

    from wavetrain.models.cnn import build_cnn
    from wavetrain.train.device_group import DeviceGroup, make_balancer

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    return DeviceGroup(build_cnn(12, 20, 3, dropout=0.0), [cpu] * len(delays), make_balancer(rule, len(delays)),
                       delays=delays, optimizer="sgd", lr=0.01)


def _run(delays, rule, steps, slow_at=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, 1, 20, 12)).astype(np.float32)
    y = rng.integers(0, 3, B)
    g = _group(list(delays), rule)
    shares, times = [], []
    for i in range(steps):
        if slow_at is not None and i == slow_at:
            g.replicas[0].delay_per_row *= 2
        t0 = time.perf_counter()
        g.step(x, y)
        times.append(time.perf_counter() - t0)
        shares.append(g.split(B)[0] / B)
    return np.array(shares), np.array(times)


def _optimum(delays):
    r = 1.0 / np.asarray(delays)
    return float(r[0] / r.sum()), float(r.sum() / r.max())


def case(name, delays, steps, slow_at=None):
    single = _run([min(delays)], "fixed:1", max(10, steps // 3))[1][3:].mean()
    out = {"case": name, "delays_ms_per_row": [d * 1000 for d in delays], "single_fastest_step_s": round(single, 4)}
    x_star, ideal = _optimum(delays)
    for rule in ("throughput", "gradient") if len(delays) == 2 else ("throughput",):
        shares, times = _run(delays, rule, steps, slow_at)
        settled = shares[10:slow_at] if slow_at else shares[10:]
        within = np.flatnonzero(np.abs(shares - x_star) <= 0.02)
        res = {"share_mean": round(float(settled.mean()), 4), "share_var": float(settled.var()),
               "steps_to_settle": int(within[0]) + 1 if within.size else None,
               "group_step_s": round(float(times[10:slow_at].mean() if slow_at else times[10:].mean()), 4)}
        res["speedup"] = round(single / res["group_step_s"], 3)
        res["ideal_speedup"] = round(ideal, 3)
        res["fraction_of_ideal"] = round(res["speedup"] / ideal, 3)
        if slow_at:
            slowed = [delays[0] * 2] + list(delays[1:])
            x2, _ = _optimum(slowed)
            after = np.flatnonzero(np.abs(shares[slow_at:] - x2) <= 0.02)
            res["steps_to_resettle"] = int(after[0]) + 1 if after.size else None
            res["share_var_after"] = float(shares[slow_at + 10:].var()) if steps > slow_at + 10 else None
        out[rule] = res
    out["optimal_first_share"] = round(x_star, 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "devices.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if _util.quick_mode(args.quick):
        args.steps, args.out = 24, _util.quick_out(args.out, "devices")
    import torch

    torch.set_num_threads(1)
    d = BASE_DELAY
    cases = [case("3:1", [d, 3 * d], args.steps), case("3:1, slowed", [d, 3 * d], args.steps, slow_at=args.steps // 2),
             case("1:1:2", [d, d, 2 * d], args.steps)]
    for c in cases:
        print(c, flush=True)
    _util.write_json(args.out, {"benchmark": "devices", "machine": _util.machine_info(), "loadavg": _util.loadavg(),
                                "date": time.strftime("%Y-%m-%d"), "batch": B, "steps": args.steps, "cases": cases})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
