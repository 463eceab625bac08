"""The names of a run directory's files, defined here only: every module that reads or writes one imports it.

The trainer writes them (worker/train_record.py, checkpoint.py, samples.py), the worker stores and fetches
them (worker/checkpoint_store.py), the controller copies them back and serves the samples (orchestrator/runs/storage.py,
orchestrator/results/samples.py). The standard library only, no torch: the controller imports it at no cost.
A run's storage prefix holds the same names as its out_dir.

    ckpt_{step:07d}.pt                     periodic checkpoints (the newest few are kept)
    best.pt                                the best checkpoint so far by the metric the detector judges
                                           (detector.metric and metric_mode; "auto": recon LPIPS, or
                                           val_flow_loss where LPIPS is the stand-in: judged_metric)
    metrics.jsonl                          the trainer's records, one per checkpoint
    records.jsonl                          the actor's records (worker/actor.py), uploaded with metrics.jsonl
    samples/step_{step:07d}/{kind}_{i}.png each evaluation's sample images
    run/                                   a command arm's ABLATE_RUN_DIR (worker/command.py)
    run/checkpoints/...                    its own checkpoints/ folder, stored whole (worker/folder_mirror.py)
    run/trainer_metrics.jsonl              its ABLATE_METRICS_FILE, the script's metric lines
"""

from __future__ import annotations

import re

# A step as written: zero-padded to 7 digits, so names sort by step; a step past 9,999,999 takes more.
STEP_PATTERN = r"\d{7,}"

CKPT_GLOB = "ckpt_*.pt"
CKPT_RE = re.compile(rf"^ckpt_({STEP_PATTERN})\.pt$")
BEST_NAME = "best.pt"
# Periodic checkpoints a run's directory keeps besides best.pt (worker/checkpoint.py prune); the controller
# accepts an evaluation of these steps only (orchestrator/grids/evaluations.py).
KEEP_PERIODIC = 2
METRICS_NAME = "metrics.jsonl"
RECORDS_NAME = "records.jsonl"
RECORD_FILES = (METRICS_NAME, RECORDS_NAME)
# The records one poll hands on at most (worker/actor.py); the controller refuses a longer list, so one
# reply stays quick to check and store. The rest come with the next polls.
RECORDS_PER_POLL = 500
SAMPLES_DIR = "samples"
SAMPLE_STEP_RE = re.compile(rf"^step_({STEP_PATTERN})$")
# What each evaluation draws (model.evaluate): held-out targets, reconstructions, text-only samples and
# the caption/edit pairs of the manipulation metric.
# "own": a command arm's PNGs from ABLATE_RUN_DIR/samples/step_N/ (worker/command.py), its own pictures.
SAMPLE_KINDS = ("target", "recon", "text", "caption", "edit", "own")
SAMPLE_FILE_RE = re.compile(rf"^({'|'.join(SAMPLE_KINDS)})_\d{{1,3}}\.png$")
# The longest side of a built-in arm's sample image (worker/samples.py downscales to it; never above the
# arm's resolution): the controller decodes nothing larger from such an arm.
SAMPLE_MAX_SIDE = 128


# A command arm (worker/command.py): its ABLATE_RUN_DIR, and the checkpoints/ folder in it, stored whole.
COMMAND_RUN_DIR = "run"
COMMAND_CHECKPOINTS_DIR = "checkpoints"  # in ABLATE_RUN_DIR
COMMAND_CHECKPOINTS = f"{COMMAND_RUN_DIR}/{COMMAND_CHECKPOINTS_DIR}"  # in out_dir
# Its ABLATE_METRICS_FILE, in ABLATE_RUN_DIR; not metrics.jsonl: that name is the built-in trainer's.
COMMAND_METRICS_NAME = "trainer_metrics.jsonl"


def ckpt_name(step: int) -> str:
    return f"ckpt_{step:07d}.pt"


def sample_dir(step: int) -> str:
    """A checkpoint's sample folder, relative to out_dir (and to the run's storage prefix)."""
    return f"{SAMPLES_DIR}/step_{step:07d}"
