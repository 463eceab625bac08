"""The soak benchmark's environment (bench/soak.py): Postgres, tmpfs storage, a local Ray and the controller
process it runs, restarts and kills."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SYNTHETIC = "orchestration:synthetic_train"  # importable by the workers: BENCH_DIR is on their PYTHONPATH
TOKEN = "soak-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PG_BIN = Path("/usr/lib/postgresql/15/bin")
sys.path.insert(0, str(REPO))  # the product and the test kit, for this script and the controller it starts

from tests.kit.net import free_port  # noqa: E402  (the repository is on sys.path only now)

__all__ = ["AUTH", "BENCH_DIR", "PG_BIN", "REPO", "SYNTHETIC", "TOKEN", "Env", "controller_main", "free_port"]


# -- the controller process ------------------------------------------------------------------------------


def controller_main() -> None:
    """`python bench/soak_env.py controller` (Env.start_controller): the app `ablate serve` runs, its launcher on
    the synthetic stream."""
    import uvicorn

    from orchestrator.runs.launcher import Launcher
    from orchestrator.server import build_app
    from orchestrator.settings import load_settings

    settings = load_settings()
    worker_env = {
        "PYTHONPATH": f"{BENCH_DIR}:{REPO}",
        "ABLATE_BENCH_RECORD_DELAY_S": os.environ["ABLATE_BENCH_RECORD_DELAY_S"],
    }
    os.environ.update(worker_env)  # the local node's agent, its Ray and workers inherit it
    app = build_app(settings)
    launcher = Launcher(settings, train_fn=SYNTHETIC)
    app.state.startup_hooks.append(lambda _app: launcher.start())
    app.state.shutdown_hooks.append(lambda _app: launcher.stop())
    uvicorn.run(app, host="127.0.0.1", port=settings.port, log_level="warning")


# -- the environment: Postgres, tmpfs storage, Ray, the controller -----------------------------------------


@dataclass
class Env:
    root: Path
    pg_dir: Path
    pg_port: int
    storage: Path
    api_port: int
    ray_address: str = ""
    controller: subprocess.Popen | None = None
    controller_log: Any = None
    rss_peak_kb: int = 0
    rss_samples: list[int] = field(default_factory=list)

    @property
    def db(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(self.pg_dir), "-w", *args],
            check=True, capture_output=True, timeout=120,
        )

    def start_postgres(self) -> None:
        self.root.chmod(0o711)  # the postgres user must reach its data directory inside our temp dir
        self.pg_dir.mkdir(parents=True)
        shutil.chown(self.pg_dir, "postgres", "postgres")
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-A", "trust", "-U", "postgres", "-D",
             str(self.pg_dir)], check=True, capture_output=True, timeout=120,
        )
        opts = f"-p {self.pg_port} -k {self.pg_dir} -c listen_addresses=127.0.0.1 -c fsync=on"
        self.pg_ctl("-o", opts, "-l", str(self.pg_dir / "log"), "start")

    def mount_storage(self, size_mb: int) -> None:
        self.storage.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(self.storage)],
                       check=True)

    def start_controller(self, delay_s: float) -> None:
        env = {
            **os.environ,
            "ABLATE_DATABASE_URL": self.db,
            "ABLATE_API_TOKEN": TOKEN,
            "ABLATE_HOME_DIR": str(self.storage),
            "ABLATE_PORT": str(self.api_port),
            "ABLATE_RAY_ADDRESS": self.ray_address,
            "ABLATE_RAY_NAMESPACE": "ablate-soak",
            "ABLATE_MAX_RETRIES": "20",  # many kill -9s: a run must not run out of retries in the soak
            "ABLATE_LAUNCHER_INTERVAL_S": "0.5",
            "ABLATE_BENCH_RECORD_DELAY_S": str(delay_s),
            "PYTHONPATH": f"{REPO}:{BENCH_DIR}",
        }
        self.controller_log = (self.root / "controller.log").open("a")
        self.controller = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "controller"], env=env, cwd=self.root,
            stdout=self.controller_log, stderr=subprocess.STDOUT,
        )

    def sample_rss(self) -> None:
        proc = self.controller
        if proc is None or proc.poll() is not None:
            return
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kb = int(line.split()[1])
                    self.rss_samples.append(kb)
                    self.rss_peak_kb = max(self.rss_peak_kb, kb)
        except OSError:
            pass


if __name__ == "__main__":  # Env.start_controller runs this file: the entry point lives beside what starts it
    if sys.argv[1:2] != ["controller"]:
        raise SystemExit("usage: soak_env.py controller (bench/soak.py starts it; run bench/soak.py instead)")
    controller_main()
