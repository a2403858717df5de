from unittest import mock

import numpy as np
from matplotlib.axes import Axes

from drive.observe.uq_plots import eval_figure, plot_eval, plot_ood_scores


def _report(auroc: float) -> dict:
    signal = {"auroc": auroc, "median_lead_steps": 8.0}
    return {"horizon": 25, "signals": {"epistemic_steer": signal, "total_steer": {**signal, "auroc": None}}}


def test_plot_eval_draws_failure_prediction_and_fallback(tmp_path):
    episodes = [{"seed": s, "return": 900.0 + s % 3, "n_interventions": s % 2} for s in range(1000, 1020)]
    results = {"failure_prediction": _report(0.9), "failure_prediction_no_fallback": _report(0.8),
               "episodes": episodes, "episodes_no_fallback": [{**e, "return": 899.0} for e in episodes]}  # fmt: skip
    path = plot_eval(results, tmp_path / "eval.png")
    assert path is not None and path.stat().st_size > 10_000


def _empty_panel_text(ax) -> str:
    """The panel's explanation, after checking it shows no axis, bar, line or legend to misread."""
    assert not ax.axison and not ax.patches and not ax.lines and ax.get_legend() is None
    assert len(ax.texts) == 1
    return ax.texts[0].get_text().replace("\n", " ")


def test_eval_figure_says_in_words_why_a_panel_has_nothing_to_show():
    signals = ("epistemic_steer", "total_steer")
    quiet = {"horizon": 25, "events": {"off_track": 0, "spin": 0, "stall": 0},
             "signals": {s: {"auroc": None, "median_lead_steps": None} for s in signals}}  # fmt: skip
    auroc, lead = eval_figure({"failure_prediction": quiet}).axes
    assert "no failure event" in _empty_panel_text(lead) and "no lead time to show" in _empty_panel_text(lead)
    assert "nothing to score" in _empty_panel_text(auroc)
    assert lead.get_title().startswith("median lead")  # which panel it is stays readable
    # events, scored, but no alarm ran ahead of any: the AUROC bars are drawn, the lead panel says why it is empty
    missed = {**quiet, "events": {"off_track": 2, "spin": 0, "stall": 0},
              "signals": {s: {"auroc": 0.6, "median_lead_steps": None} for s in signals}}  # fmt: skip
    auroc, lead = eval_figure({"failure_prediction": missed}).axes
    assert "no event was foreseen" in _empty_panel_text(lead)
    assert auroc.axison and len(auroc.patches) == 2 and not auroc.texts
    fig = eval_figure({"failure_prediction": _report(0.9)})
    assert all(ax.axison and len(ax.patches) == 2 and not ax.texts for ax in fig.axes)  # leads: bars as before


def test_plot_eval_without_reports_draws_nothing(tmp_path):
    assert plot_eval({"episodes": []}, tmp_path / "eval.png") is None
    assert not (tmp_path / "eval.png").exists()


def test_ood_figure_names_a_constant_score_instead_of_a_degenerate_histogram(tmp_path):
    rng = np.random.default_rng(0)
    spread = {"clean": {"epistemic_all": rng.random(50)}, "noise:0.1": {"epistemic_all": rng.random(50) + 1}}
    flat = {view: {"epistemic_all": np.zeros(50)} for view in spread}  # GMLE: no epistemic term
    with mock.patch.object(Axes, "hist", autospec=True, side_effect=Axes.hist) as hist, \
            mock.patch.object(Axes, "text", autospec=True) as text:  # fmt: skip
        plot_ood_scores({"nsac": spread, "gmle": flat}, ["noise:0.1"], tmp_path / "ood.png")
    assert hist.call_count == 2  # clean and perturbed for nsac only
    assert text.call_count == 1 and "no epistemic term" in text.call_args.args[3]
    assert (tmp_path / "ood.png").stat().st_size > 5_000
