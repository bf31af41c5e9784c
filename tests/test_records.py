"""Records (rag/store/cache.py get_record/put_record, checked by rag/store/cache_records.py): the small JSON results cached one by one (answers,
rerank scores, judgements, context lines, excerpts, listwise orders) are checked before use like
the artifacts are. A damaged, truncated, moved or unchecked record is named in one warning and read
as absent, so that its caller computes it again; a seed record is read only when its bytes match
the sha256 the seed's manifest lists for it."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from eval.judge import RECORD_KIND as JUDGEMENTS
from rag.store.cache import SEED_INDEX, ArtifactCache
from rag.store.cache_records import RECORD_SUMS
from rag.chunker.contextualize import CONTEXTS
from rag.compressor.llm import EXCERPTS
from rag.llm.answer_cache import RECORD_KIND as ANSWERS
from rag.llm.answer_cache import answer_keys, generate_resumable
from rag.reranker.listwise import ORDERS
from rag.reranker.pointwise import SCORES
from rag.store.seed import build_seed, seal_records
from rag.timing import StageTimer
from rag.types import Hits, RagError
from tests.scripted_endpoint import ScriptedEndpoint, echo
from tests.test_cross_encoder import _chunks, _reranker
from tests.test_openai_generator import CONTEXTS as PROMPT_CONTEXTS
from tests.test_openai_generator import QUESTIONS, generator

KINDS = [ANSWERS, SCORES, JUDGEMENTS, CONTEXTS, EXCERPTS, ORDERS]
RECORD = {"scores": [-5.42, 0.5], "text": "F_SETLK acquiert un verrou — ✓"}


@pytest.fixture(autouse=True)
def _warnings(caplog):
    caplog.set_level(logging.WARNING, logger="rag.store.cache")


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rag.store.cache"]


def flip_sign(path: Path) -> None:
    """-5.42 becomes 5.42: the file stays valid JSON and only the value changes."""
    raw = path.read_bytes()
    assert raw.count(b"-5.42") == 1
    path.write_bytes(raw.replace(b"-5.42", b" 5.42"))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def moved(path: Path) -> None:
    """Another key's intact record copied over this one (a file moved by hand)."""
    other = ArtifactCache(path.parents[2])
    kind = path.parents[1].name
    other.put_record(kind, "ffff0000other", RECORD)
    shutil.copyfile(other.record_path(kind, "ffff0000other"), path)


def unchecked(path: Path) -> None:
    """The format records had before they carried a checksum."""
    path.write_text(json.dumps({**RECORD, "key": path.stem}, ensure_ascii=False), encoding="utf-8")


DAMAGES = {
    "a flipped byte": (flip_sign, "is damaged (its body does not match its sha256)"),
    "a truncated file": (truncate, "is damaged (not valid JSON: truncated or overwritten)"),
    "another key's record": (moved, ("is damaged (it holds the record of key 'ffff0000other', not 'ab12cd': "
                                     "a moved or copied file)")),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_record_of_any_kind_is_named_read_as_absent_and_rebuilt(tmp_path, caplog, kind, damage):
    cache = ArtifactCache(tmp_path / "cache")
    cache.put_record(kind, "ab12cd", RECORD)
    path = cache.record_path(kind, "ab12cd")
    spoil, problem = DAMAGES[damage]
    spoil(path)
    assert cache.get_record(kind, "ab12cd") is None
    assert warnings(caplog) == [f"cache: record {path} {problem}; rebuilding it"]
    cache.put_record(kind, "ab12cd", RECORD)  # what every caller does with a record it lacks
    assert cache.get_record(kind, "ab12cd") == {**RECORD, "key": "ab12cd"}
    assert len(warnings(caplog)) == 1


def test_records_from_an_older_ragrig_are_rebuilt_with_one_line_per_kind(tmp_path, caplog):
    cache = ArtifactCache(tmp_path / "cache")
    for key in ("ab12cd", "ab34ef", "cd56ab"):
        cache.put_record(SCORES, key, RECORD)
        unchecked(cache.record_path(SCORES, key))
    assert all(cache.get_record(SCORES, key) is None for key in ("ab12cd", "ab34ef", "cd56ab"))
    folder = tmp_path / "cache" / SCORES
    assert warnings(caplog) == [f"cache: records in {folder} have no checksum (written by an older ragrig); "
                                "rebuilding each as it is read"]
    cache.put_record(SCORES, "ab12cd", RECORD)
    assert cache.get_record(SCORES, "ab12cd") == {**RECORD, "key": "ab12cd"}


def test_a_record_reads_back_exactly_as_written(tmp_path, caplog):
    cache = ArtifactCache(tmp_path)
    record = {"answer": "ça — 完了", "latency_ms": 0.1 + 0.2, "usage": {"z": 1, "a": 2}, "n": 10**20, "none": None}
    cache.put_record(ANSWERS, "k1", record)
    got = cache.get_record(ANSWERS, "k1")
    assert got == {**record, "key": "k1"} and list(got) == [*record, "key"], "values and field order kept"
    assert warnings(caplog) == []


def test_a_damaged_record_is_named_once_until_it_is_rewritten(tmp_path, caplog):
    cache = ArtifactCache(tmp_path)
    cache.put_record(SCORES, "k1", RECORD)
    flip_sign(cache.record_path(SCORES, "k1"))
    assert cache.get_record(SCORES, "k1") is None and cache.get_record(SCORES, "k1") is None
    assert len(warnings(caplog)) == 1, "a stage that looks twice (is it due? then read it) warns once"


# -- the seed: its records are checked against its manifest -----------------------------------

def make_seed(tmp_path: Path, records: dict[str, dict]) -> Path:
    source = ArtifactCache(tmp_path / "seeding-cache")
    for key, record in records.items():
        source.put_record(SCORES, key, record)
    build_seed(tmp_path / "seeding-cache", tmp_path / "seed", artifacts=(), records=(SCORES,))
    return tmp_path / "seed"


def test_a_seed_record_with_a_flipped_byte_is_ignored_and_computed_instead(tmp_path, caplog):
    seed = make_seed(tmp_path, {"ab12": RECORD, "cd34": {"scores": [1.0]}})
    path = ArtifactCache(seed).record_path(SCORES, "ab12")
    assert json.loads(path.read_text()) == {**RECORD, "key": "ab12"}, "the seed holds the body; its manifest the checksum"
    cache = ArtifactCache(tmp_path / "cache", seed=seed)
    assert cache.get_record(SCORES, "ab12")["scores"] == [-5.42, 0.5]
    flip_sign(path)
    assert cache.get_record(SCORES, "ab12") is None
    assert warnings(caplog) == [(f"cache: seed record {path} is damaged (its sha256 differs from the one in "
                                 f"{seed / SEED_INDEX}); computing it instead")]
    assert cache.get_record(SCORES, "cd34") == {"scores": [1.0], "key": "cd34"}, "the other records are still read"


def test_a_seed_record_its_manifest_does_not_list_is_not_read(tmp_path, caplog):
    seed = make_seed(tmp_path, {"ab12": RECORD})
    stray = ArtifactCache(seed).record_path(SCORES, "ee55")
    stray.parent.mkdir(parents=True)
    stray.write_text(json.dumps({**RECORD, "key": "ee55"}))
    assert ArtifactCache(tmp_path / "cache", seed=seed).get_record(SCORES, "ee55") is None
    assert warnings(caplog) == [f"cache: seed record {stray} has no checksum in {seed / SEED_INDEX}; computing it instead"]


def test_a_seed_record_moved_to_another_key_fails_that_keys_checksum(tmp_path, caplog):
    seed = make_seed(tmp_path, {"ab12": RECORD, "ab99": {"scores": [9.0]}})
    store = ArtifactCache(seed)
    shutil.copyfile(store.record_path(SCORES, "ab99"), store.record_path(SCORES, "ab12"))
    assert ArtifactCache(tmp_path / "cache", seed=seed).get_record(SCORES, "ab12") is None
    assert "is damaged (its sha256 differs from the one in" in warnings(caplog)[0]


def test_a_damaged_cache_record_gives_way_to_the_seeds_intact_one(tmp_path, caplog):
    seed = make_seed(tmp_path, {"ab12": RECORD})
    cache = ArtifactCache(tmp_path / "cache", seed=seed)
    cache.put_record(SCORES, "ab12", RECORD)
    truncate(cache.record_path(SCORES, "ab12"))
    assert cache.get_record(SCORES, "ab12") == {**RECORD, "key": "ab12"}
    assert len(warnings(caplog)) == 1 and "is damaged (not valid JSON" in warnings(caplog)[0]


def test_a_seed_without_a_manifest_gives_no_record(tmp_path, caplog):
    seed = make_seed(tmp_path, {"ab12": RECORD})
    (seed / SEED_INDEX).unlink()
    assert ArtifactCache(tmp_path / "cache", seed=seed).get_record(SCORES, "ab12") is None
    assert "has no checksum in" in warnings(caplog)[0]


def test_building_a_seed_ships_only_intact_records_with_their_checksums(tmp_path, caplog):
    source = ArtifactCache(tmp_path / "seeding-cache")
    source.put_record(SCORES, "ab12", RECORD)
    source.put_record(SCORES, "cd34", RECORD)
    flip_sign(source.record_path(SCORES, "cd34"))
    index = build_seed(tmp_path / "seeding-cache", tmp_path / "seed", artifacts=(), records=(SCORES,))
    assert index["records"] == {SCORES: 1} and list(index[RECORD_SUMS][SCORES]) == ["ab12"]
    assert not ArtifactCache(tmp_path / "seed").record_path(SCORES, "cd34").exists()
    assert json.loads((tmp_path / "seed" / SEED_INDEX).read_text())[RECORD_SUMS] == index[RECORD_SUMS]


def test_sealing_a_seed_writes_the_checksums_of_the_files_present_and_refuses_a_moved_one(tmp_path, caplog):
    seed = make_seed(tmp_path, {"ab12": RECORD, "cd34": {"scores": [1.0]}})
    path = ArtifactCache(seed).record_path(SCORES, "ab12")
    path.write_text(json.dumps({"scores": [2.0], "key": "ab12"}))  # a deliberate change
    index = seal_records(seed)
    assert index["records"] == {SCORES: 2}
    assert ArtifactCache(tmp_path / "cache", seed=seed).get_record(SCORES, "ab12")["scores"] == [2.0]
    shutil.copyfile(ArtifactCache(seed).record_path(SCORES, "cd34"), path)
    with pytest.raises(RagError, match=r"ab12.json: holds the record of key 'cd34', not 'ab12'; it is not sealed$"):
        seal_records(seed)
    path.write_text('{"scores": [2.0')
    with pytest.raises(RagError, match=r"ab12.json: not a JSON object; restore it \(git\) or remove it before sealing$"):
        seal_records(seed)


# -- through the components that read them -----------------------------------------------------

def test_the_cross_encoder_rescores_a_question_whose_recorded_scores_were_damaged(tmp_path, caplog):
    chunks = _chunks(["alpha", "beta gamma", "gamma", "beta"])
    hits = Hits(np.array([[0, 1, 2, 3]]), np.array([[4, 3, 2, 1]], np.float32))
    first, _ = _reranker(tmp_path, top_n=4)
    intact = first.rerank(["beta gamma"], hits, chunks, k=3)
    [path] = (tmp_path / SCORES).rglob("*.json")
    assert path.read_bytes().count(b"[0.0, ") == 1
    path.write_bytes(path.read_bytes().replace(b"[0.0, ", b"[99.0, "))  # alpha, scored 0, would come first
    again, fake = _reranker(tmp_path, top_n=4)
    out = again.rerank(["beta gamma"], hits, chunks, k=3)
    assert len(fake.calls) == 1, "scored again, not read"
    assert out.ids.tolist() == intact.ids.tolist() and out.scores.tolist() == intact.scores.tolist()
    assert warnings(caplog) == [f"cache: record {path} is damaged (its body does not match its sha256); rebuilding it"]
    assert again.recorded_scores("beta gamma", ["alpha", "beta gamma", "gamma", "beta"]).tolist() == [0, 2, 1, 1]


def test_a_damaged_answer_is_asked_for_again_and_only_that_one(tmp_path, caplog):
    cache, timer = ArtifactCache(tmp_path), StageTimer()
    with ScriptedEndpoint(echo) as srv:
        gen = generator(srv.base_url, endpoint={"concurrency": 1})
        made, _ = generate_resumable(gen, QUESTIONS, PROMPT_CONTEXTS, cache, timer)
        assert len(srv.chat_requests) == 6
        damaged = cache.record_path(ANSWERS, answer_keys(gen.id, QUESTIONS, PROMPT_CONTEXTS)[2])
        damaged.write_bytes(damaged.read_bytes().replace(b"answer: ", b"answer; ", 1))
        again, counts = generate_resumable(gen, QUESTIONS, PROMPT_CONTEXTS, cache, timer)
        assert len(srv.chat_requests) == 7 and counts == {"requests": 1, "resumed": 5}
    assert [a["answer"] for a in again] == [a["answer"] for a in made]
    assert warnings(caplog) == [f"cache: record {damaged} is damaged (its body does not match its sha256); rebuilding it"]
