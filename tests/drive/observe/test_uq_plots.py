from drive.observe.uq_plots import plot_eval


def _report(auroc: float) -> dict:
    signal = {"auroc": auroc, "median_lead_steps": 8.0}
    return {"horizon": 25, "signals": {"epistemic_steer": signal, "total_steer": {**signal, "auroc": None}}}


def test_plot_eval_draws_failure_prediction_and_fallback(tmp_path):
    episodes = [{"seed": s, "return": 900.0 + s % 3, "n_interventions": s % 2} for s in range(1000, 1020)]
    results = {"failure_prediction": _report(0.9), "failure_prediction_no_fallback": _report(0.8),
               "episodes": episodes, "episodes_no_fallback": [{**e, "return": 899.0} for e in episodes]}  # fmt: skip
    path = plot_eval(results, tmp_path / "eval.png")
    assert path is not None and path.stat().st_size > 10_000


def test_plot_eval_without_reports_draws_nothing(tmp_path):
    assert plot_eval({"episodes": []}, tmp_path / "eval.png") is None
    assert not (tmp_path / "eval.png").exists()
