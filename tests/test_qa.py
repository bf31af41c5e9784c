"""Question sets: PubMedQA, JSON lines and their concatenation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag.config.compose import data_dir
from rag.qa.jsonl import JsonlQuestions
from rag.qa.mixed import MixedQuestions
from rag.qa.pubmedqa import PubMedQAQuestions
from rag.types import QAItem, RagError, Relevance

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir()  # ships with the project: these tests never skip for want of it
PUBMEDQA = DATA / "pubmedqa" / "ori_pqal.json"



def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def q(i: str, **extra) -> dict:
    return {"id": i, "question": f"question {i}?", "answer": f"answer {i}", **extra}


def test_pubmedqa_questions():
    raw = json.loads(PUBMEDQA.read_text(encoding="utf-8"))
    items = PubMedQAQuestions(path=str(PUBMEDQA)).load()
    assert len(items) == 1000
    first = raw["21645374"]
    text = "\n\n".join(first["CONTEXTS"]) + "\n\n" + first["LONG_ANSWER"]
    assert items[0] == QAItem(
        id="pubmedqa:21645374",
        question=first["QUESTION"],
        answer=first["LONG_ANSWER"],
        source="pmid:21645374",
        corpus="pubmed",
        relevant=(Relevance("pmid:21645374", 1, (len(text) - len(first["LONG_ANSWER"]), len(text))),),
    )
    assert [i.id for i in items] == [f"pubmedqa:{k}" for k in raw]
    assert {i.corpus for i in items} == {"pubmed"}
    fp = PubMedQAQuestions(PUBMEDQA).fingerprint()
    assert fp["inputs"]["size"] == PUBMEDQA.stat().st_size


def test_pubmedqa_questions_missing_file(tmp_path):
    with pytest.raises(RagError, match="x.json: file not found"):
        PubMedQAQuestions(tmp_path / "x.json").load()


def test_jsonl_questions(tmp_path):
    path = write_jsonl(
        tmp_path / "qa.jsonl",
        [q("a", source="man:fcntl.2", corpus="libc"), "", q("b"), q("c", source=None)],
    )
    items = JsonlQuestions(path=str(path)).load()
    assert items == [
        QAItem("a", "question a?", "answer a", "man:fcntl.2", "libc"),
        QAItem("b", "question b?", "answer b", None, None),
        QAItem("c", "question c?", "answer c", None, None),
    ]
    assert JsonlQuestions(path).fingerprint()["inputs"]["path"] == str(path)


def test_jsonl_questions_with_graded_labels(tmp_path):
    rows = [
        q("a", source="man:fcntl.2", relevant=[{"doc": "man:fcntl.2", "grade": 2, "span": [10, 40]}, {"doc": "man:open.2"}]),
        {"id": "b", "question": "no answer, labels only?", "relevant": [{"doc": "man:open.2", "grade": 0}]},
        q("c", source="man:open.2"),
    ]
    a, b, c = JsonlQuestions(write_jsonl(tmp_path / "qa.jsonl", rows)).load()
    assert a.labels == (Relevance("man:fcntl.2", 2, (10, 40)), Relevance("man:open.2", 1))
    assert a.source == "man:fcntl.2", "source stays what it was: the by-source-id metrics use it"
    assert b.answer is None and b.labels == (Relevance("man:open.2", 0),)
    assert c.relevant == () and c.labels == (Relevance("man:open.2", 1),), "a plain source is one label of grade 1"


GENERATED = {"kind": "factoid", "passages": [{"id": "man:fcntl.2#0", "doc_id": "man:fcntl.2", "start": 0, "end": 40}],
             "generator": {"class": "OpenAIGenerator", "model": "m"}, "prompts": {"question": "0123456789abcdef"},
             "scores": {"word_overlap": 0.4}}


def test_a_generated_question_keeps_its_provenance_and_a_written_one_has_none(tmp_path):
    rows = [q("gen-0001", doc_id="man:fcntl.2", provenance=GENERATED), q("b"), q("c", provenance=None)]
    gen, human, unmarked = JsonlQuestions(write_jsonl(tmp_path / "qa.jsonl", rows)).load()
    assert gen.provenance == GENERATED and "text" not in gen.provenance["passages"][0]  # spans only, as written
    assert human.provenance is None and unmarked.provenance is None
    assert "provenance" not in human.to_json() and gen.to_json()["provenance"] == GENERATED
    assert len({gen, human}) == 2, "an item with provenance stays hashable"


@pytest.mark.parametrize(
    "rows, pattern",
    [
        ([q("a"), '{"id": "b", "question": "x?", }'], r"qa.jsonl:2: invalid JSON"),
        ([q("a"), {"id": "b", "answer": "y"}], r"qa.jsonl:2: no 'question' field \(fields: id, answer\)"),
        ([q("a"), {"id": "b", "question": None, "answer": "y"}], r"qa.jsonl:2: missing or empty field 'question'"),
        ([q("a"), q("b"), {"id": "c", "question": "x?", "answer": "  "}], r"qa.jsonl:3: missing or empty field 'answer'"),
        ([{"question": "x?", "answer": "y"}], r"qa.jsonl:1: no 'id' field \(fields: question, answer\)"),
        ([{"id": "", "question": "x?", "answer": "y"}], r"qa.jsonl:1: missing or empty field 'id'"),
        ([{"id": "a", "question": ["x"], "answer": "y"}], r"qa.jsonl:1: field 'question' must be a string"),
        ([q("a"), q("b"), q("a")], r"qa.jsonl:3: duplicate question id 'a' \(first on line 1\)"),
        (['"just a string"'], r"qa.jsonl:1: expected a JSON object"),
        (["", " "], r"qa.jsonl: file is empty"),
        ([q("a", relevant={"doc": "d"})], r"qa.jsonl:1: field 'relevant' must be a list of objects"),
        ([q("a", relevant=[])], r"qa.jsonl:1: field 'relevant' is an empty list"),
        ([q("a", relevant=["d"])], r"qa.jsonl:1: relevant\[0\] must be an object"),
        ([q("a", relevant=[{"doc": "d", "score": 1}])], r"qa.jsonl:1: relevant\[0\]: unknown field\(s\) \['score'\]"),
        ([q("a", relevant=[{"grade": 1}])], r"qa.jsonl:1: relevant\[0\]: missing or empty field 'doc'"),
        ([q("a", relevant=[{"doc": "d", "grade": -1}])], r"'grade' must be a non-negative integer, got -1"),
        ([q("a", relevant=[{"doc": "d", "grade": True}])], r"'grade' must be a non-negative integer, got True"),
        ([q("a", relevant=[{"doc": "d", "span": [1, 2, 3]}])], r"'span' must be \[start, end\]"),
        ([q("a", relevant=[{"doc": "d", "span": [-1, 2]}])], r"'span' must be \[start, end\]"),
        ([q("a"), q("b", provenance=["factoid"])], r"qa.jsonl:2: field 'provenance' must be an object .*got list"),
        ([q("a", provenance="python -m rag.testset")], r"qa.jsonl:1: field 'provenance' must be an object"),
    ],
)
def test_jsonl_questions_errors(tmp_path, rows, pattern):
    path = write_jsonl(tmp_path / "qa.jsonl", rows)
    with pytest.raises(RagError, match=pattern) as e:
        JsonlQuestions(path).load()
    assert "\n" not in str(e.value)


def test_question_files_name_the_document_doc_id_and_the_group_group_and_read_the_old_names(tmp_path):
    rows = [q("a", doc_id="man:fcntl.2", group="libc"),
            q("b", source="man:open.2", corpus="libc"),  # a file written before doc_id and group
            q("c", doc_id="man:mmap.2", source="man:open.2", group="libc", corpus="pytorch")]  # the new names win
    a, b, c = JsonlQuestions(write_jsonl(tmp_path / "qa.jsonl", rows)).load()
    assert (a.source, a.corpus) == ("man:fcntl.2", "libc")
    assert (b.source, b.corpus) == ("man:open.2", "libc")
    assert (c.source, c.corpus) == ("man:mmap.2", "libc")


@pytest.mark.parametrize("row, expect", [
    ({"id": "b", "query": "What is it?", "answer": "y"},
     "qa.jsonl:2: no 'question' field (fields: id, query, answer); set qa.question_field=query to read another field"),
    ({"id": "b", "question": "What is it?", "response": "It is y.", "doc_id": "d"},
     "qa.jsonl:2: no 'answer' field (fields: id, question, response, doc_id); set qa.answer_field=response to read "
     "another field (or give graded 'relevant' labels)"),
    ({"qid": "b", "question": "What?", "answer": "y", "doc_id": "d"},
     "qa.jsonl:2: no 'id' field (fields: qid, question, answer, doc_id); set qa.id_field=qid to read another field"),
])
def test_a_missing_question_field_names_the_setting_that_reads_another(tmp_path, row, expect):
    with pytest.raises(RagError) as e:
        JsonlQuestions(write_jsonl(tmp_path / "qa.jsonl", [q("a"), row])).load()
    assert expect in str(e.value)
    assert "\n" not in str(e.value)


def test_the_settings_the_errors_name_read_the_file(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"qid": "a", "query": "Why?", "response": "Because."}])
    plain = JsonlQuestions(path)
    renamed = JsonlQuestions(path, id_field="qid", question_field="query", answer_field="response")
    assert renamed.load() == [QAItem("a", "Why?", "Because.", None, None)]
    assert renamed.fingerprint() != plain.fingerprint()
    assert "fields" not in plain.fingerprint(), "the default reading keeps the key it always had"


def test_jsonl_questions_file_errors(tmp_path):
    with pytest.raises(RagError, match="qa.jsonl: file not found"):
        JsonlQuestions(tmp_path / "qa.jsonl").load()
    (tmp_path / "qa.jsonl").write_bytes(json.dumps(q("a")).encode() + b'\n{"id": "b\xe9"}\n')
    with pytest.raises(RagError, match=r"qa.jsonl:2: invalid UTF-8"):
        JsonlQuestions(tmp_path / "qa.jsonl").load()


def test_mixed_questions(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [q("a1"), q("a2")])
    b = write_jsonl(tmp_path / "b.jsonl", [q("b1")])
    mixed = MixedQuestions(parts=[JsonlQuestions(a), JsonlQuestions(b)])
    assert [i.id for i in mixed.load()] == ["a1", "a2", "b1"]
    assert [p["class"] for p in mixed.fingerprint()["parts"]] == ["JsonlQuestions", "JsonlQuestions"]
    with pytest.raises(RagError, match="duplicate question id 'a1' in part 2"):
        MixedQuestions(parts=[JsonlQuestions(a), JsonlQuestions(b), JsonlQuestions(a)]).load()
    with pytest.raises(RagError, match="'parts' is empty"):
        MixedQuestions(parts=[])


def test_mixed_questions_from_hydra_config(tmp_path):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    a = write_jsonl(tmp_path / "a.jsonl", [q("a1")])
    b = write_jsonl(tmp_path / "b.jsonl", [q("b1")])
    cfg = OmegaConf.create(
        {"_target_": "rag.qa.mixed.MixedQuestions",
         "parts": [{"_target_": "rag.qa.jsonl.JsonlQuestions", "path": str(p)} for p in (a, b)]}
    )
    assert [i.id for i in instantiate(cfg).load()] == ["a1", "b1"]
    assert [i.id for i in instantiate(cfg, _convert_="all").load()] == ["a1", "b1"]


@pytest.mark.parametrize("name", ["libc", "pytorch"])
def test_project_question_sets_load(name):
    path = ROOT / "data" / "qa" / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present")
    items = JsonlQuestions(path).load()
    assert items and {i.corpus for i in items} == {name}
    assert all(i.source for i in items)


def test_pubmedqa_exclude_slice_leaves_out_exactly_that_slice():
    from rag.corpus.slicing import slice_questions

    full = PubMedQAQuestions(PUBMEDQA).load()
    picked = {q.id for q in slice_questions(full, 50, 0)}
    rest = PubMedQAQuestions(PUBMEDQA, exclude_slice={"questions_per_corpus": 50, "seed": 0}).load()
    assert len(picked) == 50 and len(rest) == 950
    assert {q.id for q in rest} == {q.id for q in full} - picked
    assert [q.id for q in rest] == [q.id for q in full if q.id not in picked]  # file order kept
    other_seed = PubMedQAQuestions(PUBMEDQA, exclude_slice={"questions_per_corpus": 50, "seed": 1}).load()
    assert {q.id for q in other_seed} != {q.id for q in rest}


def test_pubmedqa_exclude_slice_fingerprint():
    plain = PubMedQAQuestions(PUBMEDQA).fingerprint()
    assert "exclude_slice" not in plain  # runs without the option keep their fingerprints
    held = PubMedQAQuestions(PUBMEDQA, exclude_slice={"questions_per_corpus": 50, "seed": 0}).fingerprint()
    assert held["exclude_slice"] == {"questions_per_corpus": 50, "seed": 0}
    assert held["inputs"] == plain["inputs"]


@pytest.mark.parametrize(
    "exclude, pattern",
    [
        ({"questions_per_corpus": 50}, r"exactly the keys \['questions_per_corpus', 'seed'\]"),
        ({"questions_per_corpus": 50, "seed": 0, "extra": 1}, r"exactly the keys"),
        ([50, 0], r"must be a mapping"),
        ({"questions_per_corpus": "50", "seed": 0}, r"exclude_slice.questions_per_corpus must be an integer, got '50'"),
        ({"questions_per_corpus": 50, "seed": True}, r"exclude_slice.seed must be an integer, got True"),
        ({"questions_per_corpus": 0, "seed": 0}, r"exclude_slice.questions_per_corpus must be positive, got 0"),
    ],
)
def test_pubmedqa_exclude_slice_errors(exclude, pattern):
    with pytest.raises(RagError, match=pattern):
        PubMedQAQuestions(PUBMEDQA, exclude_slice=exclude)
