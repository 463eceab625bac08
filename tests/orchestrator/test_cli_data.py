"""`ablate data prepare` through the console script: a folder with an unreadable file is prepared, the
file listed; the shards train (data.dataset: prepared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from model.data import build_dataset
from model.spec import ArmSpec

ABLATE = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def test_data_prepare_lists_unreadable_files_and_prepares_the_rest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(src / f"{i}.png")
    (src / "3.png").write_bytes(b"not an image")
    (src / "metadata.jsonl").write_text(
        "\n".join(json.dumps({"file_name": f"{i}.png", "text": f"red {i}"}) for i in range(6))
    )
    out = tmp_path / "out"
    cmd = [*ABLATE, "data", "prepare", str(src), "--resolution", "16", "--out", str(out)]
    # 1 of 6 is past the default 1%: exit 2 naming it, and no manifest to train from
    over = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert over.returncode == 2 and "1 of 6 images are unreadable, more than --max-unreadable" in over.stderr
    assert "3.png" in over.stderr and not (out / "manifest.json").exists()
    res = subprocess.run([*cmd, "--max-unreadable", "0.2"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "prepared 5 images in 1 shards at 16 px" in res.stdout and "1 unreadable skipped" in res.stdout
    assert "3.png" in res.stderr and "metadata.jsonl line 4" in res.stderr
    ds = build_dataset(
        ArmSpec.model_validate(
            {
                "model": {"size": "tiny"},
                "eval": {"num_samples": 1},
                "data": {"dataset": "prepared", "path": str(out), "resolution": 16, "held_out": 1},
            }
        )
    )
    assert ds.num_train == 4
    bad = subprocess.run(
        [*ABLATE, "data", "prepare", str(tmp_path / "nope"), "--resolution", "16", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "nope is not a directory" in bad.stderr
