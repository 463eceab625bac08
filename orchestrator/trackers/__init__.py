"""Experiment trackers as sinks on the controller: W&B, TensorBoard and MLflow get what the controller ingests.

A grid names its trackers (its body's `trackers`, else ABLATE_TRACKERS). The controller forwards each run's
checkpoints (metrics with their SEs, the judged metric), sample images, resolved spec, state changes and the
detector's decision from its own database (`forwarder.py`) to one sink per tracker (`wandb_sink.py`,
`tensorboard_sink.py`, `mlflow_sink.py`, each implementing `base.py`), so nodes send nothing to a tracker and no tracker
key ever reaches one. Each tracker's official client is an optional extra, imported only when named
(a grid naming a missing one is refused by `orchestrator/grids/tracker_choice.py`). Each grid's effects
table (its report's intervals, decisions and what each covers) follows its runs (`grid_verdict.py`).
`exports.py` reads the other way: a W&B export or TensorBoard event files as curves for `ablate import`.

May import: `orchestrator.db`, the shared top-level modules, `runs` (the judged metric, the stored series)
and `results` (sample files). The launcher is handed a `Forwarder` by the server; it never imports this.
"""
