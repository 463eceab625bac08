"""The run directory's names: one step pattern for checkpoints and sample folders, spelled in run_files
only, and the module free of torch (the controller imports it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from worker import run_files
from worker.run_files import CKPT_RE, SAMPLE_FILE_RE, SAMPLE_STEP_RE, ckpt_name, sample_dir

ROOT = Path(__file__).resolve().parents[2]
# Copied next to a researcher's script, so the standard library only: its defaults outside ablate are its own.
STANDALONE = {"worker/command_client.py"}


def test_checkpoints_and_sample_folders_read_back_the_step_they_were_written_with() -> None:
    for step in (0, 30, 5000, 9_999_999, 12_345_678):
        ckpt = CKPT_RE.match(ckpt_name(step))
        folder = SAMPLE_STEP_RE.match(sample_dir(step).rsplit("/", 1)[-1])
        assert ckpt is not None and folder is not None, step
        assert int(ckpt.group(1)) == int(folder.group(1)) == step


def test_names_this_code_never_writes_are_not_a_run_file() -> None:
    for name in ("ckpt_30.pt", "ckpt_0000030.pt.partial", "ckpt_-000003.pt", "ckpt_0000030.pth"):
        assert CKPT_RE.match(name) is None, name
    for name in ("step_30", "step_../../x", "step_0000030x"):
        assert SAMPLE_STEP_RE.match(name) is None, name
    assert SAMPLE_FILE_RE.match("recon_3.png") and not SAMPLE_FILE_RE.match("../recon_3.png")


def _code_strings(tree: ast.Module) -> list[ast.Constant]:
    """String constants of a module other than its docstrings (prose may name a file)."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_but_run_files_spells_a_run_file_name() -> None:
    names = {run_files.BEST_NAME, run_files.COMMAND_METRICS_NAME, *run_files.RECORD_FILES}
    spelled = []
    for package in ("worker", "model", "orchestrator"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in STANDALONE or path == Path(run_files.__file__):
                continue
            for const in _code_strings(ast.parse(path.read_text())):
                if const.value in names or const.value.startswith("ckpt_"):
                    spelled.append(f"{rel}:{const.lineno} {const.value!r}")
    assert spelled == [], "import the name from worker/run_files.py instead"


def test_the_names_import_without_torch() -> None:
    code = "import sys, worker.run_files, orchestrator.runs.storage; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
