"""The `Degradation` label of the published feature files: a hand-written physics ODE integrated over `Time`.

Source: itxwaleedrazzaq/uqpcnn_rul @ 78aadd56, `labels.ipynb` (the only cell). Six states [fatigue volume V_d, wear
volume V, roughness R, oxidation O, debris C, degradation D] are integrated with `scipy.integrate.odeint` from
y0 = [0, 0, 1e-6, 0, 0, 0] over the file's own `Time` column at the bearing's constant RPM and load and a constant
293.15 K; the label is D min-max normalised to [0, 1]. It is not a measurement: it is a deterministic, monotone
function of `Time` (and RPM/load), which is why the NSAC task must also be run without `Time` among the inputs.

Measured: XJTU-SY Bearing1_1 (8000 rows) is reproduced to 1.8e-14 (max abs). PRONOSTIA files were labelled by a
variant not found in any stored repository: this ODE is within 1.3e-3 of PRONOSTIA Bearing2_1's `Degradation`, and
their `Degradation_monotonic` (about linear in the row index) is not reproduced, so it is not written.
"""

from __future__ import annotations

import numpy as np
from scipy.integrate import odeint

K_B = 8.617e-5  # Boltzmann constant [eV/K]
T_KELVIN = 293.15  # the notebook's constant temperature (T_measured = 293.15 everywhere)
# Constants exactly as in labels.ipynb (its `params` dict); names kept so the two can be read side by side.
P = dict(
    C_load=12000.0, p=3.0, q=4.0, phi=1e-5, beta=1e-6, A_v=1e-5, H_hard=1.5e9, A_a=1e-6, gamma_r=1e-3, delta_c=1e-5,
    eta=1e6, zeta=1e12, k_o=1e-4, O_max=1.0, E_a=0.1, nu0=1e-5, E_vis=0.1, T0=293.15, psi=1e-6, rho=1e6,
    gamma_w=0.5, alpha=1e-5, zeta_L=0.5, m_cp=3.77e6, mu_f=0.005, h_A=5.0, T_a=293.15, xi=100.0, Dm=0.025,
)  # fmt: skip


def _derivatives(y: np.ndarray, t: float, rpm: float, load: float, temp: float) -> list[float]:
    v_d, v, r, o, c_debris, _ = y
    omega = 2.0 * np.pi * rpm / 60.0
    do_dt = P["k_o"] * (P["O_max"] - o) * np.exp(-P["E_a"] / (K_B * temp))
    dtemp_dt = (P["mu_f"] * load * omega - P["h_A"] * (temp - P["T_a"]) + P["xi"] * do_dt) / P["m_cp"]
    nu = P["nu0"] * np.exp(-P["alpha"] * o - P["E_vis"] / (K_B * temp) + P["E_vis"] / (K_B * P["T0"]))
    ds_dt = np.pi * P["Dm"] * (rpm / 60.0)
    w_mod = 1.0 / (1.0 + P["eta"] * v + P["zeta"] * r**2)
    c_eff = P["C_load"] * (nu / P["nu0"]) * w_mod * np.exp(-P["psi"] * c_debris)
    dvd_dt = P["phi"] * (load / c_eff) ** P["q"] * rpm
    dv_dt = (P["A_v"] * load / P["H_hard"]) * ds_dt + P["A_a"] * r
    dr_dt = P["gamma_r"] * dv_dt + P["delta_c"] * c_debris
    dc_dt = P["rho"] * dv_dt
    kf = (load / c_eff) ** P["p"] * rpm / (60.0 * 1e6)
    dd_dt = kf + P["beta"] * dvd_dt + P["gamma_w"] * dv_dt + P["zeta_L"] * dtemp_dt
    return [dvd_dt, dv_dt, dr_dt, do_dt, dc_dt, dd_dt]


def degradation(time: np.ndarray, rpm: float, load: float) -> np.ndarray:
    """(N,) increasing `Time` -> (N,) label in [0, 1] (0 at the first row, 1 at the last)."""
    time = np.asarray(time, dtype=np.float64)
    if len(time) < 2:
        return np.zeros(len(time))
    states = odeint(_derivatives, [0.0, 0.0, 1e-6, 0.0, 0.0, 0.0], time, args=(rpm, load, T_KELVIN))  # (N, 6)
    d = states[:, -1]
    return (d - d.min()) / (d.max() - d.min())
