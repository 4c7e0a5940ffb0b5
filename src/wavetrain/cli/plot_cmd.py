"""``wavetrain plot --features SPEC FILE -o out.png``: waveform and feature gram of one recording.

The waveform (top) and the feature gram (bottom) share one time axis and exactly the same
horizontal extent: the gram's colorbar sits in its own narrow column, beside an empty slot next
to the waveform. Each frame's column is centred on the middle of its sub-window, the first and
last columns reaching the start and the end of the recording, so the gram spans the waveform.
Band features are labelled in Hz (mel bands at their centre frequencies, FFT bins at theirs);
cepstra and other features by their index. Features on very different scales across rows (MFCC,
or any spec with processors such as delta) are drawn with each row standardised, and the
colorbar says so; per-channel (``per_axis``) and delta blocks are separated by lines and labelled.
The title is the file name and the spec's parameters that differ from their defaults.
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
    p.add_argument("--title", help="figure title (default: the file name and the spec's parameters that are not at "
                                   "their defaults)")
    p.set_defaults(func=run)


#: Processors after which feature row ``i`` is still band ``i`` (they scale values, not rows).
BAND_KEEPING = ("normalize", "cmvn", "l1", "lpnorm")
#: Ticks of the frequency axis of mel bands at most.
MEL_TICKS = 8


def band_centres(spec, rate: int, dim: int):
    """The centre frequency (Hz) of each feature row of a band spec (``mel``, ``logmel``,
    ``pcen``: the mel filters' centres; ``fft``: the bins'), or None when the rows are not bands
    (cepstra, statistics, per-axis or reshaped features)."""
    import numpy as np

    from wavetrain.core.errors import UserError
    from wavetrain.features.filters import mel_edges

    if spec.per_axis or any(p.stage not in BAND_KEEPING for p in spec.processors):
        return None
    c, name = spec.extractor, spec.name
    try:
        top = float(c.fmax) if getattr(c, "fmax", None) is not None else rate / 2
        if name in ("mel", "logmel", "pcen"):
            centres = mel_edges(c.bands, c.fmin, top, c.htk, c.warp)[1:-1]
        elif name == "fft":
            ext = spec.build_extractor()
            if c.bins is not None:
                step = (top - c.fmin) / c.bins
                centres = c.fmin + step * (np.arange(c.bins) + 0.5)
            else:
                size = ext.fft_size(ext.frame_size(rate))
                lo, hi = ext._native(rate, ext.frame_size(rate))
                centres = np.arange(lo, hi) * rate / size
        else:
            return None
    except (UserError, AttributeError):
        return None
    return centres if len(centres) == dim else None


def _freq_axis(spec, rate: int, dim: int):
    """(label, row edges, ticks) of the feature axis: ticks ``(positions, labels)`` in Hz for
    band features (rows drawn by index, ticks at round frequencies between the band centres), or
    None for the axis' own numbers."""
    import numpy as np

    centres = band_centres(spec, rate, dim)
    edges = np.arange(dim + 1, dtype=np.float64)
    if centres is not None and dim > 1:
        scale = "frequency (Hz, mel scale)" if spec.name != "fft" else "frequency (Hz)"
        return scale, edges, _hz_ticks(np.asarray(centres, np.float64))
    if spec.name == "mfcc" or any(p.stage == "dct" for p in spec.processors):
        return "coefficient", edges, None
    if spec.name == "stats" and not spec.processors:
        return "statistic (mean, min, max, sd of |x|)", edges, None
    return "feature index", edges, None


def _hz_ticks(centres):
    """Round frequencies between the first and last band centre, placed on the row axis (row
    ``i`` spans ``[i, i + 1]``, its centre frequency at ``i + 0.5``), at most :data:`MEL_TICKS`."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    rows = np.arange(len(centres)) + 0.5
    lo, hi = float(centres[0]), float(centres[-1])
    linear = np.allclose(np.diff(centres), centres[1] - centres[0], rtol=1e-3)
    if linear:
        found = np.asarray(MaxNLocator(MEL_TICKS, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi), np.float64)
    else:      # mel: round values of each decade (100, 200, 500, 1000, ...) where the bands are
        found = np.array([m * 10.0 ** e for e in range(0, 6) for m in (1, 2, 5)])
    values = [float(v) for v in found if lo <= v <= hi]
    at = np.interp(values, centres, rows)
    # (from the top down, each tick at least a few rows below the last: low mel bands crowd)
    gap = len(centres) / (MEL_TICKS + 2)
    keep: list[int] = []
    for i in reversed(range(len(values))):
        if not keep or at[keep[-1]] - at[i] >= gap:
            keep.append(i)
    keep.reverse()
    return [float(at[i]) for i in keep], [f"{values[i]:g}" for i in keep]


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


def short_spec(spec) -> str:
    """The spec with only the parameters that differ from their defaults, e.g.
    ``mfcc(coeffs=13) | delta`` (it parses back to the same spec)."""
    from wavetrain.core.params import format_value
    from wavetrain.features._params import param_specs

    stages = getattr(spec, "extractor", None)
    if stages is None:                  # (a combined spec: its own text)
        return str(spec)
    parts = []
    for c in (spec.extractor, *spec.processors):
        defaults = {p["name"]: p["default"] for p in param_specs(type(c))}
        args = [f"{n}={format_value(getattr(c, n))}" for n in type(c).field_order()
                if n in defaults and getattr(c, n) != defaults[n]]
        parts.append(f"{c.stage}({', '.join(args)})" if args else c.stage)
    return " | ".join(parts)


def default_title(name: str, spec) -> str:
    """The file name and the spec's parameters that are not at their defaults
    (:func:`short_spec`), wrapped to fit the figure when they are many."""
    return textwrap.fill(f"{name}: {short_spec(spec)}", width=120, break_long_words=False,
                         subsequent_indent="    ")


def frame_edges(spec, rate: int, n_samples: int, n_frames: int):
    """The time edges (s, ``n_frames + 1``) of the gram's columns: each frame's column is centred
    on the middle of its sub-window, and the first and last columns reach the start and the end
    of the recording (a single frame, or frames the spec does not lay out evenly, span it all)."""
    import numpy as np

    duration = n_samples / rate
    shift = spec.frame_shift_s(rate) if hasattr(spec, "extractor") else 0.0
    if n_frames < 2 or not shift:
        return np.linspace(0.0, duration, n_frames + 1)
    r = int(spec.rate or rate)
    ext = spec.build_extractor()
    if ext.n_frames(n_samples if r == rate else round(n_samples * r / rate), r) != n_frames:
        return np.linspace(0.0, duration, n_frames + 1)
    centres = (np.arange(n_frames) * shift + ext.frame_size(r) / (2 * r))
    edges = np.concatenate([[0.0], (centres[:-1] + centres[1:]) / 2, [max(duration, centres[-1] + shift / 2)]])
    return edges


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
    import numpy as np
    from matplotlib.transforms import blended_transform_factory

    from wavetrain.features import extract

    feats = extract(samples, rate, spec)
    channels = samples.shape[1] if samples.ndim == 2 else 1
    times = frame_edges(spec, rate, samples.shape[0], feats.shape[0])
    what = " | ".join([spec.name, *(p.stage for p in spec.processors)])
    if standardise_rows(spec, feats):
        image, bar_label = _standardised(feats), f"{what}, each row standardised"
    else:
        image, bar_label = feats, what
    blocks = feature_blocks(spec, rate, channels, feats.shape[1])
    if blocks:
        label = "coefficient" if spec.name == "mfcc" else "feature index"
        rows, ticks = np.arange(feats.shape[1] + 1, dtype=np.float64), None
    else:
        label, rows, ticks = _freq_axis(spec, spec.rate or rate, feats.shape[1])
    # (an image with the columns' edges: frames are centred on their sub-windows)
    im = ax.pcolorfast(times, rows, image.T, cmap="magma")
    ax.set_ylim(rows[0], rows[-1])
    if ticks is not None:
        ax.set_yticks(*ticks)
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
