"""Which evaluation jobs share a worker (runs/evaluation_batch.py `Batches`): the jobs of one evaluation that
land on one node, each under the trust rule its own run holds (its own node, or a trusted one), a job asking
distribution metrics alone, and a batch never past BATCH_RUNS. The rows are the ORM's own, unsaved."""

from __future__ import annotations

from orchestrator.db.models import EvaluationResult, Grid, Run
from orchestrator.grids.evaluations import ASKED
from orchestrator.runs.evaluation_batch import BATCH_RUNS, Batches

_ids = iter(range(1, 10_000))


def job(evaluation: int, node: str | None, grid: Grid, extra: dict | None = None) -> EvaluationResult:
    run = Run(id=next(_ids), arm="A", seed=0, node=node, nodes=[node] if node else [], grid=grid)
    return EvaluationResult(id=next(_ids), evaluation_id=evaluation, run_id=run.id, run=run, step=10,
                            extra=extra or {})  # fmt: skip


def placed(batches: Batches) -> list[tuple[str, list[int]]]:
    return [(node, [j.id for j in jobs]) for node, jobs in batches.batches]


def test_one_evaluations_jobs_on_their_own_node_share_one_worker_and_one_gpu() -> None:
    grid = Grid(name="g", control_on_trusted=False)
    free = {"n1": 2, "n2": 2}
    b = Batches(free, trusted=set())
    jobs = [job(1, "n1", grid), job(1, "n1", grid), job(1, "n2", grid), job(1, "n1", grid), job(2, "n1", grid)]
    assert [b.place(j) for j in jobs] == ["n1", "n1", "n2", "n1", "n1"]
    assert placed(b) == [("n1", [jobs[0].id, jobs[1].id, jobs[3].id]), ("n2", [jobs[2].id]), ("n1", [jobs[4].id])]
    assert free == {"n1": 0, "n2": 1}  # a GPU a batch, not a GPU a run


def test_a_run_joins_another_nodes_batch_only_where_that_node_may_speak_for_it() -> None:
    grid = Grid(name="g", control_on_trusted=False)
    free = {"n1": 1, "n2": 0, "trusted": 0}
    b = Batches(free, trusted={"trusted"})
    first = job(1, "n1", grid)
    assert b.place(first) == "n1"
    stranger = job(1, "n2", grid)  # its own node busy, and n1 never ran it and is not trusted: it waits
    assert b.place(stranger) is None and placed(b) == [("n1", [first.id])]
    nowhere = job(1, None, grid)  # no node on record: only a trusted node may speak for it
    assert b.place(nowhere) is None
    b2 = Batches({"trusted": 1, "n2": 0}, trusted={"trusted"})
    lead, other = job(1, None, grid), job(1, "n2", grid)
    assert (b2.place(lead), b2.place(other)) == ("trusted", "trusted")  # a trusted node speaks for any run


def test_distribution_jobs_run_alone_and_a_batch_is_bounded() -> None:
    grid = Grid(name="g", control_on_trusted=False)
    b = Batches({"n1": 3}, trusted=set())
    asked = {ASKED: {"samples": 64, "metrics": ["cmmd"]}}
    plain, dist, plain2 = job(1, "n1", grid), job(1, "n1", grid, asked), job(1, "n1", grid)
    assert [b.place(j) for j in (plain, dist, plain2)] == ["n1"] * 3
    assert placed(b) == [("n1", [plain.id, plain2.id]), ("n1", [dist.id])]
    big = Batches({"n1": 2}, trusted=set())
    many = [job(3, "n1", grid) for _ in range(BATCH_RUNS + 1)]
    assert all(big.place(j) == "n1" for j in many)
    assert [len(jobs) for _, jobs in big.batches] == [BATCH_RUNS, 1]
