"""The compile cache: what torch.compile built, kept on the node and, optionally, stored so that a fresh
node compiles from it instead of from nothing.

Measured on four H100s (seed size): compiling took 115-124 s per arm with a cold cache and 14.8 s with
the Inductor cache a previous run left on disk, and a rented node starts cold every night. So:

- On the node, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR point into `dir` (under the node's storage
  directory, not /tmp), so every arm and every night on that node reuses what the node compiled.
- With a store (`url`, ABLATE_COMPILE_CACHE_URL; fsspec, the checkpoint store's options), rank 0 saves
  the compile artefacts of its first steps (torch.compiler.save_cache_artifacts: Inductor's graphs and
  kernels, AOTAutograd's, autotuning) as `<url>/<key>.bin`, with `<key>.json` saying what the key is made
  of. An arm on a fresh node loads the artefacts of its key before its first step
  (torch.compiler.load_cache_artifacts). The key is what makes them valid: torch, CUDA and Triton
  versions, the device, and the spec fields and sizes that shape the graphs. A stored cache of another
  key is never loaded; the run says which ingredients differed.

Every record carries `compile_cache`: where the cache came from (`stored`, the node's own `local`, or
`none`), the graphs found in it and compiled afresh (Inductor's counters), so cold or warm is measured
rather than assumed; `compile_s` beside it is how long the first step took. Imports torch and fsspec.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Spec sections whose every field may change a compiled graph (shapes, modules, the optimizer's step).
GRAPH_SECTIONS = ("model", "precision", "tread", "repa", "flow", "adaln", "optimizer")
MAX_NEAREST = 64  # stored keys read to say why none matched


def versions(device_name: str) -> dict[str, Any]:
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "torch": str(torch.__version__), "cuda": torch.version.cuda, "triton": triton_version, "device": device_name
    }


def cache_key(spec: Any, device_name: str, micro_batch: int, fp8_linears: list[str]) -> dict[str, Any]:  # noqa: ANN401 - model.spec.ArmSpec
    """What a compile cache is valid for (its hash names the stored file)."""
    dumped = spec.model_dump(mode="json")
    graph = {k: dumped[k] for k in GRAPH_SECTIONS}
    graph |= {"resolution": spec.resolution(), "text_encoder": spec.data.text_encoder, "micro_batch": micro_batch,
              "fp8_linears": sorted(fp8_linears)}
    return {**versions(device_name), "graph": graph}


def key_name(ingredients: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ingredients, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class CompileCache:
    """One process's compile cache (built by the controller as a dict: worker_args' `compile_cache`)."""

    dir: str  # the node's persistent cache directory
    url: str | None = None  # the store's prefix; None: the node's own cache only
    options: dict[str, Any] = field(default_factory=dict)  # fsspec storage options
    status: dict[str, Any] = field(default_factory=dict)  # what each record says (`compile_cache`)
    _before: tuple[int, int] = (0, 0)  # Inductor's (hits, misses) when this run began: the counters are global

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompileCache:
        return cls(**d)

    def use_node_dirs(self) -> None:
        """Point Inductor and Triton at the node's directory; before anything compiles in this process."""
        root = Path(self.dir)
        for env, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
            (root / sub).mkdir(parents=True, exist_ok=True)
            os.environ[env] = str(root / sub)

    def _fs(self) -> Any:  # noqa: ANN401 - an fsspec filesystem
        import fsspec

        fs, path = fsspec.core.url_to_fs(self.url, **self.options)
        return fs, path.rstrip("/")

    def load(self, ingredients: dict[str, Any]) -> None:
        """Before the first step: the stored artefacts of this key into the local caches, if any."""
        key = key_name(ingredients)
        self._before = _graph_counts()
        warm_node = next((p for p in Path(self.dir).rglob("*") if p.is_file()), None) is not None
        self.status = {"from": "local" if warm_node else "none", "key": key}
        if self.url is None:
            return
        import torch

        t0 = time.perf_counter()
        try:
            fs, root = self._fs()
            blob = f"{root}/{key}.bin"
            if not fs.exists(blob):
                self.status["note"] = self._nearest(fs, root, ingredients)
                return
            torch.compiler.load_cache_artifacts(fs.cat_file(blob))
        except Exception as exc:  # noqa: BLE001 - a cache is an optimisation: compile cold, and say why
            self.status["note"] = f"stored compile cache not loaded: {type(exc).__name__}: {exc}"[:500]
            return
        self.status |= {"from": "stored", "load_s": round(time.perf_counter() - t0, 3)}

    def _nearest(self, fs: Any, root: str, ingredients: dict[str, Any]) -> str:  # noqa: ANN401
        """Why no stored cache matched: the ingredients in which the nearest stored key differs."""
        best: list[str] | None = None
        for path in sorted(fs.glob(f"{root}/*.json"))[:MAX_NEAREST]:
            try:
                other = json.loads(fs.cat_file(path))
            except (OSError, ValueError):
                continue
            graph, theirs = ingredients["graph"], other.get("graph") or {}
            differ = [k for k in ingredients if k != "graph" and other.get(k) != ingredients[k]]
            differ += [f"graph.{k}" for k in graph if theirs.get(k) != graph[k]]
            if best is None or len(differ) < len(best):
                best = differ
        if best is None:
            return "no stored compile cache yet: compiled cold"
        return f"no stored compile cache matches (the nearest differs in {', '.join(best)}): ignored, compiled cold"

    def finish(self, ingredients: dict[str, Any], write: bool) -> None:
        """After the first steps (everything compiled): count what came from the cache and, on rank 0
        (`write`), store the artefacts when anything was compiled afresh."""
        hits, misses = (now - before for now, before in zip(_graph_counts(), self._before, strict=True))
        self.status |= {"graphs_cached": hits, "graphs_compiled": misses, "warm": misses == 0 and hits > 0}
        if self.url is None or not write or misses == 0:
            return
        import torch

        t0 = time.perf_counter()
        try:
            saved = torch.compiler.save_cache_artifacts()
            if saved is None:
                return
            fs, root = self._fs()
            key = key_name(ingredients)
            fs.makedirs(root, exist_ok=True)
            fs.pipe_file(f"{root}/{key}.bin.part", saved[0])
            fs.mv(f"{root}/{key}.bin.part", f"{root}/{key}.bin")  # whole or absent for the next reader
            fs.pipe_file(f"{root}/{key}.json", json.dumps(ingredients, sort_keys=True).encode())
        except Exception as exc:  # noqa: BLE001 - the run trains on; the next node compiles cold, and says so
            self.status["store_note"] = f"compile cache not stored: {type(exc).__name__}: {exc}"[:500]
            return
        self.status |= {"stored_bytes": len(saved[0]), "store_s": round(time.perf_counter() - t0, 3)}


def _graph_counts() -> tuple[int, int]:
    """Inductor's graphs found in its cache and compiled afresh, so far in this process."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
