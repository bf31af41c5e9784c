"""The artifact cache: keys follow their inputs, hits skip the build, writes are atomic,
corrupted entries are rebuilt."""
import json
import threading

import pytest

from rag.store.atomic import atomic_write_text
from rag.store.cache import ArtifactCache, make_key


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

    from rag.store.atomic import umask_mode

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

    import rag.store.cache as cache_mod

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
    from rag.store.cache import MemoryTier, clear_memory

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
    from rag.store.seed import build_seed

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


# -- an entry is the entry of the key asked for ---------------------------------------------------

def _copy_entry(src, dst):
    import shutil

    shutil.rmtree(dst)
    shutil.copytree(src, dst)


def test_a_directory_copied_over_another_keys_entry_is_named_and_rebuilt(tmp_path, caplog):
    """Its files are intact by their own checksums, so only the manifest's key tells that they are
    another configuration's payload."""
    cache, calls = ArtifactCache(tmp_path), []
    mine = cache.get_or_build("thing", "k1", _writer(calls))
    other = cache.get_or_build("thing", "k2", lambda tmp: {"n": (tmp / "payload.txt").write_text("other")})
    _copy_entry(other.path, mine.path)
    assert cache.lookup("thing", "k1") is None and not cache.available("thing", "k1")
    with caplog.at_level("WARNING"):
        again = cache.get_or_build("thing", "k1", _writer(calls))
    assert not again.hit and calls == [1, 1] and again.file("payload.txt").read_text() == "hello"
    assert f"cache: {mine.path} is damaged (it holds the entry of key 'k2', not 'k1': a moved or copied directory); " \
           "rebuilding it" in caplog.text
    assert cache.lookup("thing", "k2").file("payload.txt").read_text() == "other", "the other key's entry is untouched"


def test_an_entry_of_another_kind_under_the_same_key_is_rebuilt(tmp_path, caplog):
    cache, calls = ArtifactCache(tmp_path), []
    import shutil

    index = cache.get_or_build("index", "k1", lambda tmp: {"n": (tmp / "payload.txt").write_text("other")})
    shutil.copytree(index.path, tmp_path / "vectors" / "k1")
    assert cache.lookup("vectors", "k1") is None
    with caplog.at_level("WARNING"):
        cache.get_or_build("vectors", "k1", _writer(calls))
    assert calls == [1] and "holds a 'index' entry, not a 'vectors' one" in caplog.text


@pytest.mark.parametrize("manifest", ["[1, 2]", '{"key": "k1", "files": {"payload.txt": 5}}', '{"key": "k1"}'])
def test_a_manifest_that_no_build_wrote_is_a_damaged_entry(manifest, tmp_path):
    cache, calls = ArtifactCache(tmp_path), []
    art = cache.get_or_build("thing", "k1", _writer(calls))
    (art.path / "manifest.json").write_text(manifest)
    assert cache.lookup("thing", "k1") is None
    assert not cache.get_or_build("thing", "k1", _writer(calls)).hit and calls == [1, 1]


def test_a_seed_entry_under_another_keys_name_is_built_instead(tmp_path, caplog):
    seed, calls = _seed_with_thing(tmp_path), []
    (seed / "thing" / "k1").rename(seed / "thing" / "k9")  # intact files, a key that is not theirs
    cache = ArtifactCache(tmp_path / "cache", seed=seed)
    assert not cache.available("thing", "k9")
    with caplog.at_level("WARNING"):
        art = cache.get_or_build("thing", "k9", _writer(calls))
    assert calls == [1] and not art.hit and "seeded_from" not in art.manifest
    assert f"cache: seed entry {seed / 'thing' / 'k9'} is damaged (it holds the entry of key 'k1', not 'k9': " \
           "a moved or copied directory); building it instead" in caplog.text


def test_the_seed_ships_no_entry_held_under_another_keys_name(tmp_path):
    from rag.store.seed import build_seed

    seeding = ArtifactCache(tmp_path / "seeding")
    a = seeding.get_or_build("thing", "k1", _writer([]))
    b = seeding.get_or_build("thing", "k2", lambda tmp: {"n": (tmp / "payload.txt").write_text("other")})
    _copy_entry(b.path, a.path)
    index = build_seed(seeding.root, tmp_path / "seed", artifacts=("thing",), records=())
    assert [e["key"] for e in index["artifacts"]] == ["k2"] and not (tmp_path / "seed" / "thing" / "k1").exists()


def test_every_kind_of_entry_copied_over_another_configurations_is_rebuilt_in_a_run(tiny_files, compose_cfg, caplog):
    """The corpus, chunks, vectors, indexes and answers of one corpus copied over those of another:
    the run on the second corpus rebuilds each, names each, and scores what it scored before."""
    import shutil

    from rag.store.cache import clear_memory
    from rag.run.pipeline import run
    from tests.conftest import TINY_DOCS, tiny_overrides, write_jsonl
    from tests.scripted_endpoint import ScriptedEndpoint

    other = write_jsonl(tiny_files["corpus"].with_name("other.jsonl"),
                        [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS if i != "pmid:2"])
    cache = tiny_files["cache"]
    with ScriptedEndpoint() as srv:
        def config(corpus):
            return compose_cfg(tiny_overrides(tiny_files) + [
                f"corpus.path={corpus}", "retriever=hybrid", "llm=openai", f"llm.base_url={srv.base_url}",
                "llm.model=m"])

        first = run(config(tiny_files["corpus"]), tiny_files["out"] / "a")
        second = run(config(other), tiny_files["out"] / "b")

        def keys(kind, result):
            if kind == "corpus":  # not among a run's artifacts: found by the file it was read from
                return next(p.name for p in (cache / "corpus").iterdir() if (p / "manifest.json").is_file()
                            and str(result) in (p / "manifest.json").read_text())
            return result["artifacts"][kind]["key"]

        kinds = ("corpus", "chunks", "vectors", "index", "bm25", "answers")
        pairs = {kind: (keys(kind, tiny_files["corpus"] if kind == "corpus" else first),
                        keys(kind, other if kind == "corpus" else second)) for kind in kinds}
        for kind, (a, b) in pairs.items():
            assert a != b, kind
            shutil.rmtree(cache / kind / b)
            shutil.copytree(cache / kind / a, cache / kind / b)
        clear_memory()  # a fresh process: nothing parsed or loaded before
        with caplog.at_level("WARNING"):
            again = run(config(other), tiny_files["out"] / "b2")
    for kind, (a, b) in pairs.items():
        assert f"cache: {cache / kind / b} is damaged (it holds the entry of key '{a}', not '{b}'" in caplog.text, kind
    means = {k: v["mean"] for k, v in second["metrics"].items()}
    assert {k: v["mean"] for k, v in again["metrics"].items()} == pytest.approx(means, abs=1e-6)
    assert again["counts"] == second["counts"]
