"""The compile cache on CPU: a compiled module's artefacts are stored under their key, a fresh process with
an empty local cache loads them and compiles nothing afresh, a stored cache of another key is ignored with
the reason, and the trainer points Inductor and Triton at the node's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.grids.arms import resolve
from worker.compile_cache import CompileCache, cache_key, key_name
from worker.train import train_arm

TINY = {"model": {"size": "tiny"}, "data": {"num_images": 16, "held_out": 2, "loader_workers": 0},
        "schedule": {"steps": 2, "batch_size": 2, "checkpoint_every": 2, "warmup_steps": 1},
        "eval": {"num_samples": 1, "sampler_steps": 1, "lpips_backbone": "random_standin"}}

# Compiles a small MLP's forward and backward with the cache given as JSON in argv[1], and prints its status.
COMPILE_ONCE = """
import json, sys, torch
from worker.compile_cache import CompileCache
cache, ingredients = CompileCache.from_dict(json.loads(sys.argv[1])), json.loads(sys.argv[2])
cache.use_node_dirs()
cache.load(ingredients)
torch.manual_seed(0)
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)))
model(torch.randn(4, 8)).sum().backward()
cache.finish(ingredients, write=True)
print(json.dumps(cache.status))
"""


def compile_in_fresh_process(cache: dict[str, Any], ingredients: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", COMPILE_ONCE, json.dumps(cache), json.dumps(ingredients)],
        capture_output=True, text=True, timeout=600, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_compiles_from_the_stored_cache_and_another_key_is_ignored(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    ingredients = cache_key(resolve("A", TINY), "cpu (test)", micro_batch=4, fp8_linears=[])
    first = compile_in_fresh_process({"dir": str(tmp_path / "node1"), "url": store}, ingredients)
    assert first["from"] == "none" and first["graphs_compiled"] > 0 and not first["warm"]
    assert first["note"] == "no stored compile cache yet: compiled cold" and first["stored_bytes"] > 0
    key = key_name(ingredients)
    assert (tmp_path / "store" / f"{key}.bin").is_file()
    assert json.loads((tmp_path / "store" / f"{key}.json").read_text()) == ingredients

    # a fresh node: an empty local cache, the stored one loaded before compiling
    second = compile_in_fresh_process({"dir": str(tmp_path / "node2"), "url": store}, ingredients)
    assert second["from"] == "stored" and second["warm"] is True, second
    assert second["graphs_compiled"] == 0 and second["graphs_cached"] == first["graphs_compiled"]
    assert "stored_bytes" not in second  # nothing new to store

    # another GPU model and micro-batch: never loaded, and the run says in what it differed
    other = cache_key(resolve("A", TINY), "NVIDIA H100 80GB HBM3", micro_batch=8, fp8_linears=[])
    cache = CompileCache(str(tmp_path / "node3"), store)
    cache.load(other)
    assert cache.status["from"] == "none"
    assert cache.status["note"] == (
        "no stored compile cache matches (the nearest differs in device, graph.micro_batch): ignored, compiled cold"
    )


def test_the_trainer_uses_the_nodes_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # restored after the test
        monkeypatch.setenv(env, str(tmp_path / "before"))
    node = tmp_path / "compile-cache"
    records = list(train_arm(resolve("A", TINY), tmp_path / "run", compile_cache={"dir": str(node)}))
    assert records[-1]["step"] == 2
    assert "compile_cache" not in records[-1]  # not compiled (CPU's default): nothing to say
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(node / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(node / "triton")
