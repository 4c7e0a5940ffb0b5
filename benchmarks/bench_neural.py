"""Neural training throughput: wavetrain's trainer over memory-mapped grams vs a torch DataLoader.

Trains the ``cnn`` network for a fixed number of steps on synthetic 64-band grams (``--frames``
frames each) stored in a memory-mapped ``.npy`` file:

* ``wavetrain``: :class:`~wavetrain.train.ArrayStream` -> shuffle buffer -> prefetch thread ->
  :func:`~wavetrain.train.trainer.train_step` (what ``CNNClassifier.fit`` runs);
* ``dataloader``: ``torch.utils.data.DataLoader`` (shuffle, ``num_workers=0``) over the same
  array and the same ``train_step``.

Reports samples/s and the fraction of step time spent waiting for data, with 1 and 2 torch
threads for the wavetrain path. Writes ``benchmarks/results/neural.json``.

    .venv/bin/python benchmarks/bench_neural.py [--steps 60] [--windows 2048]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _make_data(folder: Path, n: int, frames: int, bands: int, classes: int):
    rng = np.random.default_rng(0)
    y = (np.arange(n) % classes).astype(np.int64)
    arr = np.lib.format.open_memmap(folder / "grams.npy", mode="w+", dtype=np.float32, shape=(n, frames, bands))
    for s in range(0, n, 256):
        block = rng.normal(size=(min(256, n - s), frames, bands)).astype(np.float32)
        for i in range(block.shape[0]):
            c = y[s + i]
            block[i, :, c * 4:(c + 1) * 4] += 2.0
        arr[s:s + block.shape[0]] = block
    arr.flush()
    del arr
    np.save(folder / "y.npy", y)


def run_wavetrain(folder: Path, steps: int, batch: int, classes: int, threads: int) -> dict:
    from wavetrain.models._torch_common import import_torch, prepare_input
    from wavetrain.models.cnn import build_cnn
    from wavetrain.train import ArrayStream
    from wavetrain.train.steps import SingleDevice
    from wavetrain.train.trainer import TrainConfig, Trainer

    torch = import_torch()
    torch.set_num_threads(threads)
    grams = np.load(folder / "grams.npy", mmap_mode="r")
    y = np.load(folder / "y.npy")
    stream = ArrayStream(grams, y, [str(c) for c in range(classes)], batch_size=256)
    frames, bands = grams.shape[1], grams.shape[2]
    mean, sd = np.zeros(bands, np.float32), np.ones(bands, np.float32)
    torch.manual_seed(0)
    net = build_cnn(bands, frames, classes)
    cfg = TrainConfig(epochs=1000, max_iters=steps, batch_size=batch, valid_every_iters=steps, patience=0,
                      schedule="constant", shuffle_buffer=1024)
    tr = Trainer(SingleDevice(net, torch.device("cpu")), lambda g: prepare_input(g, mean, sd, frames), cfg)
    t0 = time.perf_counter()
    res = tr.fit(stream, None, n_train=len(y))
    wall = time.perf_counter() - t0
    return {"threads": threads, "steps": res.iterations, "seconds": wall,
            "samples_per_s": res.iterations * batch / wall,
            "stall_fraction": res.data_wait_fraction, "final_train_loss": res.history[-1]["train_loss"]}


def run_dataloader(folder: Path, steps: int, batch: int, classes: int, threads: int, workers: int) -> dict:
    from wavetrain.models._torch_common import import_torch
    from wavetrain.models.cnn import build_cnn
    from wavetrain.train.steps import make_optimizer, train_step

    torch = import_torch()
    torch.set_num_threads(threads)
    grams = np.load(folder / "grams.npy", mmap_mode="r")
    y = np.load(folder / "y.npy")

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return torch.from_numpy(np.array(grams[i], dtype=np.float32)[None]), int(y[i])

    torch.manual_seed(0)
    net = build_cnn(grams.shape[2], grams.shape[1], classes)
    opt = make_optimizer(net, "adam", 1e-3, 0.9, 0.0)
    loader = torch.utils.data.DataLoader(DS(), batch_size=batch, shuffle=True, num_workers=workers, drop_last=True)
    done, wait = 0, 0.0
    t0 = time.perf_counter()
    while done < steps:
        it = iter(loader)
        while done < steps:
            tw = time.perf_counter()
            try:
                xb, yb = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - tw
            loss = train_step(net, opt, xb.numpy(), yb.numpy(), torch.device("cpu"))
            done += 1
    wall = time.perf_counter() - t0
    return {"threads": threads, "workers": workers, "steps": done, "seconds": wall,
            "samples_per_s": done * batch / wall, "stall_fraction": wait / wall, "final_train_loss": loss}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--windows", type=int, default=2048)
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--bands", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "neural.json"))
    args = ap.parse_args(argv)
    results: dict = {"config": vars(args), "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _make_data(folder, args.windows, args.frames, args.bands, args.classes)
        run_wavetrain(folder, 5, args.batch, args.classes, 1)  # warm-up (torch import, allocator)
        results["wavetrain_1thread"] = run_wavetrain(folder, args.steps, args.batch, args.classes, 1)
        results["dataloader_1thread"] = run_dataloader(folder, args.steps, args.batch, args.classes, 1, 0)
        results["wavetrain_2threads"] = run_wavetrain(folder, args.steps, args.batch, args.classes, 2)
        results["dataloader_1thread_1worker"] = run_dataloader(folder, args.steps, args.batch, args.classes, 1, 1)
    import torch

    results["machine"]["torch"] = torch.__version__
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    for k, v in results.items():
        if isinstance(v, dict) and "samples_per_s" in v:
            print(f"{k:28s} {v['samples_per_s']:8.1f} samples/s  stall {100 * v['stall_fraction']:5.1f}%",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
