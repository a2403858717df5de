"""Per-column affine scaling fitted on training rows only, shared by the loaders (UCI, forecasting series).

`Scaler.fit(kind, rows)` with kind `standard` (mean / population std: sklearn StandardScaler, Gal's net.py) or
`minmax` (min / max - min: sklearn MinMaxScaler to [0, 1]); `transform`, `inverse_transform` (values or predicted
means back to original units), `inverse_var` (variances: times scale^2), `column(j)` (one column's scaler).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Scaler:
    """Per-column affine map z = (v - offset) / scale, fitted on training rows only.

    `standard`: offset = mean, scale = population std (Gal's net.py, sklearn StandardScaler); `minmax`: offset =
    min, scale = max - min (sklearn MinMaxScaler to [0, 1]). A column constant on the fit rows gets offset = its
    value and scale 1, so it maps to 0 instead of 0 / 0.
    """

    kind: str
    offset: np.ndarray  # (C,) float64, or () for a single column
    scale: np.ndarray  # (C,) float64, > 0

    @classmethod
    def fit(cls, kind: str, rows: np.ndarray) -> Scaler:
        rows = np.asarray(rows, dtype=np.float64)  # (N, C) or (N,)
        low, high = rows.min(axis=0), rows.max(axis=0)
        if kind == "standard":
            offset, scale = rows.mean(axis=0), rows.std(axis=0)
        elif kind == "minmax":
            offset, scale = low, high - low
        else:
            raise ValueError(f"scaler kind {kind!r} is not 'standard' or 'minmax'")
        constant = high == low
        return cls(kind, np.where(constant, low, offset), np.where(constant, 1.0, scale))

    def transform(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values, dtype=np.float64) - self.offset) / self.scale

    def inverse_transform(self, scaled: np.ndarray) -> np.ndarray:
        """Scaled values (or predicted means) back to original units."""
        return np.asarray(scaled, dtype=np.float64) * self.scale + self.offset

    def inverse_var(self, scaled_var: np.ndarray) -> np.ndarray:
        """Variances in scaled units back to original units (times scale^2)."""
        return np.asarray(scaled_var, dtype=np.float64) * self.scale**2

    def column(self, j: int) -> Scaler:
        """The scaler of column j alone (e.g. the target of a multi-column series)."""
        return Scaler(self.kind, self.offset[j], self.scale[j])
