"""Experiment trackers as sinks on the controller: W&B, TensorBoard and MLflow get what the controller ingests.

A grid names its trackers (its body's `trackers`, else ABLATE_TRACKERS). The controller forwards each run's
checkpoints (metrics with their SEs, the judged metric), sample images, resolved spec, state changes and the
detector's decision from its own database (`forwarder.py`), so nodes send nothing to a tracker and no tracker
key ever reaches one. Each tracker's official client is an optional extra, imported only when named
(`clients.py`). `exports.py` reads the other way: a W&B export or TensorBoard event files as curves for
`ablate import`.
"""
