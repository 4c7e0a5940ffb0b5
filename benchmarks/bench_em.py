"""Streaming EM vs scikit-learn's GaussianMixture: seconds per EM pass on the same frames,
and the final mean log-likelihood of each. Writes benchmarks/results/em.json."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import wavetrain  # noqa: F401  (single-thread defaults before numpy loads)


def main() -> int:
    from sklearn.mixture import GaussianMixture

    from wavetrain.models.gmm import GMMClassifier
    from wavetrain.models.mixture import frame_loglik
    from wavetrain.train.array_stream import ArrayStream

    quick = "--quick" in sys.argv or os.environ.get("WAVETRAIN_BENCH_QUICK")
    n_frames, d, k = (50_000 if quick else 400_000), 39, 8
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, (k, d))
    x = (centres[rng.integers(0, k, n_frames)] + rng.normal(0, 1, (n_frames, d))).astype(np.float32)
    grams = np.split(x, n_frames // 100)  # windows of 100 frames, as a stream would deliver them
    out = {"frames": n_frames, "dims": d, "components": k, "loadavg": os.getloadavg()}

    iters = 20
    sk = GaussianMixture(k, covariance_type="diag", reg_covar=1e-4, max_iter=iters, tol=0, random_state=0)
    t = time.perf_counter()
    sk.fit(x.astype(np.float64))
    sk_s = time.perf_counter() - t
    out["sklearn"] = {"seconds": sk_s, "iterations": int(sk.n_iter_), "s_per_pass": sk_s / sk.n_iter_,
                      "mean_loglik": float(sk.score(x))}

    # one label's mixture = our per-label EM; a second tiny label satisfies the classifier contract
    extra = [rng.normal(0, 1, (100, d)).astype(np.float32) for _ in range(k)]
    stream = ArrayStream(list(grams) + extra, [0] * len(grams) + [1] * len(extra), ["a", "b"], batch_size=64)
    m = GMMClassifier(components=k, max_iter=iters, tol=0, reg=1e-4, features="logmel(bands=39)")
    t = time.perf_counter()
    m.fit(stream)
    ours_s = time.perf_counter() - t
    passes = len(m.history_)
    ll, _ = frame_loglik(x.astype(np.float64), m.weights_[0], m.means_[0], m.variances_[0])
    out["wavetrain"] = {"seconds": ours_s, "iterations": passes, "s_per_pass": ours_s / (passes + 2),
                        "mean_loglik": float(ll.mean()),
                        "note": "seconds include the reservoir pass, k-means++ init and the final scoring pass; "
                                "s_per_pass divides by iterations + 2"}
    out["speed_ratio_per_pass"] = out["sklearn"]["s_per_pass"] / out["wavetrain"]["s_per_pass"]
    out["loglik_rel_diff"] = abs(out["wavetrain"]["mean_loglik"] - out["sklearn"]["mean_loglik"]) / abs(
        out["sklearn"]["mean_loglik"])
    res = Path(__file__).parent / "results"
    res.mkdir(exist_ok=True)
    (res / "em.json").write_text(json.dumps(out, indent=2))
    print(f"| EM on {n_frames} frames x {d} dims, {k} components | s per pass | mean log-lik |")
    print("|---|---:|---:|")
    for name in ("wavetrain", "sklearn"):
        print(f"| {name} | {out[name]['s_per_pass']:.3f} | {out[name]['mean_loglik']:.4f} |")
    print(f"\nwavetrain is {out['speed_ratio_per_pass']:.2f}x sklearn per pass; log-likelihoods differ by "
          f"{100 * out['loglik_rel_diff']:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
