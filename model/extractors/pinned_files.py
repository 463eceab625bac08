"""An extractor's pinned weight files: where they lie, checked by sha256 before anything reads them, and how they
get there (from the checkpoint store, where `ablate weights fetch` staged them, or from the Hugging Face hub).

Layout, the same on every machine and in the store:

    <weights_dir>/<extractor name>/<filename>            on a machine (ABLATE_WEIGHTS_DIR, else <home>/weights)
    <checkpoint store>/weights/<extractor name>/<filename>   staged for nodes with no route to the hub

A file is used only when its sha256 is the pinned one; any other is refused naming the file, the expected and the
found hash. A store that nodes can write is no authority: what comes from it is hashed like anything else.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from model.extractors.registry import ExtractorEntry, PinnedFile
from model.hub import DOWNLOAD_TIMEOUT_S, OFFLINE_ENV, offline

WEIGHTS_DIR_ENV = "ABLATE_WEIGHTS_DIR"
STORE_FOLDER = "weights"  # beside the runs' run-<id>-<time> prefixes in the checkpoint store
CHUNK = 8 << 20


class ExtractorWeightsError(FileNotFoundError):
    """An extractor's weights are not where they must be; the message (one line) says how to provide them."""


class WeightsHashError(ValueError):
    """A weights file whose sha256 is not the pinned one: never loaded."""

    def __init__(self, path: Path | str, expected: str, found: str) -> None:
        super().__init__(f"{path}: sha256 {found} is not the pinned {expected}; refusing to load it "
                         "(delete it and stage the pinned file again: `ablate weights fetch`)")
        self.path, self.expected, self.found = str(path), expected, found


def default_weights_dir() -> Path:
    """$ABLATE_WEIGHTS_DIR, else <ablate's home directory>/weights ($ABLATE_HOME_DIR, default .ablate)."""
    explicit = os.environ.get(WEIGHTS_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("ABLATE_HOME_DIR", "").strip() or ".ablate").expanduser() / "weights"


def local_path(entry: ExtractorEntry, pinned: PinnedFile, weights_dir: Path) -> Path:
    return weights_dir / entry.name / pinned.filename


def store_path(store_url: str, entry: ExtractorEntry, pinned: PinnedFile) -> str:
    return f"{store_url.rstrip('/')}/{STORE_FOLDER}/{entry.name}/{pinned.filename}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, pinned: PinnedFile) -> Path:
    """`path` when its sha256 is the pinned one; WeightsHashError naming the file and both hashes otherwise.
    The size is compared first, so a wrong file of another size costs no hashing."""
    size = path.stat().st_size
    if size != pinned.size:
        raise WeightsHashError(path, pinned.sha256, f"(not computed: {size} bytes, pinned {pinned.size})")
    found = sha256_of(path)
    if found != pinned.sha256:
        raise WeightsHashError(path, pinned.sha256, found)
    return path


def how_to_provide(entry: ExtractorEntry, weights_dir: Path) -> str:
    """One clause: where to put which files; then `ablate weights fetch` stages them for the nodes."""
    files = ", ".join(f"{f.filename} (sha256 {f.sha256})" for f in entry.files)
    return (f"put {files} from {entry.repo} at revision {entry.revision} in {weights_dir / entry.name}/ "
            f"(or set {WEIGHTS_DIR_ENV} to a folder holding {entry.name}/), then `ablate weights fetch {entry.name}` "
            "stages them in the checkpoint store for the nodes")


def _missing(entry: ExtractorEntry, weights_dir: Path) -> list[PinnedFile]:
    return [f for f in entry.files if not local_path(entry, f, weights_dir).is_file()]


def _fs(url: str, options: dict[str, Any] | None) -> tuple[Any, str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **(options or {}))
    return fs, path


def _move_verified(tmp: Path, dest: Path, pinned: PinnedFile) -> Path:
    """A downloaded file into place only once its hash is the pinned one (a wrong one is deleted, then refused)."""
    try:
        verify(tmp, pinned)
    except WeightsHashError:
        tmp.unlink(missing_ok=True)
        raise
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)
    return dest


def copy_from_store(entry: ExtractorEntry, weights_dir: Path, store_url: str,
                    store_options: dict[str, Any] | None = None) -> list[Path]:
    """The entry's files that are missing under weights_dir, copied from the checkpoint store and hash-checked
    (a node's way to its weights). ExtractorWeightsError when the store lacks one or holds another file in
    its place (corrupt: not kept, and a stand-in may stand for it where one is allowed)."""
    fs, _ = _fs(store_url, store_options)
    copied = []
    for pinned in _missing(entry, weights_dir):
        source = store_path(store_url, entry, pinned)
        _, inner = _fs(source, store_options)
        if not fs.isfile(inner):
            raise ExtractorWeightsError(f"{entry.name}: {source} is not in the checkpoint store: "
                                        f"{how_to_provide(entry, weights_dir)}")
        dest = local_path(entry, pinned, weights_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=f".{pinned.filename}.", delete=False) as tmp:
            with fs.open(inner, "rb") as src:
                read = 0
                while block := src.read(CHUNK):
                    read += len(block)
                    if read > pinned.size:  # a store file larger than the pin is refused without reading it all
                        break
                    tmp.write(block)
        try:
            copied.append(_move_verified(Path(tmp.name), dest, pinned))
        except WeightsHashError as exc:  # any store-writing node could have put it there: absent, not fatal
            raise ExtractorWeightsError(f"{entry.name}: {source} in the checkpoint store is corrupt ({exc.found} is "
                                        f"not the pinned sha256 {exc.expected}), treated as absent: `ablate "
                                        f"weights fetch {entry.name}` replaces it") from None
    return copied


def download_from_hub(entry: ExtractorEntry, weights_dir: Path) -> list[Path]:
    """The entry's missing files downloaded from the Hugging Face hub at the pinned revision, hash-checked.
    ExtractorWeightsError (one line, saying how to provide them) when ABLATE_OFFLINE is set or the hub fails."""
    missing = _missing(entry, weights_dir)
    if not missing:
        return []
    if offline():
        raise ExtractorWeightsError(f"{entry.name}: {OFFLINE_ENV} forbids downloading its weights: "
                                    f"{how_to_provide(entry, weights_dir)}")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import logging as hf_logging

    fetched = []
    for pinned in missing:
        dest = local_path(entry, pinned, weights_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()  # its retries' warnings: the one line below says what failed
            try:
                got = hf_hub_download(entry.repo, pinned.filename, revision=entry.revision, local_dir=tmp,
                                      etag_timeout=DOWNLOAD_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - no route, DNS, HTTP 404, a full disk: one user error
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                raise ExtractorWeightsError(
                    f"{entry.name}: {pinned.filename} could not be downloaded from {entry.repo} "
                    f"({type(exc).__name__}: {first}): {how_to_provide(entry, weights_dir)}") from None
            finally:
                hf_logging.set_verbosity(verbosity)
            fetched.append(_move_verified(Path(got), dest, pinned))
    return fetched


def stage_in_store(entry: ExtractorEntry, weights_dir: Path, store_url: str,
                   store_options: dict[str, Any] | None = None) -> list[str]:
    """The entry's verified local files uploaded to <store>/weights/<name>/ (a file already there with the pinned
    sha256 is left alone; one with another is replaced: any store-writing node could have put it there).
    Returns the store paths written."""
    fs, _ = _fs(store_url, store_options)
    written = []
    for pinned in entry.files:
        source = verify(local_path(entry, pinned, weights_dir), pinned)
        target = store_path(store_url, entry, pinned)
        _, inner = _fs(target, store_options)
        state = _store_file_state(fs, inner, pinned)
        if state == "staged":
            continue
        fs.makedirs(inner.rsplit("/", 1)[0], exist_ok=True)
        part = f"{inner}.part"
        fs.put_file(str(source), part)
        if state == "corrupt":
            fs.rm(inner, recursive=True)  # a folder or wrong file in its place; the pinned one is uploaded
        fs.mv(part, inner)
        written.append(target)
    return written


def _store_file_state(fs: Any, inner: str, pinned: PinnedFile) -> str:
    """'staged' (the pinned sha256), 'corrupt' (another file or folder at its path) or 'no' (nothing there)."""
    if not fs.exists(inner):
        return "no"
    if not fs.isfile(inner) or fs.size(inner) != pinned.size:
        return "corrupt"
    digest = hashlib.sha256()
    with fs.open(inner, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return "staged" if digest.hexdigest() == pinned.sha256 else "corrupt"


def store_state(entry: ExtractorEntry, store_url: str, store_options: dict[str, Any] | None = None) -> str:
    """The entry's files in the store: 'staged' (every one the pinned file, by sha256), 'corrupt' (one is
    something else: nodes refuse it, and `ablate weights fetch` replaces it) or 'no' (one is missing)."""
    fs, _ = _fs(store_url, store_options)
    states = set()
    for pinned in entry.files:
        _, inner = _fs(store_path(store_url, entry, pinned), store_options)
        states.add(_store_file_state(fs, inner, pinned))
    return "corrupt" if "corrupt" in states else "no" if "no" in states else "staged"


def resolve_weights(entry: ExtractorEntry, weights_dir: Path, store_url: str | None = None,
                    store_options: dict[str, Any] | None = None) -> dict[str, Path]:
    """filename -> the verified local file, for every file of the entry: what is under weights_dir, else copied
    from the store (when given). Never downloads (loading runs where the hub may be unreachable).
    ExtractorWeightsError when a file is missing; WeightsHashError when one is not the pinned file."""
    if store_url and _missing(entry, weights_dir):
        try:
            copy_from_store(entry, weights_dir, store_url, store_options)
        except (ExtractorWeightsError, WeightsHashError):
            raise
        except Exception as exc:  # noqa: BLE001 - a store that is down or refuses: the files are not here
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise ExtractorWeightsError(f"{entry.name}: the checkpoint store {store_url} could not be read "
                                        f"({type(exc).__name__}: {first}): {how_to_provide(entry, weights_dir)}"
                                        ) from None
    missing = _missing(entry, weights_dir)
    if missing:
        raise ExtractorWeightsError(f"{entry.name}: no {missing[0].filename} in {weights_dir / entry.name}: "
                                    f"{how_to_provide(entry, weights_dir)}")
    return {f.filename: verify(local_path(entry, f, weights_dir), f) for f in entry.files}

