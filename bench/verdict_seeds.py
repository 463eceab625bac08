"""A verdict that survives the next seed (issue 40, item 5): arms A, C and A with lr/10, three training
seeds each, small size, on a folder of real photographs, then the product's own report of the grid and a
measurement of the candidate flow-loss headlines.

Three modes:

    python bench/verdict_seeds.py --photos DIR           # 600 crops of scikit-image's bundled photographs
    python bench/verdict_seeds.py --arm C --seed 1 --data DIR --out OUT   # one run, records to OUT (GPU)
    python bench/verdict_seeds.py --report OUT           # here: the grid through create_grid, its records
                                                         # ingested, report.md + headlines.md written

Each run's spec is the one `POST /api/grids` with `"seeds": 3` stores (resolve_grid + replicate_spec):
training seed s, held-out split of seed 0, the same 64 held-out images and evaluation noise for all nine.
The records keep the whole (image x timestep) flow-loss grid, so every candidate headline is recomputed
from them: today's mean, the loss relative to the comparator at each timestep, the loss in the arms' shared
x-prediction parameterisation (x0 space: velocity error x t^2), and an inverse-variance-weighted mean.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

ARMS = ("A", "C", "A-lr10")
SEEDS = 3
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle_left", "motorcycle_right", "hubble_deep_field",
          "retina", "ihc", "brick", "grass", "gravel", "camera", "coins", "moon", "clock_motion")  # fmt: skip
SUBJECTS = {"astronaut": "an astronaut", "chelsea": "a cat", "coffee": "a cup of coffee", "rocket": "a rocket",
            "motorcycle_left": "a motorcycle", "motorcycle_right": "a motorcycle", "hubble_deep_field": "galaxies",
            "retina": "a retina", "ihc": "stained tissue", "brick": "a brick wall", "grass": "grass",
            "gravel": "gravel", "camera": "a cameraman", "coins": "coins", "moon": "the moon's surface",
            "clock_motion": "a clock"}  # fmt: skip


def make_photos(out: Path, count: int = 600, side: int = 256) -> None:
    """`count` random square crops (a quarter to all of the shorter side, random flips) of the photographs
    scikit-image ships, resized to `side`, with captions.jsonl: a folder of real photographs, offline."""
    import numpy as np
    import skimage
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    folder = Path(skimage.__file__).parent / "data"  # the photographs ship inside the package: nothing fetched
    files = {p.stem: p for p in folder.iterdir()}
    images = {name: np.asarray(Image.open(files[name]).convert("RGB")) for name in PHOTOS}
    lines = []
    for i in range(count):
        name = PHOTOS[i % len(PHOTOS)]
        img = images[name]
        h, w = img.shape[:2]
        crop = int(min(h, w) * rng.uniform(0.25, 1.0))
        y, x = rng.integers(0, h - crop + 1), rng.integers(0, w - crop + 1)
        tile = Image.fromarray(img[y : y + crop, x : x + crop, :3].astype(np.uint8)).resize((side, side), Image.BICUBIC)
        if rng.random() < 0.5:
            tile = tile.transpose(Image.FLIP_LEFT_RIGHT)
        file = f"{i:04d}_{name}.jpg"
        tile.save(out / file, quality=92)
        zoom = "a close-up of" if crop < min(h, w) * 0.5 else "a photograph of"
        lines.append(json.dumps({"file": file, "caption": f"{zoom} {SUBJECTS[name]}"}))
    (out / "captions.jsonl").write_text("\n".join(lines) + "\n")


def grid_body(data: str, steps: int, batch: int, every: int, size: str = "small") -> dict[str, Any]:
    from orchestrator.grids.arms import resolve

    lr = resolve("A", {"model": {"size": "small"}}).schedule.lr
    return {
        "name": "verdict-seeds", "control": "A", "seeds": SEEDS,
        "arms": ["A", "C", {"parent": "A", "name": "A-lr10", "schedule": {"lr": lr / 10}}],
        "overrides": {
            "model": {"size": size},
            "data": {"dataset": "imagefolder", "path": data, "held_out": 64},
            "schedule": {"steps": steps, "batch_size": batch, "warmup_steps": max(1, steps // 10),
                         "checkpoint_every": every, "ema": {"warmup_steps": max(1, steps // 10)}},
            # Offline machine: the labelled stand-in LPIPS; the flow loss judges.
            "eval": {"lpips_backbone": "random_standin", "num_samples": 64, "sampler_steps": 2},
        },
    }  # fmt: skip


def run_spec(body: dict[str, Any], arm: str, seed: int):  # type: ignore[no-untyped-def]
    """The spec `POST /api/grids` stores for (arm, seed)."""
    from orchestrator.grids.replicates import replicate_spec
    from orchestrator.grids.service import GridCreate, resolve_grid

    specs = dict(resolve_grid(GridCreate.model_validate(body)))
    return replicate_spec(specs[arm], seed)


KEEP = ("step", "train_loss", "lr", "iter_per_sec", "tokens_per_sec", "lpips_backbone", "val_flow_loss",
        "val_flow_loss_se", "val_flow_loss_n", "val_flow_loss_samples", "val_flow_loss_by_t", "val_flow_loss_t",
        "val_flow_loss_grid", "val_flow_definition", "recon_lpips", "recon_lpips_se", "recon_lpips_n",
        "recon_lpips_samples", "eval_weights", "data_wait_fraction")  # fmt: skip


def train(args: argparse.Namespace) -> None:
    from worker.train import train_arm

    spec = run_spec(grid_body(str(args.data), args.steps, args.batch, args.every, args.size), args.arm, args.seed)
    path = args.out / f"{args.arm}_s{args.seed}.jsonl"
    path.unlink(missing_ok=True)
    t0 = time.monotonic()
    stop = lambda: time.monotonic() - t0 > args.deadline_s  # noqa: E731
    for rec in train_arm(spec, args.work / f"{args.arm}-{args.seed}", device=args.device, should_stop=stop):
        row = {k: rec.get(k) for k in KEEP}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            args.arm,
            args.seed,
            json.dumps(
                {k: row[k] for k in ("step", "train_loss", "val_flow_loss", "val_flow_loss_se", "iter_per_sec")}
            ),
            flush=True,
        )


# --- here: the product's report of the grid, and the headline candidates --------------------------------


def report(out: Path) -> None:
    from sqlalchemy import select

    from orchestrator.db.models import Run
    from orchestrator.db.session import session_scope, upgrade
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.results.reports.build import build_report
    from orchestrator.results.reports.render import to_markdown
    from orchestrator.runs.ingest import insert_metrics

    url = f"sqlite:///{out / 'verdict.db'}"
    (out / "verdict.db").unlink(missing_ok=True)
    upgrade(url)
    records = {(a, s): [json.loads(x) for x in (out / f"{a}_s{s}.jsonl").read_text().splitlines()]
               for a in ARMS for s in range(SEEDS) if (out / f"{a}_s{s}.jsonl").exists()}  # fmt: skip
    with session_scope(url) as session:
        grid = create_grid(session, GridCreate.model_validate(grid_body("/data", 1000, 32, 250)))
        for run in session.scalars(select(Run).where(Run.grid_id == grid.id)):
            recs = records.get((run.arm, run.seed), [])
            insert_metrics(session, run.id, recs)
            run.state = "completed" if recs else "failed"
        session.flush()
        (out / "report.md").write_text(to_markdown(build_report(session, grid)))
    (out / "headlines.md").write_text(headlines(records))
    print((out / "report.md").read_text())
    print((out / "headlines.md").read_text())


def _cells(rec: dict[str, Any]) -> list[list[float]]:
    return rec["val_flow_loss_grid"]


def candidates(a: list[list[float]], b: list[list[float]], t: list[float], ivw: list[float]) -> dict[str, list[float]]:
    """Per image, arm - comparator under each candidate headline (the paired samples of its difference)."""
    k = len(t)
    ref = [sum(row[j] for row in b) / len(b) for j in range(k)]
    out: dict[str, list[float]] = {"mean": [], "relative": [], "native x0": [], "inverse-variance": []}
    wsum = sum(ivw)
    for ra, rb in zip(a, b, strict=True):
        out["mean"].append(sum(ra[j] - rb[j] for j in range(k)) / k)
        out["relative"].append(sum((ra[j] - rb[j]) / ref[j] for j in range(k)) / k)
        out["native x0"].append(sum((ra[j] - rb[j]) * t[j] ** 2 for j in range(k)) / k)
        out["inverse-variance"].append(sum(ivw[j] * (ra[j] - rb[j]) for j in range(k)) / wsum)
    return out


def owner_share(name: str, b: list[list[float]], t: list[float], ivw: list[float]) -> float:
    """How much of the comparator's headline value its largest timestep contributes (1/K: none owns it)."""
    k = len(t)
    means = [sum(row[j] for row in b) / len(b) for j in range(k)]
    parts = {"mean": means, "relative": [1.0] * k, "native x0": [m * tj**2 for m, tj in zip(means, t, strict=True)],
             "inverse-variance": [w * m for w, m in zip(ivw, means, strict=True)]}[name]  # fmt: skip
    return max(parts) / sum(parts)


def headlines(records: dict[tuple[str, int], list[dict[str, Any]]]) -> str:
    from orchestrator.results.reports.stats import t_quantile

    lines = ["| comparison | headline | per-seed effect / SE | per-seed estimates | mean over seeds | seed SD | "
             "seed SD / abs(mean) | across-seed 95% CI | top timestep's share |", "|---" * 9 + "|"]  # fmt: skip
    for arm in ("C", "A-lr10"):
        per: dict[str, list[tuple[float, float]]] = {}
        shares: dict[str, float] = {}
        for s in range(SEEDS):
            if (arm, s) not in records or ("A", s) not in records:
                continue
            ra, rb = records[(arm, s)][-1], records[("A", s)][-1]
            if ra["step"] != rb["step"]:
                continue
            t = ra["val_flow_loss_t"]
            b = _cells(rb)
            var = [
                sum((row[j] - sum(r[j] for r in b) / len(b)) ** 2 for row in b) / (len(b) - 1) for j in range(len(t))
            ]
            ivw = [1 / v for v in var]
            for name, d in candidates(_cells(ra), b, t, ivw).items():
                mean = sum(d) / len(d)
                se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
                per.setdefault(name, []).append((mean, se))
                shares[name] = max(shares.get(name, 0.0), owner_share(name, b, t, ivw))
        for name, vals in per.items():
            est = [m for m, _ in vals]
            k = len(est)
            mean = sum(est) / k
            sd = math.sqrt(sum((x - mean) ** 2 for x in est) / (k - 1)) if k > 1 else float("nan")
            half = t_quantile(k - 1) * sd / math.sqrt(k) if k > 1 else float("nan")
            sep = ", ".join(f"{abs(m) / se:.1f}" for m, se in vals)
            lines.append(f"| {arm} − A | {name} | {sep} | {', '.join(f'{m:+.4g}' for m in est)} | {mean:+.4g} | "
                         f"{sd:.3g} | {sd / abs(mean):.2f} | [{mean - half:+.4g}, {mean + half:+.4g}] | "
                         f"{shares[name]:.0%} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--photos", type=Path, help="write the photograph folder here and exit")
    p.add_argument("--report", type=Path, help="the records folder: write report.md and headlines.md there")
    p.add_argument("--arm", choices=ARMS)
    p.add_argument("--seed", type=int, choices=range(SEEDS))
    p.add_argument("--data", type=Path)
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--device", default="cuda")
    p.add_argument("--deadline-s", type=float, default=math.inf)
    p.add_argument("--out", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/verdict"))
    args = p.parse_args()
    if args.photos:
        make_photos(args.photos)
    elif args.report:
        report(args.report)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        train(args)


if __name__ == "__main__":
    main()
