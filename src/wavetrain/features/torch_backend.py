"""Torch implementation of the extractors (``device='cuda'`` or ``'cpu-torch'``).

Imported only when a torch device is requested.

``cpu-torch`` runs the numpy pipeline (same chunked framing, filter matrices and memory bound)
with torch's real FFT in place of scipy's: on x86 torch's FFT is several times faster than
pocketfft, which makes it the fastest CPU path when torch is installed.

``cuda`` uses the same filter matrices, frames with ``Tensor.unfold`` and processes at most
``TORCH_CHUNK_FRAMES`` frames at a time.  Both match the numpy path to about 1e-4 (float32 FFT
rounding).  ``pcen`` computes its mel power with torch and the PCEN smoother (a recursive filter
along the frames of the whole signal) with numpy on the host.
"""
from __future__ import annotations

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError
from wavetrain.core.extras import import_extra
from wavetrain.core.threads import limit_torch_threads
from wavetrain.features.extractors import LOG_EPS
from wavetrain.features.filters import mel_filters
from wavetrain.features.framing import get_window

__all__ = ["extract_batch_torch", "TORCH_CHUNK_FRAMES"]

TORCH_CHUNK_FRAMES = 2048


def _torch():
    torch = import_extra("torch", "feature extraction on device='cuda' or 'cpu-torch'")
    limit_torch_threads(torch)
    return torch


def _device(torch, device: str):
    if device == "cpu-torch":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ParameterError(f"device={device!r} requested but torch sees no CUDA device; "
                             "use device='cpu'")
    return torch.device(device)


def _power(torch, frames, window, n_fft):
    spec = torch.fft.rfft(frames * window, n=n_fft, dim=-1)
    return spec.real.square() + spec.imag.square()


def _kernel(torch, ext, frames, state, window):
    name = ext.name
    dev = frames.device
    t = lambda a: torch.tensor(np.array(a, dtype=np.float32), device=dev)  # noqa: E731
    if name == "identity":
        return frames
    if name == "rms":
        return frames.double().square().mean(dim=-1, keepdim=True).sqrt().float()
    if name == "stats":
        a = frames.abs().double()
        return torch.stack([a.mean(-1), a.amin(-1), a.amax(-1), a.std(-1, unbiased=False)],
                           dim=-1).float()
    if name == "fft":
        lo, hi, resize = state
        mag = _power(torch, frames, window, ext.fft_size(frames.shape[-1]))[:, lo:hi].sqrt()
        if resize is not None:
            mag = mag @ t(resize)
        c = ext.config
        if c.norm == "max":
            mag = mag / mag.amax(-1, keepdim=True).clamp_min(1e-30)
        elif c.norm == "l2":
            mag = mag / torch.linalg.vector_norm(mag, dim=-1, keepdim=True).clamp_min(1e-30)
        return torch.log(mag + 1e-10) if c.log else mag
    if name in ("mel", "logmel", "mfcc", "pcen"):
        size = frames.shape[-1]
        weights = mel_filters(*ext.mel_args(ext._rate_cache, size))
        mel = _power(torch, frames, window, ext.fft_size(size)) @ t(weights.T)
        if name in ("mel", "pcen"):  # pcen: the smoother runs over all frames, after the chunks
            return mel
        logmel = torch.log(mel + LOG_EPS)
        if name == "logmel":
            return logmel
        return logmel @ t(state[1])
    raise ParameterError(f"extractor {name!r} has no torch implementation; use device='cpu'")


def torch_rfft(torch):
    """A drop-in for :func:`~wavetrain.features.base.scipy_rfft` computed by ``torch.fft``."""
    def rfft(frames: np.ndarray, n: int) -> np.ndarray:
        return torch.fft.rfft(torch.from_numpy(frames), n=n, dim=-1).numpy()
    return rfft


def _extract_cpu(torch, ext, x: np.ndarray, rate: int) -> np.ndarray:
    saved = ext.rfft
    ext.rfft = torch_rfft(torch)
    try:
        with torch.no_grad():
            return ext.extract_batch(x, rate)
    finally:
        ext.rfft = saved


def extract_batch_torch(ext, x: np.ndarray, rate: int, device: str) -> np.ndarray:
    """Torch version of ``Extractor.extract_batch``: ``(B, n)`` -> ``(B, T, F)`` float32 numpy."""
    torch = _torch()
    dev = _device(torch, device)
    if dev.type == "cpu":
        return _extract_cpu(torch, ext, x, rate)
    return _extract_unfold(torch, ext, x, rate, dev)


def _extract_unfold(torch, ext, x: np.ndarray, rate: int, dev) -> np.ndarray:
    """The all-torch path (used for CUDA; runs on any torch device)."""
    n = x.shape[-1]
    size = ext.frame_size(rate, n)
    step = ext.frame_step(rate, size)
    if n < size:
        raise AudioError(f"signal of {n} samples ({n / rate:.4g} s at {rate} Hz) is shorter than "
                         f"one {ext.name} sub-window of {size} samples; use a shorter window_ms "
                         "or whole=true")
    ext._rate_cache = rate
    state = ext._state(rate, size)
    window = None
    if ext.windowed:
        window = torch.as_tensor(np.array(get_window(ext.config.window, size)), device=dev)
    xt = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32), device=dev)
    frames = xt.unfold(-1, size, step)  # (B, T, size) view, no copy
    batch, count = frames.shape[0], frames.shape[1]
    out = np.empty((batch, count, ext._dim(rate, size)), dtype=np.float32)
    with torch.no_grad():
        for b in range(batch):
            for t0 in range(0, count, TORCH_CHUNK_FRAMES):
                chunk = frames[b, t0:t0 + TORCH_CHUNK_FRAMES]  # copied chunk by chunk only
                res = _kernel(torch, ext, chunk, state, window).float().cpu().numpy()
                out[b, t0:t0 + res.shape[0]] = res
    if ext.name == "pcen":  # the mel power above; the smoother in numpy (a recursion over frames)
        out = ext.normalize(out, rate)
    return out
