"""The held-out question sets (data/qa/heldout_*.jsonl and qa=heldout): well formed, naming real
documents, and sharing nothing with what the dev runs see. They are never tuned on, so these tests
are what keeps them honest."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from hydra.utils import instantiate

from rag.corpus.slicing import slice_questions
from rag.qa.jsonl import JsonlQuestions

ROOT = Path(__file__).resolve().parents[1]
QA = ROOT / "data" / "qa"
CORPORA = ("libc", "pytorch")
DEV = {c: QA / f"{c}.jsonl" for c in CORPORA}
HELDOUT = {c: QA / f"heldout_{c}.jsonl" for c in CORPORA}
KEYS = {"id", "question", "answer", "source", "corpus"}
MAN_ROOT = Path("/usr/share/man")


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_sources", QA / "check_sources.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


check_sources = _load_checker()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def all_records(files: dict[str, Path]) -> list[dict]:
    return [r for path in files.values() for r in records(path)]


@pytest.mark.parametrize("corpus", CORPORA)
def test_heldout_file_format(corpus, compose_cfg):
    rows = records(HELDOUT[corpus])
    for row in rows:
        assert set(row) == KEYS, row
        assert all(isinstance(row[k], str) and row[k].strip() for k in KEYS), row
        assert row["corpus"] == corpus
        assert re.fullmatch(rf"heldout-{corpus}-\d{{3}}", row["id"]), row["id"]
    items = JsonlQuestions(HELDOUT[corpus]).load()  # the loader the runs use accepts it
    assert [i.id for i in items] == [r["id"] for r in rows]
    # at least 40, and no more than a default run's slice keeps, so that run scores every one
    assert 40 <= len(rows) <= compose_cfg([]).slice.questions_per_corpus
    assert max(Counter(r["source"] for r in rows).values()) <= check_sources.MAX_PER_SOURCE


def test_ids_unique_across_dev_and_heldout():
    ids = [r["id"] for r in all_records(DEV) + all_records(HELDOUT)]
    assert [i for i, n in Counter(ids).items() if n > 1] == []


def test_no_heldout_question_appears_in_dev():
    dev, heldout = all_records(DEV), all_records(HELDOUT)
    dev_ids = {r["id"] for r in dev}
    dev_texts = {check_sources.normalize(r["question"]) for r in dev}
    assert [r["id"] for r in heldout if r["id"] in dev_ids] == []
    assert [r["question"] for r in heldout if check_sources.normalize(r["question"]) in dev_texts] == []
    score, h, d = check_sources.closest_pairs(heldout, dev)[0]
    assert score < check_sources.NEAR_DUPLICATE, (h["question"], d["question"])


@pytest.mark.parametrize("corpus", CORPORA)
def test_heldout_sources_exist(corpus):
    if corpus == "libc" and not (MAN_ROOT / "man2").is_dir():
        pytest.skip("man pages not installed (make setup installs manpages-dev)")
    docs_dir = check_sources.default_docs_dir()
    problems = {r["source"]: check_sources.source_problem(r["source"], corpus, MAN_ROOT, docs_dir)
                for r in records(HELDOUT[corpus])}
    assert {s: p for s, p in problems.items() if p} == {}


def test_checker_flags_repeated_and_reworded_dev_questions():
    dev = [{"id": "libc-001", "question": "Why was the fcntl64() system call added?", "where": "libc.jsonl:1"}]
    heldout = [
        {"id": "heldout-libc-001", "question": "why was the FCNTL64 system call added", "where": "h:1"},
        {"id": "heldout-libc-002", "question": "Why was the fcntl64() system call added in Linux?", "where": "h:2"},
        {"id": "heldout-libc-003", "question": "What does umask() return?", "where": "h:3"},
    ]
    problems: list[str] = []
    assert check_sources.check_heldout_vs_dev(heldout, dev, problems) == 1.0
    assert len(problems) == 2
    assert problems[0].startswith("h:1: question repeats dev libc-001")
    assert problems[1].startswith("h:2: question nearly repeats dev libc-001")


def test_qa_heldout_pubmed_questions_are_disjoint_from_the_dev_slice(compose_cfg):
    dev_cfg, held_cfg = compose_cfg([]), compose_cfg(["qa=heldout"])
    dev_slice = slice_questions(
        instantiate(dev_cfg.qa, _convert_="all").load(), dev_cfg.slice.questions_per_corpus, dev_cfg.slice.seed
    )
    heldout = instantiate(held_cfg.qa, _convert_="all").load()
    dev_pubmed = {q.id for q in dev_slice if q.corpus == "pubmed"}
    held_pubmed = {q.id for q in heldout if q.corpus == "pubmed"}
    # the test part of qa.split (its train part trains the cross-encoder) less the dev slice
    test_part = {q.id for q in instantiate(held_cfg.qa.parts[0], _convert_="all").items()}
    assert len(dev_pubmed) == 50 and len(held_pubmed) == 136 and held_pubmed < test_part
    assert dev_pubmed.isdisjoint(held_pubmed)
    assert {q.id for q in dev_slice}.isdisjoint({q.id for q in heldout})
    # the exclusion is pinned to the default slice, so it holds whatever a held-out run overrides
    assert dict(held_cfg.qa.parts[0].exclude_slice) == {
        "questions_per_corpus": dev_cfg.slice.questions_per_corpus, "seed": dev_cfg.slice.seed
    }
    # a default-slice held-out run: 50 unseen PubMed questions and every hand-written one
    held_slice = slice_questions(heldout, held_cfg.slice.questions_per_corpus, held_cfg.slice.seed)
    counts = Counter(q.corpus for q in held_slice)
    assert counts == {"pubmed": 50, **{c: len(records(HELDOUT[c])) for c in CORPORA}}
    assert {q.id for q in held_slice if q.corpus == "pubmed"}.isdisjoint(dev_pubmed)
