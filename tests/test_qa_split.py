"""qa.split: a deterministic train/test split of a question set by a seeded hash of the question id.
The reranker trains on the train part only; everything a run scores comes from the test part (or
from `all`, whose default slice lies inside the test part)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag.corpus.slicing import slice_questions
from rag.qa.base import QuestionSplit, split_hash
from rag.qa.jsonl import JsonlQuestions
from rag.qa.mixed import MixedQuestions
from rag.types import QAItem, RagError
from tests.conftest import write_jsonl


def _items(n: int, corpus: str = "c") -> list[QAItem]:
    return [QAItem(f"{corpus}-{i}", f"question {i}?", "answer", None, corpus) for i in range(n)]


def test_parts_partition_the_set_deterministically():
    items = _items(500)
    split = QuestionSplit(fraction=0.3, seed=4)
    train = split.with_part("train").apply(items)
    test = split.with_part("test").apply(items)
    assert {q.id for q in train}.isdisjoint({q.id for q in test})
    assert len(train) + len(test) == 500 and 100 < len(test) < 200
    assert split.apply(items) == items  # part "all" keeps every question, in order
    assert QuestionSplit(fraction=0.3, seed=4, part="test").apply(list(reversed(items))) == list(reversed(test))
    assert QuestionSplit(fraction=0.3, seed=5, part="test").apply(items) != test  # the seed matters


def test_a_question_keeps_its_part_when_others_are_added():
    split = QuestionSplit(fraction=0.2, seed=0, part="test")
    small = {q.id for q in split.apply(_items(100))}
    large = {q.id for q in split.apply(_items(1000))}
    assert small == {i for i in large if int(i.split("-")[1]) < 100}


def test_a_slice_of_the_test_part_is_the_slice_of_the_whole_set():
    """The slice keeps the smallest seeded hashes first, and the test part is the hashes below the
    fraction: with the same seed, slicing the test part gives the same questions as slicing all."""
    items = _items(300, "a") + _items(300, "b")
    for seed in (0, 3):
        split = QuestionSplit(fraction=0.25, seed=seed)
        whole = slice_questions(items, 40, seed)
        of_test = slice_questions(split.with_part("test").apply(items), 40, seed)
        assert [q.id for q in whole] == [q.id for q in of_test]
        assert all(split.in_test(q.id) for q in whole)
        assert all(split_hash(q.id, seed) < 0.25 for q in whole)


def test_split_is_checked():
    with pytest.raises(RagError, match="part"):
        QuestionSplit(part="dev")
    with pytest.raises(RagError, match="fraction"):
        QuestionSplit(fraction=1.0)
    with pytest.raises(RagError, match="unknown key"):
        QuestionSplit.of({"fraction": 0.2, "parts": "train"})


def test_question_sets_apply_their_split_and_report_it(tmp_path: Path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"id": f"q{i}", "question": f"q {i}?", "answer": "a"} for i in range(60)])
    whole = JsonlQuestions(path).load()
    test = JsonlQuestions(path, split={"fraction": 0.5, "seed": 1, "part": "test"}).load()
    train = JsonlQuestions(path, split={"fraction": 0.5, "seed": 1, "part": "train"}).load()
    assert len(whole) == 60 and {q.id for q in test} | {q.id for q in train} == {q.id for q in whole}
    assert JsonlQuestions(path, split={"part": "test"}).fingerprint()["split"] == {"fraction": 0.2, "seed": 0, "part": "test"}
    mixed = MixedQuestions([JsonlQuestions(path)], split={"fraction": 0.5, "seed": 1, "part": "train"})
    assert [q.id for q in mixed.load()] == [q.id for q in train]
    with pytest.raises(RagError, match="empty"):
        JsonlQuestions(path, split={"fraction": 1e-9, "seed": 1, "part": "test"}).load()


def test_every_question_config_has_a_split_that_defaults_to_all(compose_cfg):
    from hydra.utils import instantiate

    for name in ("mixed", "pubmedqa", "technical"):
        cfg = compose_cfg([f"qa={name}"])
        assert cfg.qa.split.part == "all"
        assert instantiate(cfg.qa).split == QuestionSplit(0.2, 0, "all")


def test_run_records_the_split_and_scores_only_the_test_part(tiny_files, compose_cfg):
    """metrics.json names the split; per_question.jsonl holds only test-part questions."""
    from rag.run.pipeline import run
    from tests.conftest import tiny_overrides

    cfg = compose_cfg(tiny_overrides(tiny_files) + ["qa.split.part=test", "qa.split.fraction=0.5", "qa.split.seed=2"])
    result = run(cfg, tiny_files["out"])
    assert result["qa_split"] == {"fraction": 0.5, "seed": 2, "part": "test"}
    split = QuestionSplit(0.5, 2)
    scored = [json.loads(line)["id"] for line in (tiny_files["out"] / "per_question.jsonl").read_text().splitlines()]
    assert scored and all(split.in_test(i) for i in scored)


def _scored_ids(compose_cfg, overrides: list[str]) -> set[str]:
    """The question ids a run with these overrides scores (its questions, sliced as run does)."""
    from hydra.utils import instantiate

    cfg = compose_cfg(overrides)
    return {q.id for q in slice_questions(instantiate(cfg.qa).load(), cfg.slice.questions_per_corpus, cfg.slice.seed)}


def _trained_ids(compose_cfg, overrides: list[str]) -> set[str]:
    from hydra.utils import instantiate

    from rag.reranker.training.labelled import training_questions

    cfg = compose_cfg(["reranker=cross_encoder", *overrides])
    return {q.id for q in training_questions(instantiate(cfg.reranker.train.labelled))}


@pytest.mark.parametrize("runs", [
    [],  # the dev runs: the default slice of qa=mixed
    ["slice.questions_per_corpus=null", "qa.split.part=test"],  # every test-part question
    ["qa=heldout"],  # the held-out verdict runs
    ["qa=heldout", "slice.questions_per_corpus=null"],  # the whole held-out set
    ["qa=pubmedqa", "qa.split.part=test", "slice.questions_per_corpus=null"],
])
def test_no_question_the_reranker_trains_on_is_ever_scored(compose_cfg, runs):
    """The reranker's labelled questions (reranker.train.labelled: the train part of PubMedQA)
    and the questions these runs score are disjoint."""
    trained = _trained_ids(compose_cfg, [])
    assert len(trained) > 500  # the train part is most of PubMedQA
    scored = _scored_ids(compose_cfg, runs)
    assert scored and not trained & scored


def test_the_dev_and_heldout_pubmed_slices_lie_in_the_test_part(compose_cfg):
    """So that a run on qa.split.part=test scores the same dev slice as the default run."""
    default = _scored_ids(compose_cfg, [])
    test_part = _scored_ids(compose_cfg, ["qa.split.part=test"])
    pubmed = {i for i in default if i.startswith("pubmedqa:")}
    assert len(pubmed) == 50 and pubmed <= test_part
