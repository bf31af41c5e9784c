"""Content-addressed artifact cache.

An artifact (rendered corpus, chunks, vectors, index, BM25 index) is a directory
`<root>/<kind>/<key>/` holding its payload files and a `manifest.json`. The key is a hash of
everything that determines the artifact: the config subset that builds it plus the keys of the
artifacts it is built from, so a change upstream changes every key downstream and nothing else.

Loaded artifacts and a few derived results also live in a memory tier (`ArtifactCache.memory`)
shared by every cache object of the same root in one process: the jobs of a sweep that Hydra's
basic launcher (or a benchmark) runs in one process parse the same corpus, read the same chunks,
search the same candidates and score the same texts, and doing it again per job was most of a
warm job's cost. It holds values, never timings, and is keyed by what determines each value.

Writes are atomic: the builder fills `<root>/<kind>/tmp-<pid>-<rand>/`, a manifest with per-file
checksums is added, and the directory is renamed into place. A file lock (`fcntl.flock`) per key
makes parallel jobs that need the same artifact build it once; the others wait and reuse it.

A cache may have a seed (`paths.seed`, by default `data/seed/`): a read-only directory laid out the
same way, consulted only on a miss. A seeded artifact whose checksums hold is copied into the cache
instead of being built, and a seeded record is read where it lies. The repository's seed holds what
`make demo` would otherwise compute from the data it ships (data/seed/README.md); any other input
gives other keys, so the seed is never consulted for them.

Records (one small JSON result each: an answer, a judgement, a question's scores) are checked like
artifacts: the cache's own carry the sha256 of their body, the seed's are listed with the sha256 of
their bytes in the seed's manifest (`SEED.json`). A record that fails its check, or is for another
key, is reported by name and read as absent, so that its caller computes it again (the checks:
rag/store/cache_records.py).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.store.atomic import atomic_write_text, follow_umask, umask_mode
from rag.store.cache_records import OLDER_RECORD, checked_record, foreign, parse_record, seed_record_sums
from rag.serving.secrets import redacted_data
from rag.types import RagError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SEED_INDEX = "SEED.json"  # the seed's manifest: its artifacts, and its records' checksums (rag.store.seed)
KEY_CHARS = 20  # 80 bits of sha256: collision-free for any realistic cache
# Files this process has hashed and found intact, by (path, size, mtime, inode): a file that is
# rewritten or replaced gets a new stat and is hashed again. Files it built itself are not entered,
# so that the first lookup after a build still reads what is on disk.
_VERIFIED: dict[tuple[str, int, int, int], str] = {}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def make_key(kind: str, params: Mapping[str, Any], parents: Mapping[str, str] | None = None) -> str:
    """sha256 of the canonical JSON of (kind, params, parent keys)."""
    payload = canonical_json({"kind": kind, "params": params, "parents": dict(parents or {})})
    return hashlib.sha256(payload.encode()).hexdigest()[:KEY_CHARS]


def file_sha256(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(bufsize):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Artifact:
    kind: str
    key: str
    path: Path
    manifest: dict[str, Any]
    hit: bool  # True when it was found in the cache rather than built by this call

    def file(self, name: str) -> Path:
        return self.path / name

    def content_digest(self) -> str:
        """A digest of the payload's checksums: the same for the same bytes in any cache on any
        machine (a folder's modification times are not)."""
        sums = {name: meta["sha256"] for name, meta in self.manifest.get("files", {}).items()}
        return hashlib.sha256(canonical_json(sums).encode()).hexdigest()[:KEY_CHARS]


# Errors of the cache's storage itself (not of a builder's inputs): reported as one line naming
# the cache directory.
_STORAGE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST}
# Of those, the ones that say the disk, not the path, is at fault: a full or read-only filesystem.
FULL_OR_READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def storage_fault(e: BaseException | None, errnos: set[int] = FULL_OR_READ_ONLY) -> OSError | None:
    """The storage error behind `e` (itself or one of its causes), or None. Libraries that write
    files in C (faiss, safetensors) raise RuntimeError and keep only strerror's text, so a full
    disk is also recognised by that text."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in errnos:
            return e
        if errno.ENOSPC in errnos and os.strerror(errno.ENOSPC) in str(e):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        e = e.__cause__ or e.__context__
    return None


class MemoryTier:
    """Per-process values by (table, key), least recently used first out, each table with its own
    size limit (`LIMITS`: entries). `clear()` gives a benchmark its "fresh process"."""

    LIMITS = {
        "inputs": 4,            # parsed corpora and question sets
        "chunks": 4,            # chunk sets
        "candidates": 200_000,  # one question's candidate list (a few hundred bytes)
        "eval_vectors": 50_000, # the evaluation embedder's vector of one text (~1.5 KB)
        "routers": 16,          # fitted source routers (rag.retriever.routing)
    }

    def __init__(self) -> None:
        self._tables: dict[str, OrderedDict[Hashable, Any]] = {}

    def get(self, table: str, key: Hashable) -> Any | None:
        t = self._tables.get(table)
        if t is None or key not in t:
            return None
        t.move_to_end(key)
        return t[key]

    def put(self, table: str, key: Hashable, value: Any) -> Any:
        t = self._tables.setdefault(table, OrderedDict())
        t[key] = value
        t.move_to_end(key)
        while len(t) > self.LIMITS.get(table, 1000):
            t.popitem(last=False)
        return value

    def clear(self) -> None:
        self._tables.clear()


_MEMORY: dict[Path, MemoryTier] = {}


def clear_memory() -> None:
    """Forget every memory tier of this process."""
    for tier in _MEMORY.values():
        tier.clear()


class ArtifactCache:
    def __init__(self, root: str | os.PathLike[str], setting: str = "paths.cache or RAGRIG_CACHE",
                 seed: str | os.PathLike[str] | None = None):
        """`setting`: what the user sets to choose this directory, named when it is unusable.
        `seed`: a read-only directory of artifacts and records to restore from on a miss (a
        missing directory is no seed)."""
        self.root = Path(root)
        check_cache_root(self.root, setting)
        self.seed = Path(seed) if seed else None
        self.memory = _MEMORY.setdefault(self.root.absolute(), MemoryTier())

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def _read_manifest(self, path: Path) -> dict[str, Any] | None:
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: bad JSON or UTF-8
            return None
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, dict) or not all(isinstance(m, dict) and {"size", "sha256"} <= set(m)
                                                  for m in files.values()):
            return None  # no manifest this cache wrote: overwritten or damaged
        return manifest

    @staticmethod
    def _foreign(manifest: dict[str, Any], kind: str, key: str) -> str | None:
        """What is wrong when a directory's manifest is another key's (or kind's), else None: an
        entry copied or moved over this key's holds another configuration's payload, whose files
        are intact by their own checksums (rag.store.cache_records.foreign, the rule records follow)."""
        if manifest.get("kind") not in (None, kind):
            return (f"is damaged (it holds a {manifest.get('kind')!r} entry, not a {kind!r} one: "
                    "a moved or copied directory)")
        return foreign(manifest.get("key"), key, "entry", "directory")

    def _valid(self, path: Path, manifest: dict[str, Any] | None, verify: bool) -> bool:
        if manifest is None:
            return False
        for name, meta in manifest.get("files", {}).items():
            f = path / name
            try:
                st = f.stat()
            except FileNotFoundError:
                return False
            if not f.is_file() or st.st_size != meta["size"]:
                return False
            if verify:
                seen = (str(f), st.st_size, st.st_mtime_ns, st.st_ino)
                if _VERIFIED.get(seen) == meta["sha256"]:
                    continue
                if file_sha256(f) != meta["sha256"]:
                    return False
                _VERIFIED[seen] = meta["sha256"]
        return True

    def lookup(self, kind: str, key: str, verify: bool = True) -> Artifact | None:
        """The artifact if it is complete and intact. Checksums are verified by default, once per
        file per process: hashing runs at about 1 GB/s, small next to a stage that reads the
        payload, but a warm run at 1M chunks would otherwise hash its 1.5 GB of vectors on every
        lookup (the retrieval and the score stage both look them up)."""
        path = self.path(kind, key)
        manifest = self._read_manifest(path)
        if manifest is None or self._foreign(manifest, kind, key) is not None:
            return None  # named when it is rebuilt (_build)
        if path.is_dir() and self._valid(path, manifest, verify):
            return Artifact(kind, key, path, manifest, hit=True)
        return None

    @contextlib.contextmanager
    def _lock(self, kind: str, key: str) -> Iterator[None]:
        lock_path = self.root / kind / f".{key}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def get_or_build(
        self,
        kind: str,
        key: str,
        build: Callable[[Path], Mapping[str, Any] | None],
        inputs: Mapping[str, Any] | None = None,
    ) -> Artifact:
        """Return the artifact `kind/key`, building it with `build(tmp_dir)` when it is missing.

        `build` writes its payload files into `tmp_dir` and may return extra manifest fields.
        """
        found = self.lookup(kind, key)
        if found is not None:
            return found
        seeded = self._seeded(kind, key)
        if seeded is not None:
            build, inputs = seeded
        try:
            art = self._build(kind, key, build, inputs)
            # restored, not built: the caller reads it as a hit (the manifest says `seeded_from`)
            return Artifact(kind, key, art.path, art.manifest, hit=True) if seeded is not None else art
        except Exception as e:
            # A build writes only into its staging directory under the root, so a storage error
            # that names no file (a failed write(), a library's RuntimeError) is the cache's too.
            fault = None if isinstance(e, RagError) else storage_fault(e, _STORAGE_ERRNOS)
            if fault is None or (fault.filename and not str(fault.filename).startswith(str(self.root))):
                raise
            where = f": {fault.filename}" if fault.filename else ""
            raise RagError(
                f"artifact cache {self.root}: cannot write the {kind} artifact ({fault.strerror}{where}); "
                "paths.cache (or RAGRIG_CACHE) must be a writable directory with free space"
            ) from None

    def partial(self, kind: str, key: str) -> Path:
        """A directory where a build of `kind/key` may keep finished parts across attempts (a
        killed process's staging directory is removed; this one is not). Removed once the artifact
        is published; never read as the artifact."""
        path = self._partial_path(kind, key)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def pending(self, kind: str, key: str) -> Path | None:
        """The `partial` directory of an interrupted build of `kind/key`, if one exists (never
        created: what a dry run reads)."""
        path = self._partial_path(kind, key)
        return path if path.is_dir() else None

    def _partial_path(self, kind: str, key: str) -> Path:
        return self.root / kind / f".partial-{key}"

    def available(self, kind: str, key: str) -> bool:
        """Whether `kind/key` would be read, not built: in the cache, or intact in the seed."""
        return self.lookup(kind, key) is not None or self._seeded(kind, key) is not None

    def _seeded(self, kind: str, key: str) -> tuple[Callable[[Path], dict[str, Any]], dict[str, Any]] | None:
        """(a builder that copies the seed's artifact, its inputs) when the seed holds `kind/key`
        whole and intact, else None (a damaged seed entry is built anew, with a warning)."""
        if self.seed is None:
            return None
        src = self.seed / kind / key
        manifest = self._read_manifest(src)
        if manifest is None:
            return None
        problem = self._foreign(manifest, kind, key)
        if problem is None and not self._valid(src, manifest, verify=True):
            problem = "is damaged"
        if problem is not None:
            log.warning("cache: seed entry %s %s; building it instead", src, problem)
            return None
        own = {"kind", "key", "inputs", "files", "build_seconds", "created", "seeded_from"}

        def restore(tmp: Path) -> dict[str, Any]:
            for name in manifest["files"]:
                shutil.copyfile(src / name, tmp / name)
            return {**{k: v for k, v in manifest.items() if k not in own}, "seeded_from": str(src)}

        return restore, dict(manifest.get("inputs") or {})

    def _build(
        self, kind: str, key: str, build: Callable[[Path], Mapping[str, Any] | None], inputs: Mapping[str, Any] | None
    ) -> Artifact:
        with self._lock(kind, key):
            found = self.lookup(kind, key)  # another process may have built it while we waited
            if found is not None:
                return found
            final = self.path(kind, key)
            if final.exists():  # an incomplete or corrupted leftover, or another key's entry: never reuse it
                held = self._read_manifest(final)
                problem = None if held is None else self._foreign(held, kind, key)
                log.warning("cache: %s %s; rebuilding it", final, problem or "is incomplete or corrupted")
                shutil.rmtree(final)
            self._remove_stale_tmp(final.parent)
            tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f"tmp-{os.getpid()}-"))
            try:
                os.chmod(tmp, umask_mode(directory=True))
                t0 = time.perf_counter()
                extra = dict(build(tmp) or {})
                _test_pause(kind)
                follow_umask(tmp)
                files = {
                    p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                    for p in sorted(tmp.iterdir())
                    if p.is_file()
                }
                manifest = {
                    "kind": kind,
                    "key": key,
                    "inputs": redacted_data(dict(inputs or {})),  # a component's id, as any config written
                    "files": files,
                    "build_seconds": round(time.perf_counter() - t0, 3),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    **redacted_data(extra),
                }
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
                _fsync_dir_files(tmp)
                os.replace(tmp, final)
                shutil.rmtree(self._partial_path(kind, key), ignore_errors=True)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return Artifact(kind, key, final, manifest, hit=False)

    # -- records: small JSON results cached one by one (an answer, a judgement) ---------------

    def record_path(self, kind: str, key: str, root: Path | None = None) -> Path:
        return (root or self.root) / kind / key[:2] / f"{key}.json"

    def get_record(self, kind: str, key: str) -> dict[str, Any] | None:
        """A record written by `put_record` (its fields and `key`), or None. A record that fails its
        checksum (a flipped byte, a truncated file), holds another key (a moved file) or carries no
        checksum (written by an older ragrig) is reported by name and read as absent: the caller
        computes it again and `put_record` replaces it. A record this cache lacks is read from the
        seed, where it lies, once its bytes match the seed's manifest."""
        record = checked_record(self.record_path(kind, key), key, _unseal, "record", "rebuilding it")
        if record is None and self.seed is not None:
            record = self._seed_record(kind, key)
        return record

    def put_record(self, kind: str, key: str, record: Mapping[str, Any]) -> None:
        """Results that arrive one at a time (answers from a server) are recorded as they come,
        so that a run that dies mid-way keeps what it paid for. The file holds the record's body
        and the sha256 of its canonical JSON, which `get_record` checks."""
        body = json.loads(json.dumps({**record, "key": key}, ensure_ascii=False, default=str))
        sealed = {"sha256": _body_sha256(body), "body": body}
        atomic_write_text(self.record_path(kind, key), json.dumps(sealed, ensure_ascii=False))

    def _seed_record(self, kind: str, key: str) -> dict[str, Any] | None:
        assert self.seed is not None
        index = self.seed / SEED_INDEX
        expected = seed_record_sums(index).get(kind, {}).get(key)

        def verify(raw: bytes) -> tuple[Any, str | None]:
            if not isinstance(expected, str):
                return None, f"has no checksum in {index}"
            if hashlib.sha256(raw).hexdigest() != expected:
                return None, f"is damaged (its sha256 differs from the one in {index})"
            return parse_record(raw)

        return checked_record(self.record_path(kind, key, self.seed), key, verify, "seed record",
                              "computing it instead")

    @staticmethod
    def _remove_stale_tmp(parent: Path) -> None:
        """Builders killed mid-way (SIGKILL, OOM) leave `tmp-<pid>-*` directories; remove those
        whose process is gone. Live builders' directories are left alone."""
        for d in parent.glob("tmp-*-*"):
            try:
                pid = int(d.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(d, ignore_errors=True)


def _body_sha256(body: Any) -> str:
    """The checksum of a record's body: of its canonical JSON, which parsing and writing again
    reproduces exactly (floats round-trip through their repr)."""
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def _unseal(raw: bytes) -> tuple[Any, str | None]:
    """(a cache record's body, None) when its checksum holds, else (None, what is wrong)."""
    data, problem = parse_record(raw)
    if problem is not None:
        return None, problem
    if not (isinstance(data, dict) and set(data) == {"sha256", "body"}):
        return None, OLDER_RECORD
    if _body_sha256(data["body"]) != data["sha256"]:
        return None, "is damaged (its body does not match its sha256)"
    return data["body"], None


def check_cache_root(root: Path, setting: str = "paths.cache or RAGRIG_CACHE") -> None:
    """The cache root, or its nearest existing ancestor, must be a directory: a file there (say
    RAGRIG_CACHE=~/.bashrc) is one line here rather than an OS traceback at the first write."""
    from rag.types import RagError

    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    if p.exists() and not p.is_dir():
        what = "is" if p == root else f"is inside {p}, which is"
        raise RagError(f"artifact cache {root} {what} not a directory (set {setting} to a directory)")


def _test_pause(kind: str) -> None:
    """Crash tests set RAGRIG_TEST_PAUSE_BEFORE_PUBLISH=<kind>:<seconds> to hold a finished but
    unpublished build open long enough to SIGKILL it there; unset, this does nothing."""
    spec = os.environ.get("RAGRIG_TEST_PAUSE_BEFORE_PUBLISH", "")
    if spec.partition(":")[0] == kind:
        time.sleep(float(spec.partition(":")[2] or 0))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir_files(directory: Path) -> None:
    """Flush payload files to disk before the rename publishes them, so a power loss cannot
    leave a published artifact whose files are still in the page cache only."""
    for p in directory.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
