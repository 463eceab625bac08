"""Curves from a tracker, for `ablate import`: a study run elsewhere, judged by ablate's detector and report.

Three forms, besides the curves JSON (orchestrator/results/curves.py):
- a W&B CSV export: a run's history (`_step` and one column per metric, one run per file, named after the
  file) or a chart's export (`Step` and `<run> - <metric>` columns, several runs; `__MIN`/`__MAX` dropped);
  or a CSV of several runs with `run` and `step` columns (PRX's FID / CMMD / DINO-MMD curves take this form);
- W&B offline runs: a `run-<id>.wandb` file, an `offline-run-*` folder or a `wandb/` folder holding them,
  read record by record (the run's name, group, config, summary and history);
- TensorBoard event files: an events file, or a log directory with one folder per run (its scalars).

Each run becomes one curve keyed by its name; a metric logged as `eval/recon_lpips` counts as recon_lpips, and
`CMMD` or `eval/DINO-MMD` as cmmd or dino_mmd.
Malformed input raises CurvesError naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.results.curves import Curve, CurvesError, parse_curves
from orchestrator.trackers.csv_table import checked_name, finite_cell, read_csv_table

# The .wandb transaction log: LevelDB's log format with W&B's file header (wandb's own writer).
WANDB_HEADER = struct.Struct("<4sHB")  # b":W&B", magic 0xBEE1, version 0
WANDB_MAGIC = 0xBEE1
RECORD_HEADER = struct.Struct("<IHB")  # crc32 of (type, data), data length, type
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
TB_EVENTS = "events.out.tfevents."
TFRECORD_HEADER = struct.Struct("<Q")  # a TFRecord's data length
TFRECORD_MAX = 64 << 20  # more than any scalar or image summary a trainer writes


@dataclass
class WandbRun:
    """One W&B run as its offline file holds it."""

    path: Path
    run_id: str = ""
    name: str = ""
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per logged step, `_step` in each


def _wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a .wandb file, each checked against its CRC. A record's chunks are gathered in a
    list and joined once: appending each to the bytes so far took time quadratic in a record's chunks."""
    data = path.read_bytes()
    if len(data) < WANDB_HEADER.size:
        raise CurvesError(f"{path}: not a W&B run file (too short)")
    ident, magic, version = WANDB_HEADER.unpack_from(data)
    if ident != b":W&B" or magic != WANDB_MAGIC or version != 0:
        raise CurvesError(f"{path}: not a W&B run file (header {data[:7]!r})")
    pos, pending = WANDB_HEADER.size, []
    while pos + RECORD_HEADER.size <= len(data):
        if BLOCK - pos % BLOCK < RECORD_HEADER.size:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = RECORD_HEADER.unpack_from(data, pos)
        if (crc, length, kind) == (0, 0, 0):  # zeros: the end of what was written
            break
        chunk = data[pos + RECORD_HEADER.size : pos + RECORD_HEADER.size + length]
        if len(chunk) != length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise CurvesError(f"{path}: damaged record at byte {pos} (length or checksum)")
        pos += RECORD_HEADER.size + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = [chunk]
        elif kind == MIDDLE:
            pending.append(chunk)
        elif kind == LAST:
            yield b"".join([*pending, chunk])
            pending = []
        else:
            raise CurvesError(f"{path}: unknown record type {kind} at byte {pos}")


def _items(items: Any) -> dict[str, Any]:  # noqa: ANN401 - repeated wandb protobuf items
    """Items as a dict; a nested key (an image's fields) becomes nested dicts. ValueError when a nested
    key lies under a value that is not a dict."""
    out: dict[str, Any] = {}
    for item in items:
        value = json.loads(item.value_json)
        if item.key:
            out[item.key] = value
        elif item.nested_key:
            *parents, last = item.nested_key
            node = out
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ValueError(f"nested key {'.'.join(item.nested_key)!r} lies under a value that is not a dict")
            node[last] = value
    return out


def _apply(run: WandbRun, record: Any) -> None:  # noqa: ANN401 - a wandb protobuf Record
    kind = record.WhichOneof("record_type")
    if kind == "run":
        run.run_id, run.name, run.group = record.run.run_id, record.run.display_name, record.run.run_group
        run.config.update(_items(record.run.config.update))
    elif kind == "config":
        run.config.update(_items(record.config.update))
    elif kind == "summary":
        run.summary.update(_items(record.summary.update))
    elif kind == "history":
        row = _items(record.history.item)
        row["_step"] = int(row.get("_step", record.history.step.num))
        run.history.append(row)


def read_wandb_run(path: Path) -> WandbRun:
    """A `run-<id>.wandb` file read back: needs the `wandb` package (its protobuf records)."""
    try:
        from google.protobuf.message import DecodeError
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise CurvesError(f"{path}: reading a W&B run needs its client: pip install 'ablate-dit[wandb]'") from None
    run = WandbRun(path)
    for index, raw in enumerate(_wandb_records(path)):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(raw)
            _apply(run, record)
        # A crafted file: not protobuf, a value that is not JSON, a step that is no integer, too deep.
        except (DecodeError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise CurvesError(f"{path}: record {index} is malformed: {type(exc).__name__}: {exc}"[:2000]) from None
    return run


def _metric_name(key: str) -> str:
    """`eval/recon_lpips` -> recon_lpips when the last part names one of ablate's metrics; a distribution
    metric as papers and PRX's charts write it (FID, CMMD, DINO-MMD, FD-DINOv2) -> fid, cmmd, dino_mmd, fd_dinov2."""
    from model.spec import DISTRIBUTION_METRICS
    from orchestrator.db.models import METRIC_FIELDS

    last = key.rsplit("/", 1)[-1]
    plain = last.strip().lower().replace("-", "_")
    if plain in DISTRIBUTION_METRICS:
        return plain
    return last if last in METRIC_FIELDS else key


def _number(text: Any) -> float | None:  # noqa: ANN401 - a CSV cell or a JSON value
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return float(text)
    if isinstance(text, str) and text.strip():
        try:
            return float(text)
        except ValueError:
            return None
    return None


def _checkpoints(rows: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    return [{"step": step, **values} for step, values in sorted(rows.items()) if values]


def wandb_runs_curves(paths: list[Path]) -> dict[str, Any]:
    """A curves document from W&B run files, in the runs' name order; resumed parts of one run (same id)
    join into one curve."""
    by_id: dict[str, tuple[str, dict[int, dict[str, float]]]] = {}
    for path in paths:
        run = read_wandb_run(path)
        name, rows = by_id.setdefault(run.run_id or str(path), (run.name or run.run_id, {}))
        for row in run.history:
            values = {
                _metric_name(k): v for k, v in ((k, _number(v)) for k, v in row.items() if not k.startswith("_"))
                if v is not None
            }  # fmt: skip
            rows.setdefault(int(row["_step"]), {}).update(values)
    ordered = sorted(by_id.values(), key=lambda pair: pair[0])  # by name: files carry random ids, A_... first
    return {name: {"label": name, "checkpoints": _checkpoints(rows)} for name, rows in ordered}


def _step_of(path: Path, n: int, line: dict[str, Any], column: str) -> int:
    step = _number(line[column])
    if step is None or not math.isfinite(step) or step < 0 or step != int(step):
        raise CurvesError(f"{path}: line {n}: {column} must be a non-negative integer, got {line[column]!r}")
    return int(step)


def wandb_csv_curves(path: Path) -> dict[str, Any]:
    """A curves document from a CSV export: W&B's (a run's history, or a chart's export of several runs), or a
    table of several runs, one row per run and evaluation (`run`, `step` and a column per metric: the form of
    PRX's published FID / CMMD / DINO-MMD curves). Leading `#` lines are comments. Read within caps, a
    non-finite cell refused (trackers/csv_table.py)."""
    columns, table = read_csv_table(path)
    if "run" in columns and "step" in columns:  # several runs, one row per run and step
        by_run: dict[str, dict[int, dict[str, float]]] = {}
        for n, line in table:
            run = checked_name(path, n, (line["run"] or "").strip())
            if not run:
                raise CurvesError(f"{path}: line {n}: the run column is empty: name the run (A_baseline)")
            values = {_metric_name(k): finite_cell(path, n, k, v) for k, v in line.items()
                      if k and k not in ("run", "step")}  # fmt: skip
            rows_of = by_run.setdefault(run, {}).setdefault(_step_of(path, n, line, "step"), {})
            rows_of.update({k: v for k, v in values.items() if v is not None})
        return {run: {"label": run, "checkpoints": _checkpoints(rows)} for run, rows in by_run.items()}
    if "_step" in columns:  # one run's history
        rows: dict[int, dict[str, float]] = {}
        for n, line in table:
            step = _step_of(path, n, line, "_step")
            values = {_metric_name(k): finite_cell(path, n, k, v) for k, v in line.items()
                      if k and not k.startswith("_")}  # fmt: skip
            rows.setdefault(step, {}).update({k: v for k, v in values.items() if v is not None})
        return {path.stem: {"label": path.stem, "checkpoints": _checkpoints(rows)}}
    if "Step" in columns:  # a chart's export: "<run> - <metric>" per column
        runs: dict[str, dict[int, dict[str, float]]] = {}
        for n, line in table:
            step = _step_of(path, n, line, "Step")
            for column, cell in line.items():
                if not column or column == "Step" or " - " not in column or column.endswith(("__MIN", "__MAX")):
                    continue
                run, metric = column.rsplit(" - ", 1)
                value = finite_cell(path, n, column, cell)
                if value is not None:
                    runs.setdefault(run, {}).setdefault(step, {})[_metric_name(metric)] = value
        return {run: {"label": run, "checkpoints": _checkpoints(rows)} for run, rows in runs.items()}
    raise CurvesError(
        f"{path}: not a W&B CSV export nor a table of runs: expected a '_step' (run history) or 'Step' (chart) "
        "column, or 'run' and 'step' columns (one row per run and evaluation)"
    )


def tensorboard_curves(path: Path) -> dict[str, Any]:
    """A curves document from TensorBoard event files: one curve per folder holding them."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise CurvesError(f"{path}: reading TensorBoard events needs: pip install 'ablate-dit[tensorboard]'") from None
    root = path if path.is_dir() else path.parent
    folders = sorted({p.parent for p in root.rglob(f"{TB_EVENTS}*")}) if path.is_dir() else [path.parent]
    doc: dict[str, Any] = {}
    for folder in folders:
        for events in sorted(folder.glob(f"{TB_EVENTS}*")):
            _check_tfrecords(events)
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as exc:  # noqa: BLE001 - TensorBoard's reader raises many kinds on a crafted file
            why = f"{type(exc).__name__}: {exc}"
            raise CurvesError(f"{folder}: TensorBoard could not read its events: {why}"[:2000]) from None
        rows: dict[int, dict[str, float]] = {}
        for tag in acc.Tags()["scalars"]:
            for event in acc.Scalars(tag):
                rows.setdefault(int(event.step), {})[_metric_name(tag)] = float(event.value)
        key = folder.relative_to(root).as_posix() if folder != root else folder.name
        if rows:
            doc[key] = {"label": key, "checkpoints": _checkpoints(rows)}
    return doc


def _check_tfrecords(path: Path) -> None:
    """Walk an events file's record headers (a length, its CRC, the data, the data's CRC) without reading the
    data: a record past the end of the file that claims more than TFRECORD_MAX is refused here, where
    TensorBoard's reader would allocate it (a header claiming 1 TiB was a MemoryError). A shorter one cut
    off at the end is what a writer that died leaves: TensorBoard's reader skips it."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        pos = 0
        while pos + TFRECORD_HEADER.size <= size:
            fh.seek(pos)
            (length,) = TFRECORD_HEADER.unpack(fh.read(TFRECORD_HEADER.size))
            end = pos + TFRECORD_HEADER.size + 4 + length + 4  # the length's CRC, the data, the data's CRC
            if end > size and length > TFRECORD_MAX:
                raise CurvesError(f"{path}: the record at byte {pos} claims {length} bytes, past the end of the "
                                  f"file ({size} bytes)")
            pos = end


def tracker_export_curves(path: Path) -> dict[str, Curve] | None:
    """The curves of a tracker export at `path`, or None when it is none (a curves JSON file)."""
    if path.is_dir():
        wandb_files = sorted(path.rglob("run-*.wandb"))
        if wandb_files:
            doc = wandb_runs_curves(wandb_files)
        elif any(path.rglob(f"{TB_EVENTS}*")):
            doc = tensorboard_curves(path)
        else:
            raise CurvesError(f"{path}: a folder with neither W&B runs (run-*.wandb) nor TensorBoard event files")
    elif path.suffix == ".wandb":
        doc = wandb_runs_curves([path])
    elif path.name.startswith(TB_EVENTS):
        doc = tensorboard_curves(path)
    elif path.suffix.lower() == ".csv":
        doc = wandb_csv_curves(path)
    else:
        return None
    if not doc:
        raise CurvesError(f"{path}: no numeric metrics at any step")
    return parse_curves(doc, source=str(path))
