"""The artifact cache: keys follow their inputs, hits skip the build, writes are atomic,
corrupted entries are rebuilt."""
import json
import threading

import pytest

from rag.atomic import atomic_write_text
from rag.cache import ArtifactCache, make_key


def test_key_depends_on_params_and_parents_not_on_dict_order():
    a = make_key("chunks", {"size": 512, "overlap": 64}, {"corpus": "c1"})
    assert a == make_key("chunks", {"overlap": 64, "size": 512}, {"corpus": "c1"})
    assert a != make_key("chunks", {"size": 256, "overlap": 64}, {"corpus": "c1"})
    assert a != make_key("chunks", {"size": 512, "overlap": 64}, {"corpus": "c2"})
    assert a != make_key("vectors", {"size": 512, "overlap": 64}, {"corpus": "c1"})


def _writer(calls):
    def build(tmp):
        calls.append(1)
        (tmp / "payload.txt").write_text("hello")
        return {"note": "built"}
    return build


def test_miss_builds_then_hit_reuses(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    first = cache.get_or_build("thing", "k1", _writer(calls))
    second = cache.get_or_build("thing", "k1", _writer(calls))
    assert (first.hit, second.hit) == (False, True)
    assert calls == [1]
    assert second.file("payload.txt").read_text() == "hello"
    manifest = json.loads((second.path / "manifest.json").read_text())
    assert manifest["key"] == "k1" and manifest["note"] == "built"
    assert manifest["files"]["payload.txt"]["size"] == 5


def test_failed_build_leaves_nothing_behind(tmp_path):
    cache = ArtifactCache(tmp_path)

    def broken(tmp):
        (tmp / "half.txt").write_text("partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.get_or_build("thing", "k", broken)
    assert cache.lookup("thing", "k") is None
    assert not [p for p in (tmp_path / "thing").iterdir() if not p.name.startswith(".")]


def test_what_a_library_writes_privately_into_a_build_is_published_under_the_umask(tmp_path):
    import os

    from rag.atomic import umask_mode

    def private(tmp):  # safetensors, for one, writes its files 0600
        (tmp / "model").mkdir(mode=0o700)
        for path in (tmp / "weights.bin", tmp / "model" / "layer.bin"):
            path.write_bytes(b"w")
            os.chmod(path, 0o600)

    art = ArtifactCache(tmp_path).get_or_build("thing", "k", private)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [art.path, *art.path.rglob("*")]}
    want = {name: umask_mode(directory=name in ("k", "model")) for name in modes}
    assert modes == want


def test_truncated_payload_is_detected_and_rebuilt(tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    art = cache.get_or_build("thing", "k", _writer(calls))
    art.file("payload.txt").write_text("he")  # truncated
    again = cache.get_or_build("thing", "k", _writer(calls))
    assert not again.hit and calls == [1, 1]
    assert again.file("payload.txt").read_text() == "hello"


def test_parallel_builders_build_once(tmp_path):
    calls = []
    barrier = threading.Barrier(4)

    def slow_build(tmp):
        calls.append(1)
        (tmp / "payload.txt").write_text("x" * 1000)

    def worker():
        barrier.wait()
        # A separate cache object per thread, as separate processes would have.
        ArtifactCache(tmp_path).get_or_build("thing", "k", slow_build)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]


def test_atomic_write_text_replaces_whole_file(tmp_path):
    p = tmp_path / "out" / "metrics.json"
    atomic_write_text(p, "first")
    atomic_write_text(p, "second")
    assert p.read_text() == "second"
    assert [f.name for f in p.parent.iterdir()] == ["metrics.json"]


def test_same_size_corruption_is_detected_by_checksum(tmp_path, caplog):
    cache, calls = ArtifactCache(tmp_path), []
    art = cache.get_or_build("thing", "k", _writer(calls))
    art.file("payload.txt").write_text("HELLO")  # same size, different bytes
    assert cache.lookup("thing", "k") is None
    with caplog.at_level("WARNING"):
        again = cache.get_or_build("thing", "k", _writer(calls))
    assert not again.hit and again.file("payload.txt").read_text() == "hello"
    assert "thing/k is incomplete or corrupted" in caplog.text


def test_leftovers_of_a_killed_builder_are_removed(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "thing" / f"tmp-{int(dead.stdout)}-abc"
    stale.mkdir(parents=True)
    (stale / "half.npy").write_bytes(b"partial")
    ArtifactCache(tmp_path).get_or_build("thing", "k", _writer([]))
    assert not stale.exists()


def test_checksums_are_verified_once_per_process_until_the_file_changes(tmp_path, monkeypatch):
    """A warm run looks its vectors up more than once; hashing 1.5 GB each time (1M chunks) buys
    nothing. A file whose stat changes (rewritten, replaced) is hashed again."""
    import os

    import rag.cache as cache_mod

    cache, calls = ArtifactCache(tmp_path), []
    art = cache.get_or_build("thing", "k", _writer(calls))
    hashed = []
    real = cache_mod.file_sha256
    monkeypatch.setattr(cache_mod, "file_sha256", lambda p, *a: hashed.append(p) or real(p, *a))
    assert cache.lookup("thing", "k") is not None and len(hashed) == 1  # first lookup reads the file
    assert cache.lookup("thing", "k") is not None and len(hashed) == 1  # later ones trust the stat
    payload = art.file("payload.txt")
    payload.write_text("HELLO")  # same size
    st = payload.stat()
    os.utime(payload, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the clock moved on
    assert cache.lookup("thing", "k") is None and len(hashed) == 2


def test_the_memory_tier_is_shared_per_root_and_bounded_per_table(tmp_path, monkeypatch):
    from rag.cache import MemoryTier, clear_memory

    a, b, other = ArtifactCache(tmp_path / "c"), ArtifactCache(tmp_path / "c"), ArtifactCache(tmp_path / "d")
    a.memory.put("chunks", "k", [1])
    assert b.memory.get("chunks", "k") == [1], "two cache objects of one root share what was loaded"
    assert other.memory.get("chunks", "k") is None, "another root does not"
    monkeypatch.setitem(MemoryTier.LIMITS, "chunks", 2)
    for key in ("k2", "k3"):
        a.memory.put("chunks", key, key)
    assert a.memory.get("chunks", "k") is None and a.memory.get("chunks", "k3") == "k3", "least recently used out"
    clear_memory()
    assert a.memory.get("chunks", "k3") is None


def test_an_unusable_cache_names_the_setting_that_chose_it(tmp_path):
    from rag.types import RagError

    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(RagError, match=r"set paths.cache or RAGRIG_CACHE to a directory"):
        ArtifactCache(afile)
    with pytest.raises(RagError, match=r"artifact cache .*a-file is not a directory \(set paths.model_cache to a directory\)"):
        ArtifactCache(afile, setting="paths.model_cache")


# -- the seed: read-only artifacts and records restored on a miss -------------------------------

def _seed_with_thing(tmp_path):
    from rag.seed import build_seed

    seeding = ArtifactCache(tmp_path / "seeding")
    seeding.get_or_build("thing", "k1", _writer([]))
    seeding.put_record("scores", "r1", {"scores": [1.0, 2.0]})
    build_seed(seeding.root, tmp_path / "seed", artifacts=("thing",), records=("scores",))
    return tmp_path / "seed"


def test_a_miss_restores_the_seeds_artifact_instead_of_building(tmp_path):
    seed, calls = _seed_with_thing(tmp_path), []
    cache = ArtifactCache(tmp_path / "cache", seed=seed)
    art = cache.get_or_build("thing", "k1", _writer(calls))
    assert calls == [] and art.hit, "restored, not built, and read as a hit"
    assert art.path == tmp_path / "cache" / "thing" / "k1" and art.file("payload.txt").read_text() == "hello"
    assert art.manifest["note"] == "built" and art.manifest["seeded_from"] == str(seed / "thing" / "k1")
    assert cache.lookup("thing", "k1") is not None, "the copy is the cache's own from now on"
    assert cache.get_or_build("thing", "k2", _writer(calls)).hit is False and calls == [1], "other keys are built"


def test_a_damaged_seed_entry_is_built_instead(tmp_path, caplog):
    seed, calls = _seed_with_thing(tmp_path), []
    (seed / "thing" / "k1" / "payload.txt").write_text("hellO")  # same size, other bytes
    art = ArtifactCache(tmp_path / "cache", seed=seed).get_or_build("thing", "k1", _writer(calls))
    assert calls == [1] and not art.hit and "seeded_from" not in art.manifest
    assert "seed entry" in caplog.text and "damaged" in caplog.text


def test_records_are_read_from_the_seed_where_they_lie(tmp_path):
    seed = _seed_with_thing(tmp_path)
    cache = ArtifactCache(tmp_path / "cache", seed=seed)
    assert cache.get_record("scores", "r1")["scores"] == [1.0, 2.0]
    assert cache.get_record("scores", "r2") is None
    cache.put_record("scores", "r1", {"scores": [3.0]})  # the cache's own record wins
    assert cache.get_record("scores", "r1")["scores"] == [3.0]
    assert ArtifactCache(tmp_path / "cache2", seed=tmp_path / "absent").get_record("scores", "r1") is None


def test_the_same_bytes_have_the_same_content_digest_in_any_cache(tmp_path):
    a = ArtifactCache(tmp_path / "a").get_or_build("thing", "k1", _writer([]))
    b = ArtifactCache(tmp_path / "b").get_or_build("thing", "k1", _writer([]))
    c = ArtifactCache(tmp_path / "c").get_or_build("thing", "k1", lambda tmp: {"n": (tmp / "payload.txt").write_text("other")})
    assert a.content_digest() == b.content_digest() != c.content_digest()


def test_available_says_whether_an_artifact_would_be_read_rather_than_built(tmp_path):
    seed = _seed_with_thing(tmp_path)
    cache = ArtifactCache(tmp_path / "cache", seed=seed)
    assert cache.available("thing", "k1") and not cache.available("thing", "k2")
    assert not (tmp_path / "cache" / "thing" / "k1").exists(), "asking restores nothing"
    assert not ArtifactCache(tmp_path / "cache2").available("thing", "k1")
