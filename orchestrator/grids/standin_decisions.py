"""A deciding grid whose decided metric would be measured by a random stand-in: said in the submit answer.

A distribution metric (cmmd, dino_mmd) is measured with a pinned extractor's weights. Where a node finds them
neither in its weights folder nor staged in the checkpoint store it measures with a labelled random stand-in,
and a look closes a comparison on a stand-in with no verdict: the grid would spend its budget to decide
nothing. The grid is still accepted (the weights may be staged before its runs start); the answer warns,
naming the metric, the extractor and the command that stages it.

"Staged" is read cheaply here, by each pinned file's presence and size (in the controller's weights folder,
ABLATE_WEIGHTS_DIR, which a node on this machine shares, or in the store): the sha256 is checked where the
weights are loaded, and hashing gigabytes would hold up the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from model.extractors.registry import EXTRACTOR_FOR_METRIC, EXTRACTORS, FINAL_EXTRACTOR_FOR_METRIC, ExtractorEntry


def extractors_of(metric: str) -> list[str]:
    """The extractors `metric` is measured with: at checkpoints, then in an evaluation a look may queue."""
    names = [EXTRACTOR_FOR_METRIC.get(metric), FINAL_EXTRACTOR_FOR_METRIC.get(metric)]
    return list(dict.fromkeys(n for n in names if n is not None))


def weights_here(entry: ExtractorEntry, weights_dir: Path) -> bool:
    """Every pinned file of `entry` is in `weights_dir` at its pinned size."""
    files = [weights_dir / entry.name / f.filename for f in entry.files]
    return all(p.is_file() and p.stat().st_size == f.size for p, f in zip(files, entry.files, strict=True))


def weights_in_store(entry: ExtractorEntry, store_url: str, options: dict[str, Any] | None) -> bool:
    """Every pinned file of `entry` is staged in the checkpoint store at its pinned size; False where the store
    cannot be read (the nodes could not read it either)."""
    import fsspec

    from model.extractors.pinned_files import store_path

    try:
        for pinned in entry.files:
            fs, inner = fsspec.core.url_to_fs(store_path(store_url, entry, pinned), **(options or {}))
            if not fs.isfile(inner) or fs.size(inner) != pinned.size:
                return False
    except Exception:  # noqa: BLE001 - an unreachable or refusing store holds nothing a node could copy
        return False
    return True


def standin_warnings(decided: Iterable[str], staged: Callable[[ExtractorEntry], bool]) -> list[str]:
    """One warning per decided metric with an extractor whose weights are not `staged`, naming the fix."""
    warnings = []
    for metric in decided:
        missing = [name for name in extractors_of(metric) if not staged(EXTRACTORS[name])]
        if not missing:
            continue
        fetch = " and ".join(f"`ablate weights fetch {name}`" for name in missing)
        warnings.append(
            f"decide.margin names {metric!r}, but the weights of {', '.join(missing)} are not staged: nodes would "
            f"measure {metric} with a random stand-in and its comparisons would close with no verdict; run {fetch} "
            "before the runs start (`ablate weights list` shows what is staged)"
        )
    return warnings


def decided_standin_warnings(decided: Iterable[str], weights_dir: Path, store_url: str,
                             store_options: dict[str, Any] | None) -> list[str]:
    """The submit answer's warnings for the decided metrics, reading the controller's weights folder and the
    checkpoint store."""
    return standin_warnings(decided, lambda entry: weights_here(entry, weights_dir)
                            or weights_in_store(entry, store_url, store_options))  # fmt: skip
