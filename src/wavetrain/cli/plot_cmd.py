"""``wavetrain plot --spec SPEC FILE -o out.png``: waveform and feature gram of one recording."""
from __future__ import annotations

from pathlib import Path

from wavetrain.errors import ParameterError, UserError


def register(sub) -> None:
    """Add the ``plot`` command to ``sub``."""
    p = sub.add_parser("plot", help="draw a recording's waveform and its feature gram")
    p.add_argument("file", metavar="FILE", help="audio file")
    p.add_argument("--spec", default="logmel(bands=64)", metavar="SPEC",
                   help="feature spec (default logmel(bands=64))")
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="image to write (.png)")
    p.add_argument("--title", help="figure title (default: the file name and spec)")
    p.set_defaults(func=run)


def _freq_axis(spec, rate: int, dim: int):
    """(label, extent low, extent high) of the feature axis."""
    c = spec.extractor
    name = spec.name
    if spec.processors or spec.per_axis:
        return "feature index", 0, dim
    if name in ("mel", "logmel"):
        return "mel band", 0, dim
    if name == "mfcc":
        return "MFCC coefficient", 0, dim
    if name == "fft":
        top = c.fmax if c.fmax is not None else rate / 2
        return "frequency (Hz)", c.fmin, top
    if name == "stats":
        return "statistic (mean, min, max, sd of |x|)", 0, dim
    return "feature index", 0, dim


def plot_features(samples, rate: int, spec, out: Path, title: str) -> None:
    """Draw the waveform (top) and feature gram (bottom, frames x features) to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from wavetrain.features import extract

    feats = extract(samples, rate, spec)
    mono = samples if samples.ndim == 1 else samples.mean(axis=1)
    duration = mono.shape[0] / rate
    r = spec.rate or rate
    shift = spec.frame_shift_s(rate) or duration
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                   gridspec_kw={"height_ratios": [1, 2]})
    ax1.plot(np.arange(mono.shape[0]) / rate, mono, linewidth=0.5)
    ax1.set_ylabel("amplitude")
    ax1.set_title(title)
    label, lo, hi = _freq_axis(spec, r, feats.shape[1])
    t_end = feats.shape[0] * shift if spec.frame_shift_s(rate) else duration
    im = ax2.imshow(feats.T, origin="lower", aspect="auto", interpolation="nearest",
                    extent=(0.0, t_end, lo, hi), cmap="magma")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel(label)
    fig.colorbar(im, ax=ax2, label=spec.name, pad=0.01)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def run(args) -> int:
    """Load the file, extract, draw; returns the exit code (0)."""
    from wavetrain.data import load_dataset
    from wavetrain.features import parse_spec

    spec = parse_spec(args.spec)
    out = Path(args.output)
    if out.suffix.lower() not in (".png", ".svg", ".pdf", ".jpg"):
        raise ParameterError(f"-o {out}: expected an image file name ending in .png, .svg, .pdf "
                             "or .jpg")
    if not Path(args.file).is_file():
        raise UserError(f"{args.file}: no such audio file")
    recordings = list(load_dataset(args.file))
    if not recordings:
        raise UserError(f"{args.file}: no recording found")
    rec = recordings[0]
    samples, rate = rec.load(mono=not spec.per_axis)
    try:
        plot_features(samples, rate, spec, out, args.title or f"{rec.name}: {spec.name}")
    except UserError as e:
        raise type(e)(f"{rec.name}: {e}") from None
    print(f"wrote {out}")
    return 0
