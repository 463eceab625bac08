"""A command arm on a node that has neither its code nor its disk: the worker unpacks the code archive the
controller packed (checked against its SHA-256 name), and the script's whole checkpoints/ folder, named
checkpoints and other files alike, is stored and put back before a resume on a fresh disk. ArmWorker runs
as a plain object with a real file:// store; the script is a stdlib trainer written here."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from orchestrator.grids.command_arms import resolve_command_arm
from orchestrator.runs.command_code import pack_code
from orchestrator.runs.storage import download_run
from tests.kit.polling import final_reply
from worker.actor import ArmWorker

SCRIPT = '''
import json, os, pathlib, sys
run = pathlib.Path(os.environ["ABLATE_RUN_DIR"]); ckpts = run / "checkpoints"; ckpts.mkdir(exist_ok=True)
listing = sorted(p.relative_to(ckpts).as_posix() for p in ckpts.rglob("*") if p.is_file())
print(f"resumed={os.environ['ABLATE_RESUMED']} sees={listing}", file=sys.stderr, flush=True)
if os.environ["ABLATE_RESUMED"] == "1":
    sys.exit(0)
(ckpts / "notes").mkdir(exist_ok=True)
(ckpts / "notes" / "tokenizer.json").write_text("{}")  # a file no metrics line names
(ckpts / "scratch.txt").write_text("deleted before the end")
for step in (10, 20, 30):
    (ckpts / f"step_{step}.txt").write_text(f"weights {step}")
    if step == 20:
        (ckpts / "scratch.txt").unlink()
    with open(os.environ["ABLATE_METRICS_FILE"], "a") as fh:
        fh.write(json.dumps({"step": step, "val_loss": 1 / step, "checkpoint": f"checkpoints/step_{step}.txt"}) + "\\n")
'''


def command_spec(code: Path) -> dict[str, Any]:
    arm = {"name": "mine", "code": str(code), "command": [sys.executable, "train.py"],
           "detector": {"metric": "val_loss"}}
    spec, errors = resolve_command_arm(arm, 0, {})
    assert spec is not None, errors
    return spec.model_dump(mode="json")


def test_code_from_its_archive_and_the_whole_checkpoint_folder_through_storage(tmp_path: Path) -> None:
    code = tmp_path / "controller" / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(SCRIPT)
    archive = pack_code(str(code), [code.parent], max_bytes=1 << 20)
    assert archive is not None
    shipped = tmp_path / "node-a" / "code" / archive.name
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(archive.data)
    (code / "train.py").write_text("raise SystemExit('the controller copy: never run on the node')")
    storage = {"url": f"file://{tmp_path / 'store'}", "keep_last": 1}

    first = final_reply(ArmWorker(1, command_spec(code), str(tmp_path / "node-a" / "run"), storage=storage,
                             code_archive=str(shipped)))  # fmt: skip
    assert first["state"] == "done", first["error"]
    assert [r["step"] for r in first["records"]] == [10, 20, 30]
    stored = tmp_path / "store" / "run" / "checkpoints"
    assert (stored / "notes" / "tokenizer.json").read_text() == "{}"
    assert not (stored / "scratch.txt").exists(), "deleted by the script, deleted in storage"
    download_run(storage["url"], {}, tmp_path / "copied-back", 1 << 30)  # a sweep's copy-back takes the folder too
    assert (tmp_path / "copied-back" / "run" / "checkpoints" / "notes" / "tokenizer.json").read_text() == "{}"

    # Another node, an empty disk: the folder comes back, named checkpoints under their own names.
    second = final_reply(ArmWorker(1, command_spec(code), str(tmp_path / "node-b" / "run"), storage=storage,
                              code_archive=str(shipped)))  # fmt: skip
    assert second["state"] == "done", second["error"]
    said = (tmp_path / "node-b" / "run" / "stderr.log").read_text()
    assert "resumed=1 sees=['notes/tokenizer.json', 'step_10.txt', 'step_20.txt', 'step_30.txt']" in said


def test_a_code_archive_changed_on_the_node_is_refused(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    archive = pack_code(str(code), [tmp_path], max_bytes=1 << 20)
    assert archive is not None
    shipped = tmp_path / archive.name
    shipped.write_bytes(archive.data.replace(b"weights", b"WEIGHTS"))
    reply = final_reply(ArmWorker(2, command_spec(code), str(tmp_path / "run"), code_archive=str(shipped)))
    assert reply["state"] == "error" and "does not match its SHA-256 name" in reply["error"]


def test_a_stored_record_naming_a_checkpoint_outside_the_run_is_never_written(tmp_path: Path) -> None:
    """A node that can write its run's storage prefix leaves a record whose checkpoint_file points out of
    the run directory (say a site-packages .pth beside its bytes); the node that resumes refuses it."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    storage = {"url": f"file://{tmp_path / 'store'}", "keep_last": 1}
    first = final_reply(ArmWorker(3, command_spec(code), str(tmp_path / "node-a" / "run"), storage=storage))
    assert first["state"] == "done", first["error"]
    records = tmp_path / "store" / "records.jsonl"
    assert records.is_file(), sorted(p.name for p in (tmp_path / "store").iterdir())
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    lines[-1]["checkpoint_file"] = "checkpoints/../../../../evil.pth"  # what the hostile node writes
    records.write_text("".join(json.dumps(r) + "\n" for r in lines))
    shutil.rmtree(tmp_path / "store" / "run" / "checkpoints")  # so the restore has a name to put back

    second = final_reply(ArmWorker(3, command_spec(code), str(tmp_path / "node-b" / "run"), storage=storage))
    assert second["state"] == "error" and "not restored" in second["error"], second
    assert not list(tmp_path.rglob("evil.pth")), "the node wrote where a stored record said"
