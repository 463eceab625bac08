"""The launcher on a module's local Ray, as pytest fixtures (a plugin: tests/conftest.py names it).

`ray_cluster`: this module's Ray with 4 logical GPUs and 2 CPUs; the local node's agent joins it
(ABLATE_RAY_ADDRESS), so the tests reach the workers (pids, kills) from here. `launcher_settings`: a
launcher's settings on it (storage in the test's tmp_path). `launcher`: the launcher started in a thread
of the test process, as in `ablate demo`, stopped after the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # imported when a fixture runs: Ray loads only for the tests that use it
    from orchestrator.runs.launcher import Launcher
    from orchestrator.settings import Settings

RAY_NAMESPACE = "ablate-test"


def launcher_settings_for(database_url: str, storage: Path, ray_address: str, **values: Any) -> Settings:
    """Settings for a launcher on the module's Ray: a 0.2 s poll, one worker
    thread; `values` add to or replace these."""
    from orchestrator.settings import Settings

    return Settings(
        **{
            "database_url": database_url,
            "home_dir": storage,
            "launcher_interval_s": 0.2,
            "worker_threads": 1,
            "ray_namespace": RAY_NAMESPACE,
            "ray_address": ray_address,
            **values,
        }
    )


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    import ray

    ray.init(num_gpus=4, num_cpus=2, namespace=RAY_NAMESPACE, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def launcher_settings(ray_cluster: str, database_url: str, tmp_path: Path) -> Settings:
    return launcher_settings_for(database_url, tmp_path, ray_cluster, max_retries=2)


@pytest.fixture
def launcher(launcher_settings: Settings) -> Iterator[Launcher]:
    from orchestrator.runs.launcher import Launcher

    launched = Launcher(launcher_settings)
    launched.start()
    yield launched
    launched.stop()
