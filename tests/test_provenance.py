"""Where a run's questions and relevance labels came from (rag/run/provenance.py: what a run records;
experiments/provenance.py: what the reports say of a set of runs). A run on a question file that
`python -m rag.testset` wrote says so in metrics.json, per_question.jsonl (with each generating
passage's text), its terminal table, the verdict, summary.md and report.html; a run on questions
written by people says nothing new anywhere."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.record import QuestionRecord
from experiments import provenance as XP
from experiments.aggregate import load_records
from experiments.report import ReportSettings
from experiments.report_files import build_report
from rag.run import provenance as RP
from rag.run.output import format_table
from rag.run.pipeline import run
from rag.types import Document, QAItem
from tests.conftest import TINY_DOCS, TINY_QA, tiny_overrides, write_jsonl
from tests.test_report_html import embedded

SMOL = {"class": "HFGenerator", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_new_tokens": 64}
TEXTS = {i: t for i, _, t in TINY_DOCS}


def made(kind: str, doc_id: str, piece: str, generator: dict | None = None) -> dict:
    start = TEXTS[doc_id].index(piece)
    return {"kind": kind, "passages": [{"id": f"{doc_id}#0", "doc_id": doc_id, "start": start, "end": start + len(piece)}],
            "generator": generator or SMOL, "prompts": {"question": "0123456789abcdef"}, "scores": {"word_overlap": 0.5}}


GENERATED = [
    ("gen-0000", "Why was fcntl64 added to Linux?", "To handle large file offsets in the flock structure.",
     "man:fcntl.2", "libc", made("how_why", "man:fcntl.2", "The original Linux fcntl() system call was not designed "
                                 "to handle large file offsets in the flock structure.")),
    ("gen-0001", "What does munmap delete?", "The mappings for the specified address range.", "man:mmap.2", "libc",
     made("factoid", "man:mmap.2", "The munmap() system call deletes the mappings for the specified address range.")),
    ("gen-0002", "How does AdamW apply weight decay?", "Directly to the parameters.", "torch:torch.optim.AdamW",
     "pytorch", made("factoid", "torch:torch.optim.AdamW", "the weight decay is applied directly to the parameters")),
]


def question_file(path: Path, with_human: bool = False) -> Path:
    rows = [{"id": i, "question": q, "answer": a, "doc_id": d, "group": g, "provenance": p}
            for i, q, a, d, g, p in GENERATED]
    if with_human:
        rows = [{"id": i, "question": q, "answer": a, "doc_id": d, "group": g} for i, q, a, d, g in TINY_QA] + rows
    return write_jsonl(path, rows)


# -- a run records ----------------------------------------------------------------------------


@pytest.mark.parametrize("generator, name", [
    (SMOL, "SmolLM2-135M-Instruct"), ({"class": "OpenAIGenerator", "model": "gpt-x"}, "gpt-x"),
    ({"class": "templates"}, "templates"), ({"_target_": "rag.llm.hf.HFGenerator"}, "HFGenerator"), (None, "unknown"),
])
def test_a_generator_is_named_by_its_model_or_class(generator, name):
    assert RP.generator_name(generator) == name


def test_the_counts_say_how_many_questions_were_generated_and_by_what():
    human = QAItem("q1", "Why?", "Because.")
    gen = [QAItem(f"g{i}", "Why?", "Because.", provenance=made("factoid", "pmid:1", "Ciclesonide", g))
           for i, g in enumerate([SMOL, {"class": "templates"}, SMOL])]
    assert RP.run_provenance([human, *gen]) == {
        "questions": {"human": 1, "generated": 3, "generators": ["SmolLM2-135M-Instruct", "templates"]},
        "labels": {"source": "qa"}}
    judged = {"source": "llm", "judge": "qwen", "prompt": "ab12", "pairs": 30, "unjudged": 2, "pooled_runs": 3}
    assert RP.run_provenance([human], judged)["labels"] == judged


def test_passage_texts_are_cut_from_the_runs_documents_and_the_questions_own_are_left_alone():
    docs = [Document(i, t, s) for i, s, t in TINY_DOCS]
    prov = GENERATED[1][5]
    odd = {**prov, "passages": [*prov["passages"], {"doc_id": "sliced-away", "start": 0, "end": 3},
                                {"doc_id": "pmid:1", "start": 5, "end": 10_000}, "not a passage"]}
    records = [QuestionRecord("q1"), QuestionRecord("gen-0001", provenance=odd)]
    RP.add_passage_texts(records, docs)
    got = records[1].provenance["passages"]
    assert got[0]["text"] == "The munmap() system call deletes the mappings for the specified address range."
    assert "text" not in got[1] and "text" not in got[2] and got[3] == "not a passage"  # no document, no fit
    assert records[0].provenance is None and "text" not in prov["passages"][0]  # the QAItem's dict is untouched


def test_in_words_only_what_is_not_the_default():
    human = {"questions": {"human": 6, "generated": 0, "generators": []}, "labels": {"source": "qa"}}
    assert RP.provenance_lines(human) == [] and RP.provenance_lines(None) == []
    gen = {"questions": {"human": 0, "generated": 20, "generators": ["SmolLM2-135M"]}, "labels": {"source": "qa"}}
    assert RP.provenance_lines(gen) == [
        "Questions: 20 generated by SmolLM2-135M (python -m rag.testset), not human-written.",
        "Relevance labels: from the question file."]
    mixed = {"questions": {"human": 40, "generated": 20, "generators": ["templates"]},
             "labels": {"source": "llm", "judge": "qwen2.5-7b", "prompt": "ab12", "pairs": 200, "unjudged": 3,
                        "pooled_runs": 4}}
    assert RP.provenance_lines(mixed) == [
        "Questions: 40 human-written, 20 generated from templates (python -m rag.testset).",
        "Relevance labels: graded 0-3 by an LLM judge (qwen2.5-7b, pooled over 4 runs; 3 of 200 pairs unjudged)."]
    llm_only = {**human, "labels": {**mixed["labels"], "pooled_runs": 1}}
    assert RP.provenance_lines(llm_only)[0] == "Questions: 6 human-written."
    assert "from this run's own retrieved chunks" in RP.provenance_lines(llm_only)[1]


# -- end to end: runs on generated questions, and what every report says ----------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Three tiny runs: on the question file of people (human), on a generated one (gen_a, gen_b:
    two chunk sizes) and on both together (mixed)."""
    from hydra import compose, initialize_config_dir

    from rag.config.compose import PROJECT_ROOT

    tmp = tmp_path_factory.mktemp("provenance")
    files = {"corpus": write_jsonl(tmp / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS]),
             "qa": write_jsonl(tmp / "qa.jsonl", [{"id": i, "question": q, "answer": a, "source": s, "corpus": c}
                                                  for i, q, a, s, c in TINY_QA]),
             "cache": tmp / "cache"}
    generated, mixed = question_file(tmp / "generated.jsonl"), question_file(tmp / "mixed.jsonl", with_human=True)
    plans = {"human": [], "gen_a": [f"qa.path={generated}"], "gen_b": [f"qa.path={generated}", "chunker.chunk_size=200"],
             "mixed": [f"qa.path={mixed}"]}
    out = {}
    for name, extra in plans.items():
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=tiny_overrides(files) + extra + [f"variant={name}"])
        run(cfg, tmp / "runs" / name)
        out[name] = tmp / "runs" / name
    return out


def metrics(path: Path) -> dict:
    return json.loads((path / "metrics.json").read_text())


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in (path / "per_question.jsonl").read_text().splitlines()]


def test_a_run_on_generated_questions_records_them_and_their_passages(runs):
    m = metrics(runs["gen_a"])
    assert m["provenance"] == {"questions": {"human": 0, "generated": 3, "generators": ["SmolLM2-135M-Instruct"]},
                               "labels": {"source": "qa"}}
    assert list(m)[-1] == "provenance"
    first = lines(runs["gen_a"])[0]
    (p,) = first["provenance"]["passages"]
    assert p["text"].startswith("The original Linux fcntl() system call") and p["text"] == TEXTS["man:fcntl.2"][p["start"]:p["end"]]
    assert first["provenance"]["kind"] == "how_why" and list(first)[6] == "provenance"
    assert "Questions: 3 generated by SmolLM2-135M-Instruct (python -m rag.testset), not human-written." in format_table(m)
    assert metrics(runs["mixed"])["provenance"]["questions"] == {"human": 6, "generated": 3,
                                                                  "generators": ["SmolLM2-135M-Instruct"]}


def test_a_run_on_questions_written_by_people_says_nothing_new(runs):
    m = metrics(runs["human"])
    assert m["provenance"] == {"questions": {"human": 6, "generated": 0, "generators": []}, "labels": {"source": "qa"}}
    assert not any("provenance" in r for r in lines(runs["human"]))
    assert "Questions" not in format_table(m) and "Relevance labels" not in format_table(m)
    page = (runs["human"] / "report.html").read_text(encoding="utf-8")
    assert 'class="meta provenance"' not in page and "Measured on" not in page
    assert not any("generated" in q for q in embedded(page)["questions"])


def test_the_single_run_report_marks_generated_questions(runs):
    page = (runs["gen_a"] / "report.html").read_text(encoding="utf-8")
    assert ('<p class="meta provenance">Questions: 3 generated by SmolLM2-135M-Instruct (python -m rag.testset), '
            "not human-written.</p>") in page
    verdict = re.search(r'id="verdict-text">(.*?)</p>', page, re.S).group(1)
    assert verdict.startswith("Measured on generated questions, not human-written ones.")
    questions = embedded(page)["questions"]
    assert all(q["generated"]["generator"] == "SmolLM2-135M-Instruct" for q in questions)


def test_a_sweep_on_generated_questions_says_so_in_the_verdict_and_summary(runs, tmp_path):
    rep = build_report(load_records([runs["gen_a"], runs["gen_b"]]), tmp_path / "out", ReportSettings(charts=False))
    md = (tmp_path / "out" / "summary.md").read_text()
    assert rep.verdict.startswith("Measured on generated questions, not human-written ones. ")
    assert "## Verdict\n\nMeasured on generated questions" in md
    assert ("## Questions and labels\n\nQuestions: 3 generated by SmolLM2-135M-Instruct (python -m rag.testset), "
            "not human-written.  \nRelevance labels: from the question file.\n\n## Results") in md
    assert md.index("## Questions and labels") < md.index("## Results")
    assert "Measured on generated questions" in rep.terminal()


def test_runs_that_differ_in_their_questions_are_told_apart(runs, tmp_path):
    records = load_records([runs["human"], runs["gen_a"], runs["mixed"]])
    rep = build_report(records, tmp_path / "out", ReportSettings(charts=False))
    md = (tmp_path / "out" / "summary.md").read_text()
    assert rep.verdict.startswith("Measured on questions partly generated, not only human-written ones "
                                  "(not in every run: see Questions and labels).")
    assert f"{XP.DIFFER}\n\n- human: {XP.DEFAULT}\n" in md
    assert ("- gen_a: Questions: 3 generated by SmolLM2-135M-Instruct (python -m rag.testset), not human-written. "
            "Relevance labels: from the question file.\n") in md
    assert "- mixed: Questions: 6 human-written, 3 generated by SmolLM2-135M-Instruct" in md
    page = rep.html.read_text(encoding="utf-8")
    assert f'<p class="meta provenance">{XP.DIFFER}</p>' in page
    data = embedded(page)
    marked = {q["id"] for q in data["questions"] if "generated" in q}
    assert marked == {i for i, *_ in GENERATED}, "only the generated questions are marked"


def test_a_report_over_runs_of_people_only_has_no_section_and_no_sentence(runs, tmp_path):
    rep = build_report(load_records([runs["human"]]), tmp_path / "out", ReportSettings(charts=False))
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "Questions and labels" not in md and "Measured on" not in md and not rep.provenance
