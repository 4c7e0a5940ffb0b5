"""Device groups with simulated unequal devices: how close a group gets to the ideal speed-up,
and how the throughput and finite-difference rules settle.

A simulated device is a CPU replica that sleeps a fixed time per row after its compute (the
sleeps run in parallel like separate devices; the compute itself is kept small: a cnn on
20 x 12 inputs). For each case, 60 steps of batches of 64 with each rule, after 10 warm-up steps:

* ``3:1`` — one device three times slower than the other (per-row delays 4 ms and 12 ms);
* ``3:1, slowed`` — the same, the fast device slowed 2x at step 30 (the optimum moves);
* ``1:1:2`` — three devices;
* ``overhead`` — a GPU-like device ten times faster per row (0.4 ms) but with a fixed 150 ms per
  step, next to a 4 ms-per-row device: the throughput rule (its per-device line ``a + b·n``)
  against the pure-rate rule (``rate``: shares in proportion to rows per second).

The GMM's E-step on several devices: the time of one E-step over the same frames on ``cpu``,
``cpu,cpu``, ``cpu-torch`` (the torch E-step on torch's CPU device) and ``cpu,cpu-torch``, with
the blocks each device took.

Reported: steps per second of the group against the fastest device alone, the ideal speed-up
Σr/max r, their ratio (target ≥ 0.9), the first device's share (mean and variance once settled),
and steps to settle within 0.02 of the optimum. The input stall of a whole training run with a
device group is in its history (``data_wait_fraction``). Writes ``benchmarks/results/devices.json``.

    .venv/bin/python benchmarks/bench_devices.py [--steps 60] [--frames 400000] [--quick]
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


def _group(delays, rule, overheads=None):
    import torch

    from wavetrain.models.cnn import build_cnn
    from wavetrain.train.device_group import DeviceGroup, ThroughputBalancer, make_balancer

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    balancer = ThroughputBalancer(len(delays), linear=False) if rule == "rate" else make_balancer(rule, len(delays))
    return DeviceGroup(build_cnn(12, 20, 3, dropout=0.0), [cpu] * len(delays), balancer, delays=delays,
                       overheads=overheads, optimizer="sgd", lr=0.01)


def _run(delays, rule, steps, slow_at=None, overheads=None):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, 1, 20, 12)).astype(np.float32)
    y = rng.integers(0, 3, B)
    g = _group(list(delays), rule, overheads)
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


def overhead_case(steps, per_row=(0.004, 0.0004), overhead=0.15):
    """Rows to the first device that equalise the sleeps ``per_row[0]·n0 = overhead + per_row[1]·n1``,
    and how each rule's split and step time compare."""
    x_star = (overhead + per_row[1] * B) / (per_row[0] + per_row[1]) / B
    out = {"case": "overhead", "delays_ms_per_row": [d * 1000 for d in per_row], "overhead_ms": [0, overhead * 1000],
           "equal_sleep_first_share": round(x_star, 4)}
    for rule in ("throughput", "rate"):
        shares, times = _run(list(per_row), rule, steps, overheads=[0.0, overhead])
        out[rule] = {"shares_first_8": [round(float(v), 3) for v in shares[:8]],
                     "share_mean": round(float(shares[10:].mean()), 4), "share_var": float(shares[10:].var()),
                     "group_step_s_first_10": round(float(times[:10].mean()), 4),
                     "group_step_s": round(float(times[10:].mean()), 4)}
    return out


def gmm_estep(frames, d=39, k=8, reps=3):
    """Seconds of one E-step over ``frames`` frames (in blocks of 2,048 [x, x²] rows, as the GMM
    keeps them in memory) on each device list, the best of ``reps``."""
    from wavetrain.models.estep_devices import EStepPool
    from wavetrain.models.mixture import Workspace, e_step, gauss_terms

    rng = np.random.default_rng(0)
    x = rng.standard_normal((frames, d))
    blocks = [np.hstack([b, b * b]) for b in np.array_split(x, max(1, frames // 2048))]
    theta = (np.full(k, 1.0 / k), rng.standard_normal((k, d)), np.ones((k, d)))
    ws, best = Workspace(k, d), np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        want = e_step(theta, blocks, ws)
        best = min(best, time.perf_counter() - t0)
    rows = [{"devices": "cpu (one device: no pool, no thread)", "seconds": round(best, 4)}]
    for devices in (["cpu", "cpu"], ["cpu-torch"], ["cpu", "cpu-torch"]):
        pool = EStepPool(devices, k, d)
        best = np.inf
        for _ in range(reps):
            pool.blocks = [0] * len(devices)
            t0 = time.perf_counter()
            st = pool.e_step(gauss_terms(*theta), blocks)
            best = min(best, time.perf_counter() - t0)
        pool.close()
        rows.append({"devices": ",".join(devices), "seconds": round(best, 4), "blocks": list(pool.blocks),
                     "max_rel_diff": float(np.abs(st.s - want.s).max() / np.abs(want.s).max())})
    return {"frames": frames, "features": d, "components": k, "blocks": len(blocks), "passes": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "devices.json")
    ap.add_argument("--frames", type=int, default=400_000, help="frames of the GMM E-step comparison")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if _util.quick_mode(args.quick):
        args.steps, args.frames, args.out = 24, 40_000, _util.quick_out(args.out, "devices")
    import torch

    torch.set_num_threads(1)
    d = BASE_DELAY
    cases = [case("3:1", [d, 3 * d], args.steps), case("3:1, slowed", [d, 3 * d], args.steps, slow_at=args.steps // 2),
             case("1:1:2", [d, d, 2 * d], args.steps), overhead_case(args.steps)]
    for c in cases:
        print(c, flush=True)
    gmm = gmm_estep(args.frames)
    print(gmm, flush=True)
    _util.write_json(args.out, {"benchmark": "devices", "machine": _util.machine_info(), "loadavg": _util.loadavg(),
                                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "batch": B,
                                "steps": args.steps, "cases": cases, "gmm_estep": gmm})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
