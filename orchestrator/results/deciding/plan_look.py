"""A deciding grid's look as one pure function: `plan_look` takes what the look knows (each comparison's
reading, each arm's seeds, the images asked and measured, the spend and the budget) and returns each
comparison's decision and the work to queue. results/deciding/decider.py `take_look` only gathers that
state from the database and queues the work; bench/decide_sim.py calls `plan_look` on simulated studies,
so the simulation measures the product's own rule, and so does the submit answer's expected GPU-hours
(expected.py).

Where the looks fall (issue 62): at seed size an evaluation of a run on the split's images costs a few
percent of training it (a look's evaluation of the flow loss alone, far less), so a comparison is first
evaluated on every image the split allows (`images_first`) and only then judged; after that a look buys
seeds, up to the next planned seed count (`planned_seeds`: 2, 3, 4, 5, 6, 8), not one seed at a time:
each look spends alpha and a wave's start, and looks at planned seed counts spend both where they buy most.
Where an evaluation is not cheap beside a seed (a short run whose evaluation is
mostly its job's start), the chooser (sequential.py `choose_action`) weighs images against a seed as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding import sequential
from orchestrator.results.deciding.budget import next_images, refusal_of
from orchestrator.results.deciding.decisions import CLOSED, ComparisonLook, futility_of

# An evaluation of every run on the split's images costs at most this share of one more seed of both arms:
# evaluate them all before judging (at seed size and the eval defaults, 256 images are about 600 GPU-s on an
# H100 against 3.2 GPU-h a run, about 5%: docs/benchmarks.md, issue 62's evaluation cost).
IMAGES_FIRST_SHARE = 0.1
NOT_JUDGED = "not judged yet"  # the reason of a comparison asking to be evaluated on the split's images first


def planned_seeds(min_seeds: int, max_seeds: int) -> tuple[int, ...]:
    """The seed counts a grid looks at: min_seeds, then each about 1.25 times the one before (2, 3, 4, 5, 6,
    8, 10, 12, 15, ...), ending at max_seeds. Why not every seed: each look spends a wave's wait and a slice
    of alpha. Why not sparser (2, 3, 5, 8, as first built): the levels of few df are the sequential t
    tests' own (levels.py seed_limit_levels), so a look costs little alpha, and a comparison that is
    decided at 4 or 6 seeds stops paying for seeds it does not need; in bench/decide_sim.py the denser
    counts cost 5% to 10% fewer GPU-hours at the same power (docs/benchmarks.md, issue 62)."""
    counts = [min_seeds]
    while counts[-1] < max_seeds:
        counts.append(min(max_seeds, max(counts[-1] + 1, round(counts[-1] * 1.25))))
    return tuple(counts)


def next_seed_count(k: int, min_seeds: int, max_seeds: int) -> int:
    """The planned seed count after k (max_seeds at most; k itself where k is at max_seeds)."""
    return next((c for c in planned_seeds(min_seeds, max_seeds) if c > k), max(k, min(max_seeds, k + 1)))


@dataclass(frozen=True)
class Reading:
    """One comparison as the look reads it: its effect (the report's, or as a borrowed seed variance reads it),
    the variance components that project it and what its actions cost. `se` None: no interval to judge (one
    seed, a failed run); `note`: what the look's reason adds (the seed variance's source, or why it was not
    borrowed)."""

    arm: str
    against: Literal["parent", "control"]
    other_arm: str
    metric: str
    diff: float
    low: float | None
    high: float | None
    k: int
    n: int | None
    se: float | None
    df: float | None
    variance: sequential.Variance | None
    costs: sequential.Costs
    standin: bool = False
    note: str = ""

    def key(self) -> tuple[str, str, str]:
        return self.arm, self.metric, self.against


@dataclass(frozen=True)
class LookState:
    """What a look knows. `decide`: the grid's spec with its caps, its alpha the comparison's (familywise:
    alpha/m); `look`: this look's number (1-based); `seeds`: each arm's seeds (queued or run);
    `images_asked`: the largest evaluation's images (None: the training records'); `max_images`: the images
    an evaluation may ask for (decide.max_images within the split), `readable` of them measurable, `short`
    the reason's note where fewer; `spent`: GPU-hours so far, `evaluations` so far; `seed_hours`: one more
    run of each arm, `evaluation_start`/`evaluation_image`: an evaluation of every run costs start + images x
    this; `stopped` (the user stopped a run), `last_look` (decide.max_looks), `failed` (an evaluation
    failed: no images action)."""

    readings: Sequence[Reading]
    decide: DecideSpec
    look: int
    seeds: Mapping[str, int]
    images_asked: int | None
    max_images: int
    readable: int
    spent: float
    seed_hours: Mapping[str, float]
    evaluation_start: float
    evaluation_image: float
    evaluations: int = 0
    previous: Mapping[tuple[str, str, str], ComparisonLook] = field(default_factory=dict)
    short: str = ""
    stopped: bool = False
    last_look: bool = False
    failed: bool = False


@dataclass(frozen=True)
class Work:
    """The work a look queues: an evaluation of every run on `images` images, or `seeds`: each arm's seed
    count after the work (its new runs queued up to it), at `hours` GPU-hours; none where both are empty."""

    images: int | None = None
    seeds: Mapping[str, int] = field(default_factory=dict)
    hours: float = 0.0


@dataclass(frozen=True)
class LookPlan:
    comparisons: list[ComparisonLook]
    work: Work
    refusal: str | None  # the cap that refused the work, in words, where one did


def _base(r: Reading) -> dict:
    return dict(arm=r.arm, against=r.against, other_arm=r.other_arm, metric=r.metric, diff=r.diff, low=r.low,
                high=r.high, k=r.k, n=r.n)  # fmt: skip


def images_first(r: Reading, max_images: int) -> bool:
    """Evaluate the comparison on every image the split allows before judging it: fewer measured, and the
    evaluation of its runs costs at most IMAGES_FIRST_SHARE of one more seed of both arms."""
    n = r.n or 1
    if n >= max_images:
        return False
    evaluation = 2 * r.k * (r.costs.image_job + max_images * r.costs.image)
    return evaluation <= IMAGES_FIRST_SHARE * (r.costs.seed_a + r.costs.seed_b)


def judge(r: Reading, decide: DecideSpec, look: int, max_images: int, at_seeds: bool, at_images: bool,
          previous: ComparisonLook | None) -> ComparisonLook:  # fmt: skip
    """One comparison at this look: a closed comparison keeps its decision (and the look it was taken at); an
    open one not yet evaluated on the split's images asks for them first (images_first, no alpha spent);
    else it is judged against this look's boundary (sequential.py `decide`) with the fractions its earlier
    looks recorded, and an open one gets its next action (a seed: to the next planned seed count)."""
    base = _base(r)
    if previous is not None and previous.decision in CLOSED:  # closed for good: never judged again
        return previous.model_copy(update={**base, "action": None})
    fractions = list(previous.fractions) if previous is not None else []
    looked = list(previous.seeds) if previous is not None else []  # each judged look's seeds
    spent = previous.alpha_spent if previous is not None else 0.0
    if r.standin:  # a stand-in network's metric (LPIPS, or a distribution metric's extractor) carries no verdict
        words = f"{r.metric} from a random stand-in network: never called better or worse"
        return ComparisonLook(**base, decision="undecided", look=look, fractions=fractions, seeds=looked,
                              alpha_spent=spent, reason=words)
    max_images = max(max_images, r.n or 1)  # already past it (the training records' n): at the budget
    if not at_images and images_first(r, max_images):
        return ComparisonLook(**base, decision="open", look=look, fractions=fractions, seeds=looked, alpha_spent=spent,
                              action="images", reason=f"{NOT_JUDGED}: first evaluated on the split's {max_images} "
                              "images (an evaluation costs little beside a seed)" + r.note)  # fmt: skip
    if r.se is None or r.variance is None or not r.se > 0:  # no interval yet: open until the budget
        action = None if at_seeds else "seed"  # one seed (min_seeds 1) or a failed run: a seed gives one
        return ComparisonLook(**base, decision="open" if action else "undecided", look=look, alpha_spent=spent,
                              fractions=fractions, seeds=looked, action=action,
                              reason="no interval across seeds to judge" + r.note)  # type: ignore[arg-type]  # fmt: skip
    v, n = r.variance, r.n or 1
    projected = sequential.projected_fraction(v, r.k, n, decide.max_seeds, max_images)
    fractions.append(sequential.information_fraction(v, r.k, n, decide.max_seeds, max_images))
    # a look recorded before the seeds were kept leaves the list short of the fractions: Bonferroni's levels
    seeds = [*looked, r.k]
    verdict = sequential.decide(r.diff, r.se, r.df, fractions, k=r.k, n=n, alpha=decide.alpha, direction="lower",
                                margin=decide.margin.get(r.metric) or None, last=at_seeds and at_images,
                                futility=futility_of(decide), futility_fraction=projected, seeds=seeds,
                                max_seeds=decide.max_seeds)  # fmt: skip
    base.update(low=verdict.low, high=verdict.high)  # the look's repeated confidence interval
    c = ComparisonLook(**base, decision=verdict.decision.value, look=look, alpha_spent=verdict.alpha_spent,
                       fractions=fractions, seeds=seeds, reason=verdict.reason + r.note)  # type: ignore[arg-type]  # fmt: skip
    if c.decision == "open":
        act = sequential.choose_action(v, r.k, n, r.costs, max_seeds=decide.max_seeds if not at_seeds else r.k,
                                       max_images=max_images if not at_images else n)  # fmt: skip
        c.action = None if act.kind == "none" else act.kind
        c.decision = "open" if c.action is not None else "undecided"
    return c


def plan_work(comparisons: Sequence[ComparisonLook], s: LookState) -> tuple[Work, str | None]:
    """The work for the open comparisons: an evaluation on more images where any asks for one (it serves
    every comparison), to the split's readable images where one asks to be evaluated on them first, else the
    images step (budget.py next_images); else the seeds: each arm an open comparison asks a seed for (both
    its arms) up to the next planned seed count, below max_seeds. No work where the images asked are no
    more than the grid's largest evaluation asked for, or where it would pass the budget's caps (the
    refusal says which)."""
    open_ = [c for c in comparisons if c.decision == "open"]
    step = next_images(s.max_images, s.images_asked, max((c.n or 0 for c in open_), default=0))
    first = any(c.action == "images" and c.reason.startswith(NOT_JUDGED) for c in open_)
    n = s.max_images if first and max(s.images_asked or 0, *(c.n or 0 for c in open_)) < s.readable else step
    if n is None:
        for c in open_:
            c.action = None if c.action == "images" else c.action  # no images left to ask for
    if n is not None and any(c.action == "images" for c in open_):
        cost = s.evaluation_start + n * s.evaluation_image
        refusal = refusal_of(s.decide, s.spent, s.evaluations, cost, True)
        if refusal is not None:
            return Work(), refusal
        for c in open_:
            c.action = "images"  # one evaluation serves every open comparison this wave
        return Work(images=n, hours=cost), None
    want: dict[str, int] = {}
    for c in open_:
        if c.action != "seed":
            continue
        to = next_seed_count(c.k, s.decide.min_seeds, s.decide.max_seeds)
        for arm in (c.arm, c.other_arm):
            if s.seeds.get(arm, 0) < s.decide.max_seeds:
                want[arm] = max(want.get(arm, 0), min(max(to, s.seeds.get(arm, 0) + 1), s.decide.max_seeds))
    seeds = {a: want[a] for a in s.seeds if a in want}  # in the grid's arm order
    if not seeds:
        return Work(), None
    cost = sum(s.seed_hours.get(a, 0.0) * (k - s.seeds.get(a, 0)) for a, k in seeds.items())
    refusal = refusal_of(s.decide, s.spent, s.evaluations, cost, False)
    if refusal is not None:
        return Work(), refusal
    return Work(seeds=seeds, hours=cost), None


def plan_look(s: LookState) -> LookPlan:
    """Each comparison's decision at this look and the work to queue (pure: the decider and the simulation
    both call it). A comparison still open when no work can be queued is closed undecided, its reason saying
    which cap refused it."""
    comparisons: list[ComparisonLook] = []
    for r in s.readings:
        most = max(s.seeds.get(r.arm, 0), s.seeds.get(r.other_arm, 0))
        at_seeds = s.stopped or s.last_look or most >= s.decide.max_seeds
        at_images = (s.stopped or s.last_look or s.failed or (r.n or 0) >= s.readable
                     or next_images(s.max_images, s.images_asked, r.n or 0) is None)  # fmt: skip
        c = judge(r, s.decide, s.look, s.readable, at_seeds, at_images, s.previous.get(r.key()))
        if c.look == s.look:  # judged at this look (a closed one keeps its reason)
            c.reason += s.short
        comparisons.append(c)
    work, refusal = plan_work(comparisons, s)
    if s.last_look and not s.stopped:
        refusal = f"at the looks budget: {s.decide.max_looks} looks (decide.max_looks)"
    queued = work.images is not None or bool(work.seeds)
    for c in comparisons:
        if c.decision == "open" and not queued:  # nothing left that could decide it
            c.decision, c.action = "undecided", None
        if refusal is not None and c.decision == "undecided" and c.look == s.look:
            c.reason += f"; {refusal}"
    return LookPlan(comparisons, work, refusal)

