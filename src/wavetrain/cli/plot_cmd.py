"""``wavetrain plot --features SPEC FILE -o out.png``: waveform and feature gram of one recording.

The waveform (top) and the feature gram (bottom) share one time axis and exactly the same
horizontal extent: the gram's colorbar sits in its own narrow column, beside an empty slot next
to the waveform. Features on very different scales across rows (MFCC, or any spec with
processors such as delta) are drawn with each row standardised, and the colorbar says so;
per-channel (``per_axis``) and delta blocks are separated by lines and labelled.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import IMAGE_SUFFIXES


def register(sub) -> None:
    """Add the ``plot`` command to ``sub``."""
    p = sub.add_parser("plot", help="draw a recording's waveform and its feature gram",
                       description="Draw one audio file's waveform and feature gram "
                                   "(`wavetrain plot history` draws a model's training history).")
    from wavetrain.cli.common import reads, writes

    reads(p.add_argument("file", metavar="FILE", help="one audio file (.wav, .flac, ...)"))
    p.add_argument("--features", "--spec", dest="spec", default="logmel(bands=64)", metavar="SPEC",
                   help="feature spec, as for `wavetrain train --features` (default logmel(bands=64); "
                        "--spec is an alias)")
    writes(p.add_argument("-o", "--output", required=True, metavar="PNG",
                          help="image to write (.png, .svg, .pdf or .jpg)"))
    p.add_argument("--title", help="figure title (default: the file name and the full spec)")
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


def feature_blocks(spec, rate: int, channels: int, dim: int) -> list[tuple[str, int]] | None:
    """The labelled blocks along the feature axis, in order, as ``(label, size)``.

    Per-axis specs concatenate the features of each channel (``ch 1``, ``ch 2``, ...); delta
    appends velocity (``Δ``) and acceleration (``ΔΔ``) blocks. None when there is only one block
    or the layout is not known (a processor that reduces the feature axis).
    """
    from wavetrain.features.registry import PROCESSORS

    try:
        base = spec.build_extractor().feature_dim(spec.rate or rate)
    except UserError:
        return None
    chans = channels if spec.per_axis else 1
    blocks = [(f"ch {i + 1}" if chans > 1 else "", base) for i in range(chans)]
    for cfg in spec.processors:
        total = sum(n for _, n in blocks)
        if cfg.stage == "delta":
            out = [(lab or "static", n) for lab, n in blocks] if cfg.keep else []
            for k in range(1, cfg.order + 1):
                out += [("Δ" * k + (f" {lab}" if lab else ""), n) for lab, n in blocks]
            blocks = out
        elif PROCESSORS[cfg.stage](cfg).feature_dim(total) != total:
            return None
    if len(blocks) < 2 or sum(n for _, n in blocks) != dim:
        return None
    return blocks


def standardise_rows(spec, feats):
    """Whether to draw each feature row standardised: the rows of MFCC (c0 dwarfs the others)
    and of any processed spec (delta blocks are much smaller than the static ones) are on very
    different scales; a single frame has nothing to standardise across."""
    return feats.shape[0] > 1 and (spec.name == "mfcc" or bool(spec.processors))


def _standardised(feats):
    """``feats`` (frames x features) with each feature row at zero mean and unit sd over time;
    a constant row (sd zero, or float noise only) becomes zero."""
    import numpy as np

    x = feats.astype(np.float64)
    mean = x.mean(axis=0)
    sd = x.std(axis=0)
    flat = sd <= 1e-5 * np.abs(x).max(axis=0)
    return ((x - mean) / np.where(flat, 1.0, sd)).astype(np.float32)


def default_title(name: str, spec) -> str:
    """The file name and the canonical spec text, wrapped to fit the figure."""
    return textwrap.fill(f"{name}: {spec}", width=120, break_long_words=False,
                         subsequent_indent="    ")


def build_figure(samples, rate: int, spec, title: str):
    """The waveform (top) and feature gram (bottom, time x features) as a matplotlib Figure.

    Parameters
    ----------
    samples : np.ndarray
        ``(n,)`` mono, or ``(n, channels)`` for a per-axis spec.
    rate : int
        Sample rate of ``samples`` in Hz.
    spec : FeatureSpec or str
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        With an Agg canvas (no pyplot state). Axes labels: ``waveform``, ``gram``, ``colorbar``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from wavetrain.features import parse_spec

    spec = parse_spec(spec)
    fig = Figure(figsize=(10, 6.5))
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(2, 2, height_ratios=[1, 2], width_ratios=[1, 0.025])
    ax1 = fig.add_subplot(gs[0, 0], label="waveform")
    ax2 = fig.add_subplot(gs[1, 0], sharex=ax1, label="gram")
    cax = fig.add_subplot(gs[1, 1], label="colorbar")
    _draw_waveform(ax1, samples, rate, title)
    _draw_gram(fig, ax2, cax, samples, rate, spec)
    ax1.set_xlim(0.0, samples.shape[0] / rate)
    fig.tight_layout()
    return fig


def _draw_waveform(ax, samples, rate: int, title: str) -> None:
    import numpy as np

    n = samples.shape[0]
    t = np.arange(n) / rate
    if samples.ndim == 2 and samples.shape[1] > 1:
        for c in range(samples.shape[1]):
            ax.plot(t, samples[:, c], linewidth=0.5, alpha=0.8, label=f"ch {c + 1}")
        ax.legend(loc="upper right", fontsize=8)
    else:
        ax.plot(t, samples.reshape(n), linewidth=0.5)
    ax.set_ylabel("amplitude")
    ax.set_title(title, fontsize=9, loc="left")
    ax.tick_params(labelbottom=False)


def _draw_gram(fig, ax, cax, samples, rate: int, spec) -> None:
    """The feature gram on ``ax`` (time on x, features on y; per-axis blocks marked) and its
    colorbar on ``cax``."""
    from matplotlib.transforms import blended_transform_factory

    from wavetrain.features import extract

    feats = extract(samples, rate, spec)
    channels = samples.shape[1] if samples.ndim == 2 else 1
    shift = spec.frame_shift_s(rate)
    t_end = feats.shape[0] * shift if shift and feats.shape[0] > 1 else samples.shape[0] / rate
    what = " | ".join([spec.name, *(p.stage for p in spec.processors)])
    if standardise_rows(spec, feats):
        image, bar_label = _standardised(feats), f"{what}, each row standardised"
    else:
        image, bar_label = feats, what
    blocks = feature_blocks(spec, rate, channels, feats.shape[1])
    if blocks:
        label, lo, hi = "feature index", 0, feats.shape[1]
    else:
        label, lo, hi = _freq_axis(spec, spec.rate or rate, feats.shape[1])
    im = ax.imshow(image.T, origin="lower", aspect="auto", interpolation="nearest",
                   extent=(0.0, t_end, lo, hi), cmap="magma")
    where = blended_transform_factory(ax.transAxes, ax.transData)
    start = 0
    for i, (name, size) in enumerate(blocks or []):
        if i:
            ax.axhline(start, color="white", linewidth=1.2, label="block separator")
        ax.text(0.005, start + size / 2, name, transform=where, ha="left", va="center", fontsize=8,
                color="white", bbox=dict(boxstyle="round,pad=0.15", facecolor="black", alpha=0.6, linewidth=0))
        start += size
    ax.set_xlabel("time (s)")
    ax.set_ylabel(label)
    fig.colorbar(im, cax=cax, label=bar_label)


def plot_features(samples, rate: int, spec, out, title: str) -> Path:
    """Draw :func:`build_figure` to ``out`` atomically (format from its suffix); returns the path."""
    from wavetrain.core.outputs import write_atomic

    out = Path(out)
    fig = build_figure(samples, rate, spec, title)
    fmt = out.suffix.lower().lstrip(".") or "png"
    return write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=100), what="plot")


def _one_audio_file(path: str) -> Path:
    """``path`` as one audio file; a metadata csv, a folder or a missing path is refused."""
    from wavetrain.data import load_dataset

    p = Path(path)
    if not str(path).strip():
        raise UserError("FILE: empty path; give one audio file, e.g. dog1.wav")
    if p.is_dir() or (p.is_file() and p.suffix.lower() == ".csv"):
        kind = "a folder" if p.is_dir() else "a metadata file"
        try:
            ds = load_dataset(p, check=False)
        except UserError:
            raise UserError(f"{path}: is {kind}, not an audio file; `wavetrain plot` draws one "
                            "audio file") from None
        many = f"{len(ds)} recording{'s' if len(ds) != 1 else ''}"
        raise UserError(f"{path}: is {kind} listing {many}; `wavetrain plot` draws one audio "
                        f"file, so give one, e.g. {ds[0].path}")
    if not p.exists():
        raise UserError(f"{path}: no such audio file")
    if not p.is_file():
        raise UserError(f"{path}: is not a regular file; give one audio file")
    return p


def run(args) -> int:
    """Check the output, load the file, extract, draw; returns the exit code (0)."""
    from wavetrain.core.outputs import OutputError, check_output_file
    from wavetrain.data import load_dataset
    from wavetrain.features import parse_spec

    spec = parse_spec(args.spec)
    out = check_output_file(args.output, option="-o", suffixes=IMAGE_SUFFIXES, example="plot.png")
    path = _one_audio_file(args.file)
    rec = load_dataset(path)[0]
    samples, rate = rec.load(mono=not spec.per_axis)
    try:
        fig_title = args.title or default_title(rec.name, spec)
        plot_features(samples, rate, spec, out, fig_title)
    except OutputError:
        raise
    except UserError as e:
        raise type(e)(f"{rec.name}: {e}") from None
    print(f"wrote {out}")
    return 0
