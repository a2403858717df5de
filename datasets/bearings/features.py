"""The per-window feature recipe of the published bearing feature files, and the streaming pieces that apply it.

Recipe (itxwaleedrazzaq/PhDCode @ e26aabff, `XJTU/Paper01_CARLE.ipynb` step 5 and its PRONOSTIA twin; summarised in
../shared/data/bearings/PROVENANCE.md): concatenate a bearing's snapshots per channel in file order, cut windows of
1000 samples every 500, and per window and channel compute `[energy, dominant_frequency, entropy, kurtosis, skewness,
mean, std]`:
- CWT: `pywt.cwt(window, scales, wavelet, sampling_period=1/25600)` with 100 scales log-spaced so that a wavelet of
  centre frequency f_c = 0.81 covers [f_min, f_max] (PRONOSTIA [33, 300] Hz, XJTU-SY [10, 120] Hz):
  `scales = logspace(log10(f_c*fs/f_max), log10(f_c*fs/f_min), 100)`. energy = sum |coef|^2; dominant frequency =
  the frequency pywt reports for the scale of largest energy. The wavelet is bare `'cmor'`, i.e. `'cmor1.0-0.5'`
  (centre 0.5, not 0.81: the reported frequencies run 33*0.5/0.81 = 20.37 .. 185.2 Hz, as in the published files).
- entropy = scipy.stats.entropy(3-bin density histogram + 1e-9); kurtosis and skewness = scipy (Fisher, biased);
  mean and std = numpy (ddof 0). Energy is written raw; log10(energy + 1e-8) is applied by the reader (`table.py`),
  as NSAC's `process_features` does.
- Window count: `(L - 1000) // 500 + 1` for L concatenated samples (PRONOSTIA Bearing1_3: 2375 files ->
  12159 rows, the one staged case where the PhDCode loop `range(0, L - 1000, 500)` would give one fewer).

Measured against the published files (pronostia_raw/fixtures/Full_Test_Set/Bearing1_4/acc_00001.csv = the first
4 rows of tf_features_pronostia/Bearing1_4_features.csv, both channels: the only raw snapshot in ../shared that has
published rows; tests/datasets/test_bearings_features.py):
- entropy, kurtosis, skewness, mean, std: bit-identical (==) on the raw, unsmoothed window.
- energy and dominant frequency: equal to float precision (energy max relative error 3.3e-16, dominant frequency
  7.1e-15 Hz = 1 ulp; Pearson r = 1.0000000000 on the 8 pairs) with the wavelet resolution `precision=10` that
  PyWavelets <= 1.7 fixed. PyWavelets >= 1.8 defaults to 12, which moves the coefficients: on the same 8 windows
  energy is off by up to 83% (r = 0.910) and dominant frequency by up to 22.7 Hz (r = 0.658), consistent with the
  "energy correlation ~0.87" PROVENANCE found over all of Bearing2_1.
- `cwt_power` computes pywt.cwt's coefficients (same integrated wavelet, per-scale resampling, -sqrt(scale) * diff,
  centre trim) by cached FFTs of only the kernel part that reaches the kept outputs: equal to `pywt.cwt(...,
  method='conv')` (the published run's method) to < 1e-14 relative, ~40x faster than it (~3 ms per window and
  channel; a 911-file PRONOSTIA bearing, 4663 rows, takes ~30 s on one core).

Published XJTU-SY quirk, reproduced by `XJTU_SPEC`: the notebook concatenated `sorted()` file paths, i.e. snapshots
in lexicographic order (1, 10, 100, ..., 109, 11, 110, ...), so rows, `Time`, `RUL` and `Degradation` do not follow
the run's time. Measured on tf_features_xjtu/Bearing1_1 (123 snapshots): mean window std per snapshot position is
0.43, 0.46, then 2.8-3.0 at positions 3-12 (= files 100-109) and 3.3-6.8 at 25-28 (= 120-123, the failure), back
to ~0.46 from position 29 (= 13, 14, ...); Bearing1_2 and 2_4 show the same pattern. PRONOSTIA names are
zero-padded, so both orders agree there. `replace(XJTU_SPEC, file_order="numeric")` extracts in time order.

Departures and choices: PROVENANCE lists Gaussian pre-smoothing (sigma 1.1 PRONOSTIA, 0.75 XJTU). For PRONOSTIA the
published statistics match only without it (with it: std correlation 0.78), so `PRONOSTIA_SPEC` does not smooth.
XJTU-SY keeps sigma 0.75 as in the notebook (input `filter_data/Smooth_*.csv`); no raw XJTU-SY file was available
to check it. Smoothing streams exactly (`GaussianStream` == `gaussian_filter1d` on the concatenation, mode 'reflect').
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pywt
import scipy.fft
from scipy.ndimage import gaussian_filter1d
from scipy.stats import entropy, kurtosis, skew

FEATURE_NAMES = ("energy", "dominant_frequency", "entropy", "kurtosis", "skewness", "mean", "std")


@dataclass(frozen=True)
class FeatureSpec:
    """How one dataset's published feature files were made from its raw signal."""

    f_min: float
    """lowest frequency [Hz] the CWT scales cover (computed with centre frequency `f_c`)"""
    f_max: float
    """highest frequency [Hz] the CWT scales cover"""
    smooth_sigma: float | None
    """Gaussian pre-smoothing of the concatenated signal, in samples; None: the raw signal"""
    time_decimals: int | None
    """`Time` is rounded to this many decimals (PRONOSTIA 5); None: written unrounded (XJTU-SY)"""
    round_rows_to: int | None
    """keep only a multiple of this many windows (XJTU-SY 1000: 8059 -> 8000 for Bearing1_1); None: all"""
    file_order: str = "numeric"
    """snapshot concatenation order: "numeric" (time order) or "lexicographic" (1, 10, 100, ..., 11, ...: what the
    published XJTU-SY files did, see the module docstring)"""
    fs: float = 25600.0
    """sampling rate [Hz]"""
    window: int = 1000
    """samples per window"""
    step: int = 500
    """samples between window starts"""
    n_scales: int = 100
    """number of CWT scales"""
    f_c: float = 0.81
    """centre frequency the scales were computed for (the wavelet's own is 0.5, see the module docstring)"""
    wavelet: str = "cmor1.0-0.5"
    """PyWavelets name; bare 'cmor' (deprecated) meant exactly this"""
    cwt_precision: int = 10
    """wavelet resolution 2**precision: 10 reproduces the published files (PyWavelets <= 1.7 fixed it at 10)"""

    @property
    def scales(self) -> np.ndarray:
        """(n_scales,) CWT scales, smallest (highest frequency) first."""
        lo, hi = self.f_c * self.fs / self.f_max, self.f_c * self.fs / self.f_min
        return np.logspace(np.log10(lo), np.log10(hi), self.n_scales)

    def n_windows(self, n_samples: int) -> int:
        """Rows a bearing of `n_samples` concatenated samples yields."""
        n = (n_samples - self.window) // self.step + 1 if n_samples >= self.window else 0
        return n - n % self.round_rows_to if self.round_rows_to else n

    def times(self, n_windows: int) -> np.ndarray:
        """(n_windows,) the `Time` column: window index * window / fs (0.0390625 a row; not physical seconds)."""
        time = np.arange(n_windows) * (self.window / self.fs)
        return np.round(time, self.time_decimals) if self.time_decimals is not None else time


PRONOSTIA_SPEC = FeatureSpec(f_min=33.0, f_max=300.0, smooth_sigma=None, time_decimals=5, round_rows_to=None)
XJTU_SPEC = FeatureSpec(
    f_min=10.0, f_max=120.0, smooth_sigma=0.75, time_decimals=None, round_rows_to=1000, file_order="lexicographic"
)
SPECS = {"pronostia": PRONOSTIA_SPEC, "xjtu": XJTU_SPEC}


def statistics(windows: np.ndarray) -> np.ndarray:
    """(B, window) -> (B, 5) entropy, kurtosis, skewness, mean, std, bit-identical to the notebook's 1-D calls.

    Batched along axis 1 where that is bit-identical (tested); skewness batched is not (1 ulp), so it stays 1-D."""
    density = np.array([np.histogram(w, bins=3, density=True)[0] for w in windows]).reshape(-1, 3)  # (B, 3)
    skewness = np.array([skew(w) for w in windows])  # (B,)
    moments = [kurtosis(windows, axis=1), skewness, windows.mean(axis=1), windows.std(axis=1)]
    return np.column_stack([entropy(density + 1e-9, axis=1), *moments])


@dataclass(frozen=True)
class _CwtPlan:
    """pywt.cwt's kernels for one spec, cut to the part that reaches the kept outputs, as FFTs (see `cwt_power`)."""

    kernels: np.ndarray  # (n_scales, n_fft) FFT of each scale's kernel slice; kept outputs at [n - 1, 2n - 1]
    frequencies: np.ndarray  # (n_scales,) Hz, exactly as pywt.cwt reports them
    n_fft: int


@lru_cache(maxsize=8)
def _plan(spec: FeatureSpec) -> _CwtPlan:
    # Mirrors pywt/_cwt.py (1.9): conj(integrated wavelet) resampled per scale, reversed; coef = -sqrt(s) *
    # diff(full convolution) trimmed by floor(d) on the left, d = (L - 2) / 2. The kept n outputs need only
    # conv[a .. a + n], a = floor(d), which involves kernel samples [a - n + 1, a + n]: a slice of <= 2n samples,
    # left-padded with zeros where a - n + 1 < 0 so that the needed outputs start at index n - 1 for every scale.
    n = spec.window
    int_psi, grid = pywt.integrate_wavelet(pywt.ContinuousWavelet(spec.wavelet), precision=spec.cwt_precision)
    int_psi, step = np.conj(int_psi), grid[1] - grid[0]
    slices = []
    for scale in spec.scales:
        j = (np.arange(scale * (grid[-1] - grid[0]) + 1) / (scale * step)).astype(int)
        kernel = int_psi[j[j < int_psi.size]][::-1]  # (L,)
        a = (kernel.size - 2) // 2
        lo, hi = a - n + 1, min(kernel.size, a + n + 1)
        slices.append(np.concatenate([np.zeros(max(0, -lo), kernel.dtype), kernel[max(0, lo) : hi]]))  # (<= 2n,)
    longest = n + max(len(k) for k in slices) - 1  # linear convolution length
    n_fft = 2
    while not (2 * n - 1 < n_fft and n - 1 >= longest - n_fft):  # kept outputs [n - 1, 2n - 1] unaliased
        n_fft *= 2
    freqs = np.atleast_1d(pywt.scale2frequency(spec.wavelet, spec.scales, spec.cwt_precision)) / (1.0 / spec.fs)
    return _CwtPlan(np.array([scipy.fft.fft(k, n_fft) for k in slices]), freqs, n_fft)


def cwt_power(windows: np.ndarray, spec: FeatureSpec, batch: int = 2) -> np.ndarray:
    """(B, window) -> (n_scales, B) sum over time of |pywt.cwt coefficients|^2, for precision and wavelet of `spec`.

    Equal to `pywt.cwt(..., method='conv')` to < 1e-14 relative (tested): kernels are cut to what the kept outputs
    use and convolved by cached FFTs (2048 points for both specs)."""
    plan, n = _plan(spec), spec.window
    out = []
    for i in range(0, len(windows), batch):  # small batches: the (n_scales, batch, n_fft) product stays in cache
        spectrum = scipy.fft.fft(windows[i : i + batch], plan.n_fft, axis=-1)  # (b, n_fft)
        conv = scipy.fft.ifft(plan.kernels[:, None, :] * spectrum[None], axis=-1, overwrite_x=True)  # (S, b, n_fft)
        coef = conv[..., n : 2 * n] - conv[..., n - 1 : 2 * n - 1]  # (S, b, n), up to the factor -sqrt(scale)
        parts = coef.view(np.float64)  # (S, b, 2n) real and imaginary parts
        out.append(spec.scales[:, None] * np.einsum("sbk,sbk->sb", parts, parts))  # (S, b)
    return np.concatenate(out, axis=1)


def window_features(windows: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """(B, window) single-channel windows -> (B, 7) `FEATURE_NAMES`, raw energy."""
    power = cwt_power(windows, spec)  # (n_scales, B)
    energy = np.ascontiguousarray(power.T).sum(axis=1)  # (B,); summed per row so batching cannot change it
    dominant = _plan(spec).frequencies[np.argmax(power, axis=0)]  # (B,)
    return np.column_stack([energy, dominant, statistics(windows)])


class WindowStream:
    """Cuts windows over a signal that arrives in chunks, holding only what the next window still needs.

    After each `push` fewer than `window` samples stay buffered, so memory never exceeds window + one chunk
    (`max_buffered` records the peak, for tests)."""

    def __init__(self, window: int, step: int):
        self.window, self.step = window, step
        self._buffer: np.ndarray | None = None  # (< window, C) samples from the next window's start on
        self.next_start = 0  # global sample index of the next window's first sample
        self.max_buffered = 0

    def push(self, chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """chunk (n, C) -> (starts (B,) global sample indices, windows (B, C, window)) complete in what has arrived."""
        buf = chunk if self._buffer is None else np.concatenate([self._buffer, chunk])  # (L, C)
        self.max_buffered = max(self.max_buffered, len(buf))
        n = (len(buf) - self.window) // self.step + 1 if len(buf) >= self.window else 0
        windows = np.empty((0, buf.shape[1], self.window), buf.dtype)
        if n:
            view = np.lib.stride_tricks.sliding_window_view(buf, self.window, axis=0)  # (L - window + 1, C, window)
            windows = np.array(view[: n * self.step : self.step])  # (n, C, window), a copy
        starts = self.next_start + self.step * np.arange(n)
        self._buffer = buf[n * self.step :].copy()
        self.next_start += n * self.step
        return starts, windows


class GaussianStream:
    """`gaussian_filter1d(signal, sigma, axis=0, mode='reflect')` of a signal arriving in chunks, bit-identical to
    filtering the concatenation: each output is computed from the same 2r+1 inputs with the same weights; outputs
    wait for r samples of look-ahead, and the true first and last samples are reflected as scipy would."""

    def __init__(self, sigma: float, truncate: float = 4.0):
        self.sigma, self.truncate = sigma, truncate
        self.radius = int(truncate * float(sigma) + 0.5)  # scipy's kernel radius
        self._context: np.ndarray | None = None  # (<= r, C) raw samples just before `_pending`
        self._pending: np.ndarray | None = None  # (n, C) raw samples not smoothed yet

    def _smooth(self, data: np.ndarray) -> np.ndarray:
        return gaussian_filter1d(data, self.sigma, axis=0, mode="reflect", truncate=self.truncate)

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """chunk (n, C) -> the smoothed samples (m, C) that are final now (m may be 0)."""
        pending = chunk if self._pending is None else np.concatenate([self._pending, chunk])
        context = pending[:0] if self._context is None else self._context
        n_out = len(pending) - self.radius
        if n_out <= 0:
            self._pending, self._context = pending, context
            return pending[:0]
        data = np.concatenate([context, pending])
        out = self._smooth(data)[len(context) : len(context) + n_out]
        self._context = data[: len(context) + n_out][-self.radius :].copy() if self.radius else context
        self._pending = pending[n_out:].copy()
        return out

    def finish(self) -> np.ndarray:
        """The last smoothed samples (the signal's end is reflected)."""
        if self._pending is None or len(self._pending) == 0:
            return np.empty((0, 0)) if self._pending is None else self._pending
        context = self._pending[:0] if self._context is None else self._context
        out = self._smooth(np.concatenate([context, self._pending]))[len(context) :]
        self._pending = self._pending[:0]
        return out
