"""Anomaly detection for a fleet: every detector on ``machines-fleet`` scored as the DCASE task
scores it, beside two anchors written without wavetrain, and on the single-unit ``machines``.

Parts (``--parts``), each in fresh processes with one compute thread:

* **fleet**: one detector per machine type, trained on the normal ``split=train`` clips of all its
  sections and both domains, evaluated with ``wavetrain evaluate -m M --by --json`` on the type's
  ``split=test`` clips: the official score (harmonic mean of every section's AUC source, AUC
  target and pAUC), and the harmonic means over sections of AUC source, AUC target and pAUC.
  Recipes (:data:`RECIPES`): ``normal-dist``, ``anomaly-gmm``, ``knn-anomaly`` (defaults, and
  ``k=1``) and ``autoencoder``, each with its default features; and the embedding recipe: a
  ``cnn`` (:data:`NET`) trained on the type's training clips to tell its sections apart, then
  ``knn-anomaly`` (``subwindow_frames=1``) and ``normal-dist`` on ``embedding(model=that.wt)``.
  Every recipe with seeds 0, 1, 2 (``--set seed=S``: the seed draws the recordings held out to set
  the threshold, which are not learnt from, so it changes every family's model, besides the
  initialisation and data order of the mixtures and networks). Train wall time and peak RSS of each
  ``wavetrain train`` process (``/usr/bin/time -f %M``, the child's ``getrusage``).
* **anchors**: the same splits, two detectors written without wavetrain, in their own processes
  (train, then score): the DCASE 2020 task 2 baseline autoencoder in plain PyTorch
  (:func:`dcase2020_vectors`, :class:`Dcase2020Autoencoder`; the parameters of its
  ``baseline.yaml`` and ``keras_model.py``) and a scikit-learn ``GaussianMixture`` on librosa
  log-mel frames (the baseline of ``bench_anomaly.py``); their clip scores go through
  :func:`wavetrain.evaluation.dcase_scores.dcase_report`, the function ``evaluate --by`` uses.
* **heldout**: what can be measured on the training side alone. For each type and section, the
  detectors of :data:`HELDOUT_RECIPES` are trained on the *other* three sections' training clips and
  score the held-out section's training clips (50 source, 3 target, all normal):
  ``evaluate --label domain --normal source`` gives the false alarms at the stored threshold in
  each domain and the AUC of target against source clips (0.5: the domain shift moves no score).
  There are no anomalous training clips, so no setting can be chosen for detecting anomalies here:
  the defaults stay, and the test figures of ``k=1`` are reported, not chosen.
* **units**: ``machines`` (4 types x 3 units), per unit the same recipes trained on its normal
  training clips and evaluated on its test clips (ROC AUC, pAUC), the embedding network per type
  trained to tell its three units apart; and the two anchors. Seed 0 only (``--unit-seeds``).

    .venv/bin/python benchmarks/bench_fleet.py [--parts fleet anchors heldout units] [--seeds 0 1 2]
                                               [--machines fan ...] [--quick] [--tables]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): fan only, seed 0, three recipes
(:data:`QUICK_RECIPES`), one epoch for every network, one held-out section, unit u1 only; results
go to $TMPDIR/wavetrain-bench/. ``--tables`` prints the Markdown tables of the results file and
exits. Writes ``benchmarks/results/fleet.json`` (parts not run keep their figures); each part
records its command, date and load average.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
FLEET = SHARED / "machines-fleet"
UNITS_DATA = SHARED / "machines"
MACHINES = ("fan", "pump", "bearing", "gearbox")
SECTIONS = ("s00", "s01", "s02", "s03")
UNITS = ("u1", "u2", "u3")
SEEDS = (0, 1, 2)
#: The embedding network: a cnn told to tell a type's sections (or units) apart from 500 ms clips
#: every 250 ms. 10 epochs rather than the family's 30, so that the whole benchmark runs in about an
#: hour on two vCPUs (with 30 and patience 8 it stopped after about 16 epochs and took twice as long).
NET_EPOCHS = 10
NET = ["--model", "cnn", "--clip-ms", "500", "--clip-shift-ms", "250", "--set", "device=cpu"]
NETWORK_FAMILIES = ("autoencoder",)
#: The labels the recipes by group shift scores by.
GROUPS = "section,domain"


@dataclass(frozen=True)
class Recipe:
    """A detector as the benchmark trains it.

    Attributes
    ----------
    name : str
        Its name in the tables.
    family : str
        The wavetrain detector family.
    args : tuple of str
        More ``train`` arguments.
    embedding : bool
        Trained on ``embedding(model=NET.wt)`` features of the type's network.
    by_group : bool
        Scores by section and domain (``normalize_by=section,domain``): only where those labels exist.
    """

    name: str
    family: str
    args: tuple[str, ...] = ()
    embedding: bool = False
    by_group: bool = False


RECIPES = (
    Recipe("normal-dist", "normal-dist"),
    Recipe("anomaly-gmm", "anomaly-gmm"),
    Recipe("knn-anomaly", "knn-anomaly"),
    Recipe("knn-anomaly k=1", "knn-anomaly", ("--set", "k=1")),
    Recipe("autoencoder", "autoencoder", ("--set", "device=cpu")),
    Recipe("cnn embedding + knn-anomaly", "knn-anomaly", ("--set", "subwindow_frames=1"), embedding=True),
    Recipe("cnn embedding + normal-dist", "normal-dist", (), embedding=True),
    *(Recipe(f"{name} by section, domain", family, (*args, "--set", f"normalize_by={GROUPS}"), embedding=emb,
             by_group=True)
      for name, family, args, emb in (("normal-dist", "normal-dist", (), False),
                                      ("anomaly-gmm", "anomaly-gmm", (), False),
                                      ("knn-anomaly", "knn-anomaly", (), False),
                                      ("knn-anomaly k=1", "knn-anomaly", ("--set", "k=1"), False),
                                      ("cnn embedding + knn-anomaly", "knn-anomaly", ("--set", "subwindow_frames=1"),
                                       True))),
)
#: The held-out section is a group its detector has not seen (scored on the pooled scale): the
#: recipes by group would repeat their plain ones there.
HELDOUT_RECIPES = tuple(r for r in RECIPES if r.family != "autoencoder" and not r.embedding and not r.by_group)
#: The single-unit corpus has neither sections nor domains.
UNIT_RECIPES = tuple(r for r in RECIPES if not r.by_group)
#: ``--quick``: one recipe of each kind (statistics, a network, an embedding).
QUICK_RECIPES = ("normal-dist", "autoencoder", "cnn embedding + knn-anomaly")


#: ``--recipes``: the recipes a run trains (None: all); the others keep their results.
ONLY: tuple[str, ...] | None = None


def recipes(quick: bool, among: tuple[Recipe, ...] = RECIPES) -> tuple[Recipe, ...]:
    """The recipes a run trains: all of ``among`` (or those ``--recipes`` names), or with ``quick``
    those of :data:`QUICK_RECIPES`."""
    return tuple(r for r in among if (not quick or r.name in QUICK_RECIPES) and (ONLY is None or r.name in ONLY))
ANCHORS = ("DCASE 2020 baseline AE (PyTorch)", "librosa + sklearn GMM")

# ---- the DCASE 2020 task 2 baseline, as its repository sets it (github.com/y-kawagu/dcase2020_task2_baseline,
# baseline.yaml and keras_model.py at commit ebfcc2a) --------------------------------------------------------
#: feature: n_mels 128, frames 5, n_fft 1024, hop_length 512, power 2.0
AE_MELS, AE_FRAMES, AE_N_FFT, AE_HOP, AE_POWER = 128, 5, 1024, 512, 2.0
#: fit: adam (Keras defaults: lr 0.001, epsilon 1e-7), mean_squared_error, epochs 100, batch_size 512,
#: shuffle True, validation_split 0.1 (Keras holds out the *last* 10% of the vectors, in file order)
AE_EPOCHS, AE_BATCH, AE_LR, AE_VALID_SPLIT = 100, 512, 1e-3, 0.1
#: Dense(128)-BN-ReLU x 4, Dense(8)-BN-ReLU, Dense(128)-BN-ReLU x 4, Dense(640)
AE_HIDDEN, AE_LAYERS, AE_BOTTLENECK = 128, 4, 8


def dcase2020_vectors(path: Path) -> np.ndarray:
    """``file_to_vector_array`` of the baseline's ``common.py``: a clip's log-mel energies
    (``20 / power * log10(mel + eps)``), ``frames`` consecutive frames concatenated per vector
    (``n x 640``)."""
    import librosa

    y, sr = librosa.load(str(path), sr=None, mono=False)
    mel = librosa.feature.melspectrogram(y=y, sr=sr, n_fft=AE_N_FFT, hop_length=AE_HOP, n_mels=AE_MELS,
                                         power=AE_POWER)
    logmel = 20.0 / AE_POWER * np.log10(mel + sys.float_info.epsilon)
    n = logmel.shape[1] - AE_FRAMES + 1
    if n < 1:
        return np.empty((0, AE_MELS * AE_FRAMES), np.float32)
    out = np.zeros((n, AE_MELS * AE_FRAMES), np.float32)
    for t in range(AE_FRAMES):
        out[:, AE_MELS * t:AE_MELS * (t + 1)] = logmel[:, t:t + n].T
    return out


def _autoencoder(dim: int):
    """The baseline's Keras model in PyTorch: Keras initialisation (Glorot uniform weights, zero
    biases) and Keras batch normalisation (momentum 0.99, epsilon 1e-3)."""
    import torch
    from torch import nn

    layers: list[nn.Module] = []
    widths = [dim] + [AE_HIDDEN] * AE_LAYERS + [AE_BOTTLENECK] + [AE_HIDDEN] * AE_LAYERS
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.BatchNorm1d(b, eps=1e-3, momentum=0.01), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], dim))
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            torch.nn.init.zeros_(m.bias)
    return model


class Dcase2020Autoencoder:
    """Train and score as ``00_train.py`` and ``01_test.py`` do: one model per machine type on the
    vectors of its training clips; a clip's score is the mean over its vectors of each vector's
    mean squared reconstruction error."""

    @staticmethod
    def fit(paths: list[Path], seed: int, epochs: int, out: Path) -> dict:
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        x = np.concatenate([dcase2020_vectors(p) for p in paths])
        split = int(len(x) * (1.0 - AE_VALID_SPLIT))
        train, valid = torch.from_numpy(x[:split]), torch.from_numpy(x[split:])
        model = _autoencoder(x.shape[1])
        opt = torch.optim.Adam(model.parameters(), lr=AE_LR, eps=1e-7)
        loss_fn = torch.nn.MSELoss()
        gen = torch.Generator().manual_seed(seed)
        history = []
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(train), generator=gen)
            total = 0.0
            for i in range(0, len(train), AE_BATCH):
                b = train[order[i:i + AE_BATCH]]
                opt.zero_grad()
                loss = loss_fn(model(b), b)
                loss.backward()
                opt.step()
                total += float(loss) * len(b)
            model.eval()
            with torch.no_grad():
                v = float(loss_fn(model(valid), valid)) if len(valid) else float("nan")
            history.append((total / len(train), v))
        torch.save(model.state_dict(), out)
        return {"vectors": int(len(x)), "trained_on": int(split), "epochs": epochs,
                "last_loss": history[-1][0], "last_valid_loss": history[-1][1]}

    @staticmethod
    def score(model_path: Path, paths: list[Path]) -> list[float]:
        import torch

        torch.set_num_threads(1)
        model = _autoencoder(AE_MELS * AE_FRAMES)
        model.load_state_dict(torch.load(model_path))
        model.eval()
        out = []
        with torch.no_grad():
            for p in paths:
                x = torch.from_numpy(dcase2020_vectors(p))
                errors = ((x - model(x)) ** 2).mean(dim=1)
                out.append(float(errors.mean()))
        return out


class LibrosaGmm:
    """The baseline of ``bench_anomaly.py`` (what a user would write): librosa log-mel frames
    (n_fft 1024, hop 512, 64 mels, ``power_to_db``), one ``GaussianMixture(16, covariance_type='diag')``
    per detector; a clip's score is its negated mean frame log-likelihood."""

    @staticmethod
    def fit(paths: list[Path], seed: int, epochs: int, out: Path) -> dict:
        import pickle

        from sklearn.mixture import GaussianMixture

        from bench_anomaly import BASE_COMPONENTS, _baseline_frames

        x = np.vstack([_baseline_frames(p) for p in paths])
        gm = GaussianMixture(BASE_COMPONENTS, covariance_type="diag", random_state=seed).fit(x)
        with open(out, "wb") as f:
            pickle.dump(gm, f)
        return {"frames": int(x.shape[0]), "converged": bool(gm.converged_), "n_iter": int(gm.n_iter_)}

    @staticmethod
    def score(model_path: Path, paths: list[Path]) -> list[float]:
        import pickle

        from bench_anomaly import _baseline_frames

        with open(model_path, "rb") as f:
            gm = pickle.load(f)
        return [float(-gm.score_samples(_baseline_frames(p)).mean()) for p in paths]


ANCHOR_CLASSES = {ANCHORS[0]: Dcase2020Autoencoder, ANCHORS[1]: LibrosaGmm}


def anchor_job(job_file: Path) -> int:
    """One anchor process (``--anchor-job``): ``train`` writes the model, ``score`` the clip scores."""
    job = json.loads(job_file.read_text())
    cls = ANCHOR_CLASSES[job["anchor"]]
    paths = [Path(p) for p in job["paths"]]
    t0 = time.perf_counter()
    if job["stage"] == "train":
        info = cls.fit(paths, int(job["seed"]), int(job["epochs"]), Path(job["model"]))
    else:
        info = {"scores": cls.score(Path(job["model"]), paths)}
    info["compute_s"] = time.perf_counter() - t0
    info["self_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    Path(job["out"]).write_text(json.dumps(info))
    return 0


def run_anchor(anchor: str, stage: str, paths: list[Path], seed: int, epochs: int, model: Path,
               work: Path) -> dict:
    """Run one anchor stage in its own measured process; its JSON with ``wall_s`` and ``peak_rss_mb``."""
    job = work / f"anchor-job-{os.getpid()}.json"
    out = work / f"anchor-out-{os.getpid()}.json"
    job.write_text(json.dumps({"anchor": anchor, "stage": stage, "paths": [str(p) for p in paths],
                               "seed": seed, "epochs": epochs, "model": str(model), "out": str(out)}))
    r = _util.run_measured([_util.python_exe(), str(Path(__file__).resolve()), "--anchor-job", str(job)])
    res = json.loads(out.read_text())
    res.update(wall_s=r["wall_s"], peak_rss_mb=r["peak_rss_mb"])
    return res


# ---- wavetrain runs ----------------------------------------------------------------------------------------
def _train(data: Path, where: list[str], label: str, model_args: list[str], out: Path, cache: Path,
           extra: list[str] | None = None) -> dict:
    wh = [a for w in where for a in ("--where", w)]
    return _util.run_measured(_util.wavetrain_cmd() + [
        "train", "--data", str(data), *wh, "--label", label, *model_args, *(extra or []), "-o", str(out),
        "--cache", str(cache), "--no-progress"])


def _evaluate(model: Path, data: Path, where: list[str], cache: Path, extra: list[str]) -> dict:
    wh = [a for w in where for a in ("--where", w)]
    e = _util.run_measured(_util.wavetrain_cmd() + [
        "evaluate", "-m", str(model), "--data", str(data), *wh, "--json", "--cache", str(cache), "--no-progress",
        *extra])
    return json.loads(e["stdout"])


def _recipe_args(r: Recipe, seed: int, net: Path | None, quick: bool) -> list[str]:
    args = ["--model", r.family, *r.args, "--set", f"seed={seed}"]
    if r.embedding:
        assert net is not None
        args += ["--set", f"features=embedding(model={net})"]
    if quick and r.family in NETWORK_FAMILIES:
        args += ["--set", "epochs=1"]
    return args


def _net_info(path: Path) -> dict:
    """Epochs run and the best validation accuracy of a trained network (its history)."""
    try:
        from wavetrain.models.modelfile import load_model

        hist = getattr(load_model(str(path)), "history_", None) or []
        best = [h for h in hist if h.get("best")] or hist[-1:]
        return {"epochs_run": len(hist), "valid_top1": best[-1].get("top1") if best else None}
    except Exception:
        return {}


def train_net(data: Path, where: list[str], label: str, seed: int, out: Path, cache: Path, quick: bool) -> dict:
    """The embedding network of a machine type: a cnn that tells its ``label`` values apart."""
    r = _train(data, where, label, NET + ["--set", f"seed={seed}", "--set", f"epochs={1 if quick else NET_EPOCHS}"],
               out, cache)
    return {"wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"], **_net_info(out)}


def _figures(sections: dict) -> dict:
    """The fleet figures of one machine type from ``evaluate --by``'s (or dcase_report's) sections."""
    hm = sections["harmonic_mean"]
    return {"official_score": sections["official_score"], "auc_source": hm["auc"]["source"],
            "auc_target": hm["auc"]["target"], "pauc": hm["pauc"],
            "sections": [{"section": g["section"], "auc_source": g["auc"]["source"],
                          "auc_target": g["auc"]["target"], "pauc": g["pauc"]} for g in sections["groups"]]}


def fleet(work: Path, quick: bool, machines: list[str], seeds: list[int]) -> dict:
    cache = work / "cache"
    runs = []
    for m in machines:
        train_where = [f"machine={m}", "split=train", "state=normal"]
        test_where = [f"machine={m}", "split=test"]
        for seed in seeds:
            net_path = work / f"{m}-net-{seed}.wt"
            net = train_net(FLEET, train_where, "section", seed, net_path, cache, quick)
            print(f"{m:8s} seed {seed}  cnn (sections)  {net['wall_s']:6.1f} s  {net['peak_rss_mb']} MB  "
                  f"{net.get('epochs_run')} epochs, valid top-1 {net.get('valid_top1')}", flush=True)
            for r in recipes(quick):
                wt = work / f"{m}-{seed}.wt"
                t = _train(FLEET, train_where, "state", _recipe_args(r, seed, net_path, quick), wt, cache)
                ev = _evaluate(wt, FLEET, test_where, cache, ["--label", "state", "--by"])
                fig = _figures(ev["sections"])
                train_s = t["wall_s"] + (net["wall_s"] if r.embedding else 0.0)
                peak = max(t["peak_rss_mb"] or 0, net["peak_rss_mb"] or 0) if r.embedding else t["peak_rss_mb"]
                runs.append({"recipe": r.name, "machine": m, "seed": seed, **fig, "train_wall_s": round(train_s, 2),
                             "train_peak_rss_mb": peak, "detector_train_wall_s": t["wall_s"],
                             "detector_train_peak_rss_mb": t["peak_rss_mb"], **({"net": net} if r.embedding else {})})
                print(f"{m:8s} seed {seed}  {r.name:28s} score {fig['official_score']:.3f}  AUC source "
                      f"{fig['auc_source']:.3f}  target {fig['auc_target']:.3f}  pAUC {fig['pauc']:.3f}  "
                      f"{train_s:6.1f} s  {peak} MB", flush=True)
    return {"runs": runs, "summary": summarize_fleet(runs), "net": {"args": NET, "epochs": NET_EPOCHS}}


def _fleet_rows(data: Path, machine: str, split: str) -> list[tuple[Path, dict]]:
    return sorted([(p, lab) for p, lab in _util.read_csv_plain(data / "metadata.csv")
                   if lab.get("machine") == machine and lab.get("split") == split], key=lambda pl: pl[0].name)


def anchors(work: Path, quick: bool, machines: list[str], seeds: list[int]) -> dict:
    from wavetrain.evaluation.dcase_scores import dcase_report

    runs = []
    for m in machines:
        train = [p for p, lab in _fleet_rows(FLEET, m, "train") if lab["state"] == "normal"]
        test = _fleet_rows(FLEET, m, "test")
        y = [int(lab["state"] != "normal") for _, lab in test]
        for seed in seeds:
            for a in ANCHORS:
                model = work / f"{m}-anchor-{seed}.bin"
                t = run_anchor(a, "train", train, seed, 1 if quick else AE_EPOCHS, model, work)
                s = run_anchor(a, "score", [p for p, _ in test], seed, 0, model, work)
                rep = dcase_report(y, s["scores"], [lab["section"] for _, lab in test],
                                   [lab["domain"] for _, lab in test])
                fig = _figures(rep)
                runs.append({"recipe": a, "machine": m, "seed": seed, **fig, "train_wall_s": t["wall_s"],
                             "train_peak_rss_mb": t["peak_rss_mb"],
                             "train": {k: v for k, v in t.items() if k not in ("wall_s", "peak_rss_mb")},
                             "score_wall_s": s["wall_s"], "score_peak_rss_mb": s["peak_rss_mb"]})
                print(f"{m:8s} seed {seed}  {a:34s} score {fig['official_score']:.3f}  AUC source "
                      f"{fig['auc_source']:.3f}  target {fig['auc_target']:.3f}  pAUC {fig['pauc']:.3f}  "
                      f"{t['wall_s']:6.1f} s  {t['peak_rss_mb']} MB", flush=True)
    return {"runs": runs, "summary": summarize_fleet(runs),
            "dcase2020_ae": {"source": "github.com/y-kawagu/dcase2020_task2_baseline (baseline.yaml, keras_model.py, "
                                       "common.py, 00_train.py, 01_test.py)",
                             "n_mels": AE_MELS, "frames": AE_FRAMES, "n_fft": AE_N_FFT, "hop_length": AE_HOP,
                             "power": AE_POWER, "layers": f"{AE_MELS * AE_FRAMES}-{'-'.join(['128'] * AE_LAYERS)}-"
                                                          f"{AE_BOTTLENECK}-{'-'.join(['128'] * AE_LAYERS)}-"
                                                          f"{AE_MELS * AE_FRAMES}, batch norm + ReLU",
                             "epochs": AE_EPOCHS, "batch_size": AE_BATCH, "optimizer": "adam lr 0.001",
                             "validation_split": AE_VALID_SPLIT,
                             "score": "mean over the clip's vectors of each vector's mean squared error"},
            "gmm": "bench_anomaly.py's baseline: librosa log-mel (n_fft 1024, hop 512, 64 mels, power_to_db), "
                   "GaussianMixture(16, diag, random_state=seed), negated mean frame log-likelihood"}


def heldout(work: Path, quick: bool, machines: list[str], seeds: list[int]) -> dict:
    cache = work / "cache"
    runs = []
    for m in machines:
        for h in (SECTIONS[-1:] if quick else SECTIONS):
            others = ",".join(s for s in SECTIONS if s != h)
            for r in recipes(quick, HELDOUT_RECIPES):
                wt = work / f"{m}-heldout.wt"
                _train(FLEET, [f"machine={m}", "split=train", f"section={others}"], "state",
                       _recipe_args(r, seeds[0], None, quick), wt, cache)
                ev = _evaluate(wt, FLEET, [f"machine={m}", "split=train", f"section={h}"], cache,
                               ["--label", "domain", "--normal", "source"])
                runs.append({"recipe": r.name, "machine": m, "held_out": h, "seed": seeds[0],
                             "domain_auc": ev["auc"], "source_clips": ev["normal"], "target_clips": ev["anomalous"],
                             "source_false_alarms": ev["fp"], "target_false_alarms": ev["tp"]})
                print(f"{m:8s} held out {h}  {r.name:20s} target vs source AUC {ev['auc']:.3f}  false alarms: "
                      f"source {ev['fp']}/{ev['normal']}  target {ev['tp']}/{ev['anomalous']}", flush=True)
    summary: dict = {}
    for r in HELDOUT_RECIPES:
        for m in machines + ["all"]:
            rows = [x for x in runs if x["recipe"] == r.name and (m == "all" or x["machine"] == m)]
            if not rows:
                continue
            summary.setdefault(r.name, {})[m] = {
                "domain_auc": float(np.mean([x["domain_auc"] for x in rows])),
                "source_fa": sum(x["source_false_alarms"] for x in rows) / sum(x["source_clips"] for x in rows),
                "target_fa": sum(x["target_false_alarms"] for x in rows) / sum(x["target_clips"] for x in rows)}
    return {"runs": runs, "summary": summary}


def units(work: Path, quick: bool, machines: list[str], seeds: list[int]) -> dict:
    from sklearn.metrics import roc_auc_score

    cache = work / "cache"
    runs = []
    unit_list = UNITS[:1] if quick else UNITS
    for m in machines:
        for seed in seeds:
            net_path = work / f"{m}-units-net-{seed}.wt"
            net = train_net(UNITS_DATA, [f"machine={m}", "split=train", "state=normal"], "unit", seed, net_path,
                            cache, quick)
            print(f"{m:8s} seed {seed}  cnn (units)  {net['wall_s']:6.1f} s  {net['peak_rss_mb']} MB  "
                  f"{net.get('epochs_run')} epochs, valid top-1 {net.get('valid_top1')}", flush=True)
            for u in unit_list:
                train_where = [f"machine={m}", f"unit={u}", "split=train"]
                test_where = [f"machine={m}", f"unit={u}", "split=test"]
                for r in recipes(quick, UNIT_RECIPES):
                    wt = work / f"{m}-{u}.wt"
                    t = _train(UNITS_DATA, train_where, "state", _recipe_args(r, seed, net_path, quick), wt, cache)
                    ev = _evaluate(wt, UNITS_DATA, test_where, cache, ["--label", "state"])
                    runs.append({"recipe": r.name, "machine": m, "unit": u, "seed": seed, "auc": ev["auc"],
                                 "pauc": ev["pauc"], "train_wall_s": t["wall_s"],
                                 "train_peak_rss_mb": t["peak_rss_mb"]})
                    print(f"{m:8s} {u} seed {seed}  {r.name:28s} AUC {ev['auc']:.3f}  pAUC {ev['pauc']:.3f}",
                          flush=True)
                rows = [(p, lab) for p, lab in _util.read_csv_plain(UNITS_DATA / "metadata.csv")
                        if lab.get("machine") == m and lab.get("unit") == u]
                train = sorted(p for p, lab in rows if lab["split"] == "train")
                test = sorted([(p, lab) for p, lab in rows if lab["split"] == "test"], key=lambda pl: pl[0].name)
                y = [int(lab["state"] != "normal") for _, lab in test]
                for a in ANCHORS:
                    model = work / f"{m}-{u}-anchor.bin"
                    t = run_anchor(a, "train", train, seed, 1 if quick else AE_EPOCHS, model, work)
                    s = run_anchor(a, "score", [p for p, _ in test], seed, 0, model, work)
                    auc, pauc = roc_auc_score(y, s["scores"]), roc_auc_score(y, s["scores"], max_fpr=0.1)
                    runs.append({"recipe": a, "machine": m, "unit": u, "seed": seed, "auc": float(auc),
                                 "pauc": float(pauc), "train_wall_s": t["wall_s"],
                                 "train_peak_rss_mb": t["peak_rss_mb"]})
                    print(f"{m:8s} {u} seed {seed}  {a:34s} AUC {auc:.3f}  pAUC {pauc:.3f}", flush=True)
    summary: dict = {}
    for name in [r.name for r in RECIPES] + list(ANCHORS):
        rows = [x for x in runs if x["recipe"] == name]
        if not rows:
            continue
        s = summary[name] = {"auc": float(np.mean([x["auc"] for x in rows])),
                             "pauc": float(np.mean([x["pauc"] for x in rows])), "units": len(rows)}
        for m in machines:
            mine = [x["auc"] for x in rows if x["machine"] == m]
            if mine:
                s[m] = float(np.mean(mine))
    return {"runs": runs, "summary": summary}


def _merged(part: str, old: dict, new: dict) -> dict:
    """A part's results with the runs of the recipes just trained replacing theirs in ``old``, summarised
    again (``--recipes``)."""
    runs = [r for r in old.get("runs", []) if r["recipe"] not in (ONLY or ())] + new["runs"]
    out = {**old, **new, "runs": runs}
    out["summary"] = summarize_fleet(runs) if part == "fleet" else {**old.get("summary", {}), **new["summary"]}
    return out


# ---- summaries and tables ----------------------------------------------------------------------------------
FIGURES = ("official_score", "auc_source", "auc_target", "pauc")


def summarize_fleet(runs: list[dict]) -> dict:
    """Per recipe: per machine type the mean and sd over seeds of each figure; ``mean_over_types``
    (each seed's mean over the types, then mean and sd over seeds); ``all_types_score`` (each
    seed's harmonic mean of every section's three figures over all types, as the official score of
    the whole set); the train wall time (mean) and peak RSS (max)."""
    from wavetrain.evaluation.dcase_scores import harmonic_mean

    out: dict = {}
    for name in dict.fromkeys(r["recipe"] for r in runs):
        mine = [r for r in runs if r["recipe"] == name]
        machines = list(dict.fromkeys(r["machine"] for r in mine))
        seeds = sorted({r["seed"] for r in mine})
        s: dict = {"machines": {}, "seeds": seeds}
        for m in machines:
            rows = [r for r in mine if r["machine"] == m]
            s["machines"][m] = {f: _mean_sd([r[f] for r in rows]) for f in FIGURES}
        per_seed = {seed: [r for r in mine if r["seed"] == seed] for seed in seeds}
        s["mean_over_types"] = {f: _mean_sd([float(np.mean([r[f] for r in rows])) for rows in per_seed.values()])
                                for f in FIGURES}
        s["all_types_score"] = _mean_sd([harmonic_mean([sec[k] for r in rows for sec in r["sections"]
                                                        for k in ("auc_source", "auc_target", "pauc")])
                                         for rows in per_seed.values()])
        s["train_wall_s"] = float(np.mean([r["train_wall_s"] for r in mine]))
        s["train_peak_rss_mb"] = max(r["train_peak_rss_mb"] or 0 for r in mine)
        out[name] = s
    return out


def _mean_sd(xs: list) -> dict:
    v = np.asarray([x for x in xs if x is not None], dtype=float)
    return {"mean": float(v.mean()) if v.size else None, "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0}


def _ms(d: dict, sd: bool = True) -> str:
    if d["mean"] is None:
        return "–"
    return f"{d['mean']:.3f} ± {d['sd']:.3f}" if sd and d["sd"] else f"{d['mean']:.3f}"


def tables(res: dict) -> str:
    out = []
    summ = {**(res.get("fleet") or {}).get("summary", {}), **(res.get("anchors") or {}).get("summary", {})}
    if summ:
        machines = list(dict.fromkeys(m for s in summ.values() for m in s["machines"]))
        out.append("Official score per machine type (mean over seeds), its mean over types and the harmonic mean "
                   "of every section's three figures over all types (mean ± sd over seeds):\n")
        out.append(_util.markdown_table(
            ["detector", *machines, "mean over types", "all types"],
            [[name, *[_ms(s["machines"][m]["official_score"], False) if m in s["machines"] else "–"
                      for m in machines], _ms(s["mean_over_types"]["official_score"]), _ms(s["all_types_score"])]
             for name, s in summ.items()]))
        out.append("\nAUC source / AUC target / pAUC per machine type (harmonic means over sections, mean over "
                   "seeds), and their means over types:\n")
        out.append(_util.markdown_table(
            ["detector", *machines, "mean over types"],
            [[name, *["/".join(f"{s['machines'][m][f]['mean']:.2f}" for f in FIGURES[1:]) if m in s["machines"]
                      else "–" for m in machines],
              " / ".join(_ms(s["mean_over_types"][f], False) for f in FIGURES[1:])] for name, s in summ.items()]))
        out.append("\nTraining cost per machine type (one process per run; the embedding recipes: the network "
                   "and the detector):\n")
        out.append(_util.markdown_table(["detector", "train wall s (mean)", "train peak RSS MB (max)"],
                                        [[n, f"{s['train_wall_s']:.1f}", f"{s['train_peak_rss_mb']:.0f}"]
                                         for n, s in summ.items()]))
    ho = (res.get("heldout") or {}).get("summary")
    if ho:
        out.append("\nHeld-out sections (training clips only): AUC of target against source clips / false "
                   "alarms on source clips / on target clips:\n")
        cols = list(dict.fromkeys(m for s in ho.values() for m in s))
        out.append(_util.markdown_table(["detector", *cols], [
            [n, *[f"{s[m]['domain_auc']:.2f} / {s[m]['source_fa']:.2f} / {s[m]['target_fa']:.2f}" if m in s else "–"
                  for m in cols]] for n, s in ho.items()]))
    un = (res.get("units") or {}).get("summary")
    if un:
        cols = [m for m in MACHINES if any(m in s for s in un.values())]
        out.append("\nSingle-unit corpus: mean AUC per machine type, mean AUC / pAUC over the units:\n")
        out.append(_util.markdown_table(["detector", *cols, "all units: AUC / pAUC"], [
            [n, *[f"{s[m]:.3f}" if m in s else "–" for m in cols], f"{s['auc']:.3f} / {s['pauc']:.3f}"]
            for n, s in un.items()]))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parts = ["fleet", "anchors", "heldout", "units"]
    ap.add_argument("--parts", nargs="+", default=parts, choices=parts)
    ap.add_argument("--machines", nargs="+", choices=MACHINES, help="machine types (default all; fan with --quick)")
    ap.add_argument("--seeds", nargs="+", type=int, help="seeds of the fleet and anchors parts (default 0 1 2)")
    ap.add_argument("--unit-seeds", nargs="+", type=int, default=[0], help="seeds of the units part (default 0)")
    ap.add_argument("--recipes", nargs="+", choices=[r.name for r in RECIPES], metavar="NAME",
                    help="train only these recipes (the fleet, heldout and units parts; anchors run as asked); the "
                         "results file keeps the other recipes' runs")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tables", action="store_true", help="print the tables of the results file and exit")
    ap.add_argument("--anchor-job", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.anchor_job:
        return anchor_job(args.anchor_job)
    global ONLY
    ONLY = tuple(args.recipes) if args.recipes else None
    quick = _util.quick_mode(args.quick)
    out_path = _util.quick_out(_util.RESULTS / "fleet.json", "fleet") if quick else _util.RESULTS / "fleet.json"
    results = json.loads(out_path.read_text()) if out_path.exists() else {}
    if args.tables:
        print(tables(results))
        return 0
    if not (FLEET / "metadata.csv").exists():
        print(f"bench_fleet: {FLEET}/metadata.csv not found; nothing to do", file=sys.stderr)
        return 0
    machines = args.machines or (["fan"] if quick else list(MACHINES))
    seeds = args.seeds or ([0] if quick else list(SEEDS))
    with tempfile.TemporaryDirectory(prefix="wt-bench-fleet-") as tmp:
        work = Path(tmp)
        for part in args.parts:
            if part == "units" and not (UNITS_DATA / "metadata.csv").exists():
                print(f"bench_fleet: {UNITS_DATA}/metadata.csv not found; units part skipped", file=sys.stderr)
                continue
            start = {"command": " ".join(["benchmarks/bench_fleet.py", *sys.argv[1:]]),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": _util.loadavg()}
            t0 = time.perf_counter()
            run = {"fleet": fleet, "anchors": anchors, "heldout": heldout, "units": units}[part]
            new = run(work, quick, machines, args.unit_seeds if part == "units" else seeds)
            if ONLY is not None and part != "anchors":
                new = _merged(part, results.get(part) or {}, new)
            results[part] = new
            record = {**start, "end": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "wall_s": round(time.perf_counter() - t0, 1), "load_end": _util.loadavg(),
                      "machine": _util.machine_info()}
            if ONLY is not None and part != "anchors":      # (the run of the other recipes stays on record)
                results[f"{part}_runs_added"] = [*results.get(f"{part}_runs_added", []), record]
            else:
                results[f"{part}_run"] = record
            _util.write_json(out_path, results)
    print(tables(results))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
