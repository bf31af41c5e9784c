"""`python -m rag.testset` (rag/testset/): a question file for a corpus with no questions. Passages are
drawn so that every source and document gets its share, each question is written and answered by
the configured llm (or by the templates of man pages and docstrings), every reply is recorded so a
rerun asks nothing, a dry run counts what a run sends, each filter drops the question it is for, and
the file is a question set that qa=jsonl and a run read as they are."""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rag.qa.jsonl import JsonlQuestions
from rag.testset import filters
from rag.testset.__main__ import generate, main
from rag.testset.passages import Passages, askable, draw, prose_share, spread_counts
from rag.testset.prompts import EXAMPLE_QUESTIONS, clean_answer, parse_question
from rag.testset.settings import load_testset
from rag.types import Document, RagError
from tests.conftest import MODEL_CACHE, write_jsonl
from tests.scripted_endpoint import ScriptedEndpoint, completion

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "examples" / "toy" / "docs.jsonl"


class Chunks:
    """A chunker giving each paragraph of a document as a passage."""

    def split(self, doc: Document):
        from rag.types import Chunk

        out, pos = [], 0
        for n, para in enumerate(doc.text.split("\n\n")):
            start = doc.text.index(para, pos)
            pos = start + len(para)
            out.append(Chunk(f"{doc.id}#{n}", doc.id, para, doc.source, start, pos, n))
        return out


def sentence(i: int) -> str:
    return f"Paragraph {i} explains a rule that holds for every member of the club and is written as plain prose."


def test_passages_are_drawn_from_every_source_and_every_document_in_turn():
    docs = ([Document(f"a{i}", "\n\n".join(sentence(j) for j in range(3)), "alpha") for i in range(2)]
            + [Document(f"b{i}", sentence(0), "beta") for i in range(6)])
    passages = Passages(docs, Chunks())
    rows, _ = askable(passages, 50, 0.8)
    slots = draw(rows, passages, 8, [("factoid", 1.0)], seed=0)
    sources = Counter(passages[s.rows[0]].source for s in slots)
    assert sources == {"alpha": 4, "beta": 4}, "the sources take turns, whatever their number of passages"
    per_doc = Counter(passages[s.rows[0]].doc_id for s in slots)
    assert per_doc["a0"] == per_doc["a1"] == 2 and all(per_doc[f"b{i}"] <= 1 for i in range(6)), \
        "a source's documents take turns"
    again = draw(rows, passages, 8, [("factoid", 1.0)], seed=0)
    assert again == slots and draw(rows, passages, 8, [("factoid", 1.0)], seed=1) != slots, "seeded"
    assert draw(rows, passages, 12, [("factoid", 1.0)], seed=0)[:8] == slots, \
        "more questions draw more passages after the same ones (their records are reused)"
    assert spread_counts(per_doc, [d.id for d in docs]) == {"min": 0, "median": 1.0, "max": 2}


def test_kinds_follow_their_shares_and_two_passages_come_from_one_document():
    docs = [Document(f"d{i}", "\n\n".join(sentence(j) for j in range(2)), "s") for i in range(10)]
    passages = Passages(docs, Chunks())
    rows, _ = askable(passages, 50, 0.8)
    slots = draw(rows, passages, 20, [("factoid", 0.5), ("how_why", 0.3), ("two_passage", 0.2)], seed=3)
    assert Counter(s.kind for s in slots) == {"factoid": 10, "how_why": 6, "two_passage": 4}
    for s in slots:
        docs_of = {passages[r].doc_id for r in s.rows}
        assert len(docs_of) == 1 and len(s.rows) == (2 if s.kind == "two_passage" else 1)
    single = Passages([Document("one", sentence(0), "s")], Chunks())
    assert {s.kind for s in draw([0], single, 5, [("factoid", 0.5), ("two_passage", 0.5)], 0)} == {"factoid"}, \
        "a document of one passage gets no two-passage question"


def test_short_and_non_prose_passages_are_never_asked_about():
    code = "def area(radius):\n    return 3.14159 * radius ** 2\nfor r in range(10):\n    print(r, area(r))"
    toc = "\n".join(f"{i}.{j} Section ........................ {10 * i + j}" for i in range(1, 4) for j in range(3))
    docs = [Document("prose", sentence(1), "s"), Document("short", "Room 4 is closed.", "s"),
            Document("code", code, "s"), Document("toc", toc, "s")]
    passages = Passages(docs, Chunks())
    rows, dropped = askable(passages, 60, 0.8)
    assert [passages[r].doc_id for r in rows] == ["prose"]
    assert dropped == {"short": 1, "not_prose": 2}
    assert prose_share(sentence(1)) == 1.0 and prose_share(toc) == 0.0


def test_the_question_filters_measure_what_they_say():
    passage = "Disc brake pads need replacing when the friction material is thinner than 0.5 mm."
    assert filters.copied_words("When do disc brake pads need replacing?", passage) == 5
    assert filters.copied_words("Is it true that disc brake pads need replacing when the friction material is thin?",
                                passage) == 10
    assert filters.word_overlap("What is the answer to this classic question?", passage) == 0.0
    assert filters.word_overlap("When are brake pads replaced?", passage) == 1.0, "stemmed: replaced, replacing"
    assert filters.word_overlap("When should rear brake pads be replaced?", passage) == 0.75, "'rear' is not in it"
    assert filters.answer_support("When it is thinner than 0.5 mm.", passage) == 1.0
    assert filters.answer_support("Every two years, at a bike shop.", passage) == 0.0
    assert filters.answer_support("No answer here.", passage, no_answer="No answer  here.") == 0.0
    keep, cos = filters.duplicates(np.array([[1.0, 0.0], [0.96, 0.28], [0.28, 0.96]]), 0.9)
    assert keep == [True, False, True] and cos == [0.0, 0.96, 0.28], "compared with the kept questions only"


def test_a_reply_is_a_question_only_when_it_reads_as_one():
    assert parse_question("Question: How do I check tyre pressure?\n\nAnswer: weekly") == "How do I check tyre pressure?"
    assert parse_question("What is the answer to the question \"") is None, "no question mark"
    assert parse_question("Why?") is None, "too short"
    assert parse_question(next(iter(EXAMPLE_QUESTIONS))) is None, "a few-shot example copied"
    assert clean_answer("The answer to the question is:  15\nminutes.") == "15 minutes."
    assert clean_answer("Answer: weekly") == "weekly" and clean_answer("The answer is no.") == "no."


# -- through a scripted OpenAI-compatible server -----------------------------------------------

def title(text: str) -> str:
    return text.split(".")[0].strip()


def toy_chat(request, n):
    """A good question about the passage's title (the toy documents start with one), and as its
    answer the passage's second sentence."""
    user = request["messages"][-1]["content"]
    if user.rstrip().endswith("Question:"):
        passage = user.rsplit("Passage", 1)[1].split(":", 1)[1].rsplit("\nQuestion:", 1)[0]
        return 200, {}, completion(f"What should I know about {title(passage).lower()}?")
    context = user.split("[1] ", 1)[1]
    return 200, {}, completion(context.split(". ")[1].split("\n")[0] + ".")


def overrides(srv: ScriptedEndpoint, tmp_path: Path, *extra: str) -> list[str]:
    return ["corpus=jsonl", f"corpus.path={TOY}", "llm=openai", f"llm.base_url={srv.base_url}", "llm.model=m",
            f"paths.cache={tmp_path / 'cache'}", f"paths.model_cache={MODEL_CACHE}",
            f"testset.out={tmp_path / 'toy.jsonl'}", "testset.n=8", "testset.oversample=1.5", *extra]


def sent_question_tokens(srv: ScriptedEndpoint) -> int:
    """What llm=openai's dry run counts for the question prompts the server received."""
    return sum(round(sum(len(m["content"]) for m in r["json"]["messages"]) / 4) for r in srv.chat_requests
               if r["json"]["messages"][-1]["content"].rstrip().endswith("Question:"))


def test_a_served_llm_writes_the_toy_set_the_dry_run_counts_it_and_a_rerun_asks_nothing(tmp_path):
    with ScriptedEndpoint(chat=toy_chat) as srv:
        dry = generate(overrides(srv, tmp_path, "testset.dry_run=true"))["requests"]
        assert srv.requests == [] and not (tmp_path / "toy.jsonl").exists(), "a dry run sends and writes nothing"
        assert json.loads((tmp_path / "toy.dry_run.json").read_text())["requests"] == dry
        summary = generate(overrides(srv, tmp_path))
        sent = len(srv.chat_requests)
        assert sent == 24 == summary["requests"]["requests"], "12 passages (8 x 1.5): a question and an answer each"
        assert dry["requests"] == sent and dry["question"]["requests"] == 12 and not dry["exact"], \
            "answers are counted as at most one per question"
        assert dry["question"]["prompt_tokens"] == sent_question_tokens(srv)
        first = (tmp_path / "toy.jsonl").read_bytes()
        saved = json.loads((tmp_path / "toy.summary.json").read_text())
        again = generate(overrides(srv, tmp_path))
        assert len(srv.chat_requests) == sent and again["requests"]["from_cache"] == 24, "every reply is recorded"
        assert (tmp_path / "toy.jsonl").read_bytes() == first
        assert generate(overrides(srv, tmp_path, "testset.dry_run=true"))["requests"]["requests"] == 0
        generate(overrides(srv, tmp_path, "testset.n=10"))
        assert len(srv.chat_requests) == sent + 6, "three more passages: only they are asked about"
    rows = [json.loads(line) for line in first.decode().splitlines()]
    assert len(rows) == 8 and summary["written"] == 8
    assert summary["per_source"] == {"bikes": 4, "bread": 4}
    assert summary["per_document"] == {"min": 0, "median": 0.0, "max": 1, "documents": 20}
    assert summary["questions"][-1] == {"filter": "duplicate", "kept": "not a duplicate", "dropped": 0, "left": 12,
                                        "share": 1.0}
    assert saved["per_source"] == summary["per_source"] and saved["requests"]["requests"] == 24
    prov = rows[0]["provenance"]
    assert set(prov) == {"kind", "passages", "generator", "prompts", "scores"}
    assert prov["generator"]["model"] == "m" and re.fullmatch(r"[0-9a-f]{16}", prov["prompts"]["question"])
    docs = {json.loads(line)["id"]: json.loads(line)["text"] for line in TOY.read_text().splitlines()}
    for r in rows:
        (p,) = r["provenance"]["passages"]
        assert p["doc_id"] == r["doc_id"] and title(docs[r["doc_id"]][p["start"]:p["end"]]).lower() in r["question"]
        assert set(r["provenance"]["scores"]) == {"copied_words", "word_overlap", "answer_support", "duplicate_cosine"}


def test_the_written_file_is_a_question_set_for_qa_jsonl_and_a_run(tmp_path, compose_cfg):
    from rag.run.pipeline import run

    with ScriptedEndpoint(chat=toy_chat) as srv:
        generate(overrides(srv, tmp_path, "testset.n=4"))
    out = tmp_path / "toy.jsonl"
    items = JsonlQuestions(out).items()
    assert len(items) == 4 and all(q.source and q.corpus in ("bikes", "bread") and q.answer for q in items)
    result = run(compose_cfg(["corpus=jsonl", f"corpus.path={TOY}", "qa=jsonl", f"qa.path={out}",
                              f"paths.cache={tmp_path / 'cache'}", f"paths.model_cache={MODEL_CACHE}",
                              "eval.latency.sample=0", "eval.bootstrap.resamples=50"]), tmp_path / "run")
    assert result["counts"]["questions"] == 4 and result["metrics"]["hit_at_k_id"]["mean"] > 0


PARAGRAPHS = {  # keyword in the passage -> (the question the server writes, its answer)
    "backed": ("When is the office file server backed up?", "Every night at two in the morning."),
    "printer": ("Is it true that the printer on the second floor jams when the paper tray is overfilled?",
                "Yes, when it is overfilled."),
    "badge": ("What does the visitor badge open?", "Free lunch in the cafeteria every Friday."),
    "kettle": ("Sure! Here is a passage about the kitchen.", ""),
    "calendar": ("How do I reserve a meeting room?", "Add the room as a guest to the invitation in the calendar."),
    "front desk": ("How do I reserve a meeting room?", "Book it at the front desk one day before the meeting."),
    "recycling": ("What is the answer to this classic question?", "Forty-two."),
}
TEXTS = {
    "a1": "Backups. The office file server is backed up every night at two in the morning, and each copy is kept "
          "for thirty days before it is deleted.",
    "a2": "Printing. The printer on the second floor jams when the paper tray is overfilled beyond the marked line "
          "on its side, so load at most one ream.",
    "a3": "Visitors. A visitor badge opens the main entrance and the meeting rooms on the ground floor, and it must "
          "be returned at the reception when leaving.",
    "a4": "Kitchen. The kettle in the kitchen is descaled every Monday by the facilities team; please do not put "
          "milk bottles on top of it.",
    "b1": "Rooms. Meeting rooms are reserved in the calendar app by adding the room as a guest to the invitation of "
          "the meeting you organise.",
    "b2": "Booking. To reserve a meeting room without the app, book it at the front desk at least one day before the "
          "meeting takes place.",
    "b3": "Room 4 is closed.",
    "b4": "def area(radius):\n    return 3.14159 * radius ** 2\n\nfor r in range(10):\n    print(r, area(r))\n"
          "    assert area(r) >= 0, (r, area(r))\nprint(sum(area(r) for r in range(10)) / 10.0)\n",
    "b5": "Waste. Paper, glass and cans go into the recycling bins by the lifts, which are emptied every Thursday "
          "afternoon by the city.",
}


def office_chat(request, n):
    user = request["messages"][-1]["content"]
    step = 0 if user.rstrip().endswith("Question:") else 1
    text = user.rsplit("Passage: ", 1)[-1] if step == 0 else user.split("[1] ", 1)[1]
    key = next(k for k in PARAGRAPHS if k in text)
    return 200, {}, completion(PARAGRAPHS[key][step])


def test_each_filter_drops_the_question_it_is_for(tmp_path):
    corpus = write_jsonl(tmp_path / "office.jsonl", [{"id": i, "text": t, "group": "ab"[i[0] == "b"]}
                                                      for i, t in TEXTS.items()])
    with ScriptedEndpoint(chat=office_chat) as srv:
        summary = generate(["corpus=jsonl", f"corpus.path={corpus}", "llm=openai", f"llm.base_url={srv.base_url}",
                            "llm.model=m", f"paths.cache={tmp_path / 'cache'}", f"paths.model_cache={MODEL_CACHE}",
                            f"testset.out={tmp_path / 'office.jsonl.out'}", "testset.n=7", "testset.oversample=1",
                            "testset.kinds.two_passage=0"])
        asked = Counter("Question:" in r["json"]["messages"][-1]["content"][-12:] for r in srv.chat_requests)
    assert summary["passages"] | {"passages": 9} == {"documents": 9, "passages": 9, "short": 1, "not_prose": 1,
                                                      "askable": 7}
    assert asked == {True: 7, False: 4}, "7 askable passages; answers only for the 4 questions that passed"
    dropped = {r["filter"]: r["dropped"] for r in summary["questions"]}
    assert dropped == {"malformed": 1, "copied": 1, "off_topic": 1, "lexical": 0, "unsupported": 1,
                       "round_trip": 0, "duplicate": 1}
    rows = [json.loads(line) for line in (tmp_path / "office.jsonl.out").read_text().splitlines()]
    assert sorted(r["doc_id"] for r in rows)[0] == "a1" and len(rows) == 2
    assert {r["question"] for r in rows} == {"When is the office file server backed up?",
                                             "How do I reserve a meeting room?"}
    dup = next(r for r in rows if r["doc_id"] != "a1")
    assert dup["provenance"]["scores"]["duplicate_cosine"] < 0.9


def test_the_round_trip_keeps_the_questions_bm25_finds_in_their_document(tmp_path):
    docs = [json.loads(line) for line in TOY.read_text().splitlines()]
    questions = ["How often should I check the tyre pressure with a floor pump?", "What should I know about it?"]
    ranks = filters.round_trip_ranks(questions, ["bike-tyre-pressure", "bread-salt"], [d["text"] for d in docs],
                                     [d["id"] for d in docs], 3)
    assert ranks == [1, None]


MAN_PAGE = """SLEEP(3)                   Linux Programmer's Manual                  SLEEP(3)

NAME
       sleep - sleep for a specified number of seconds

DESCRIPTION
       sleep() causes the calling thread to sleep either until the number of real-time seconds specified in
       seconds have elapsed or until a signal arrives which is not ignored.

RETURN VALUE
       Zero if the requested time has elapsed, or the number of seconds left to sleep, if the call was
       interrupted by a signal handler.
"""


def test_templates_ask_man_pages_without_a_model_and_refuse_a_corpus_without_them(tmp_path):
    corpus = write_jsonl(tmp_path / "man.jsonl", [{"id": "man:sleep.3", "text": MAN_PAGE, "group": "libc"}])
    base = ["corpus=jsonl", f"corpus.path={corpus}", f"paths.cache={tmp_path / 'cache'}",
            f"paths.model_cache={MODEL_CACHE}", f"testset.out={tmp_path / 'man.jsonl.out'}",
            "testset.generator=templates", "testset.n=5", "testset.filters.min_prose_share=0.5"]
    summary = generate(base)
    rows = [json.loads(line) for line in (tmp_path / "man.jsonl.out").read_text().splitlines()]
    assert {r["question"] for r in rows} >= {"What does sleep() return?"} and "requests" not in summary
    answer = next(r["answer"] for r in rows if r["question"] == "What does sleep() return?")
    assert answer.startswith("Zero if the requested time has elapsed")
    assert all(r["provenance"]["kind"].startswith("template:") for r in rows)
    with pytest.raises(RagError, match="found nothing to ask about"):
        generate(["corpus=jsonl", f"corpus.path={TOY}", f"paths.cache={tmp_path / 'cache'}",
                  "testset.generator=templates", f"testset.out={tmp_path / 'x.jsonl'}"])


@pytest.mark.parametrize("override, message", [
    ("testset.generator=gpt", "testset.generator must be one of"),
    ("+testset.nn=3", r"testset.nn is not a setting \(did you mean n\?\)"),
    ("testset.filters.min_answer_support=2", "testset.filters.min_answer_support"),
    ("+testset.kinds.trivia=1", "testset.kinds.trivia is not a setting"),
])
def test_a_bad_setting_is_one_line_naming_it(override, message, capsys):
    assert main(["corpus=jsonl", f"corpus.path={TOY}", override]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and len(err.strip().splitlines()) == 1, err


def test_settings_normalize_the_kind_shares():
    node = {"n": 3, "seed": 0, "out": "q.jsonl", "generator": "llm", "dry_run": False, "oversample": 2.0,
            "kinds": {"factoid": 2, "how_why": 2, "two_passage": 0}, "passages": {"_target_": "x"}, "filters": {}}
    assert load_testset(node).kinds == (("factoid", 0.5), ("how_why", 0.5))
    assert load_testset(node).summary_path.name == "q.summary.json"
    assert load_testset({**node, "dry_run": True}).summary_path.name == "q.dry_run.json", \
        "a dry run leaves the summary of the file it would replace alone"


@pytest.mark.slow
def test_the_packaged_smollm2_writes_questions_for_the_toy_corpus(tmp_path):
    """A real in-process generation: what survives each filter is the model's; the counts add up
    and whatever is written reads as a question set."""
    out = tmp_path / "toy.jsonl"
    try:
        summary = generate(["corpus=jsonl", f"corpus.path={TOY}", f"paths.cache={tmp_path / 'cache'}",
                            f"paths.model_cache={MODEL_CACHE}", f"testset.out={out}", "testset.n=3",
                            "testset.oversample=2"])
    except RagError as e:  # a 135M model may write nothing that passes: the summary says which filter
        assert "no question passed the filters" in str(e)
        summary = json.loads(out.with_suffix(".summary.json").read_text())
        assert summary["questions"][-1]["left"] == 0
        return
    assert summary["requests"]["requests"] >= 6 and 1 <= summary["written"] <= 3
    assert len(JsonlQuestions(out).items()) == summary["written"]


# ---- the generator writes over nothing it did not write ------------------------------------------

def refused_at_start(srv: ScriptedEndpoint, args: list[str], capsys) -> str:
    """The one line `python -m rag.testset` stops with (exit 2), having sent nothing."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and srv.requests == [], (err, len(srv.requests))
    return err


def test_a_users_question_file_at_out_is_refused_before_anything_is_asked(tmp_path, capsys):
    mine = tmp_path / "toy.jsonl"
    mine.write_text('{"id": "q1", "question": "my own question", "answer": "mine"}\n')
    with ScriptedEndpoint(chat=toy_chat) as srv:
        err = refused_at_start(srv, overrides(srv, tmp_path), capsys)
    assert err == (f"ragrig testset: error: testset.out={mine} exists and was not written by python -m rag.testset "
                   "(no toy.summary.json beside it vouches for it); it is not replaced: move it, or choose another "
                   "testset.out")
    assert mine.read_text().startswith('{"id": "q1"') and not (tmp_path / "toy.summary.json").exists()


@pytest.mark.parametrize("which", ["corpus", "qa"])
def test_the_corpus_and_the_question_file_are_never_the_output(tmp_path, capsys, which):
    corpus = write_jsonl(tmp_path / "docs.jsonl", [json.loads(line) for line in TOY.read_text().splitlines()])
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "q1", "question": "Why?", "answer": "Because."}\n')
    before = {p: p.read_bytes() for p in (corpus, questions)}
    target = corpus if which == "corpus" else questions
    with ScriptedEndpoint(chat=toy_chat) as srv:
        args = [o for o in overrides(srv, tmp_path) if not o.startswith(("corpus.path=", "testset.out="))]
        err = refused_at_start(srv, [*args, f"corpus.path={corpus}", "qa=jsonl", f"qa.path={questions}",
                                     f"testset.out={target}"], capsys)
    assert f"testset.out={target} is {which}.path: the question set is never written over its own inputs" in err
    assert {p: p.read_bytes() for p in before} == before


def test_the_corpus_is_refused_even_as_a_file_the_generator_wrote(tmp_path, capsys):
    """A question file written by the generator, then used as the corpus: still never the output."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_bytes(TOY.read_bytes())
    (tmp_path / "docs.summary.json").write_text(json.dumps({
        "out": str(corpus), "passages": {}, "filters": {}, "out_sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}))
    with ScriptedEndpoint(chat=toy_chat) as srv:
        args = [o for o in overrides(srv, tmp_path) if not o.startswith(("corpus.path=", "testset.out="))]
        err = refused_at_start(srv, [*args, f"corpus.path={corpus}", f"testset.out={corpus}"], capsys)
    assert "is corpus.path" in err and corpus.read_bytes() == TOY.read_bytes()


def test_out_naming_a_folder_or_a_path_below_a_file_is_one_line_at_start_up(tmp_path, capsys):
    folder = tmp_path / "questions"
    folder.mkdir()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with ScriptedEndpoint(chat=toy_chat) as srv:
        err = refused_at_start(srv, [*overrides(srv, tmp_path), f"testset.out={folder}"], capsys)
        assert err.startswith(f"ragrig testset: error: testset.out={folder} is a folder, not a file")
        err = refused_at_start(srv, [*overrides(srv, tmp_path), f"testset.out={a_file / 'q.jsonl'}"], capsys)
        assert f"{a_file} is a file, not a folder" in err
    assert list(folder.iterdir()) == [] and a_file.read_text() == "mine"


def test_out_that_is_a_link_is_refused(tmp_path, capsys):
    mine = tmp_path / "elsewhere.jsonl"
    mine.write_text("my file\n")
    (tmp_path / "toy.jsonl").symlink_to(mine)
    with ScriptedEndpoint(chat=toy_chat) as srv:
        err = refused_at_start(srv, overrides(srv, tmp_path), capsys)
    assert f"testset.out={tmp_path / 'toy.jsonl'} is a link" in err and mine.read_text() == "my file\n"


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_summary_of_the_users_beside_out_is_refused(tmp_path, capsys, dry_run):
    """<out>.summary.json (a dry run: .dry_run.json) that is not the generator's summary of <out>."""
    name = "toy.dry_run.json" if dry_run else "toy.summary.json"
    (tmp_path / name).write_text('{"my": "results"}\n')
    with ScriptedEndpoint(chat=toy_chat) as srv:
        err = refused_at_start(srv, [*overrides(srv, tmp_path), f"testset.dry_run={str(dry_run).lower()}"], capsys)
    assert f"{tmp_path / name} exists and is not the summary python -m rag.testset wrote" in err
    assert (tmp_path / name).read_text() == '{"my": "results"}\n'


def test_a_question_file_edited_since_it_was_written_is_not_replaced(tmp_path, capsys):
    """The generator replaces its own file (the summary vouches for its sha256), and not once a
    question was fixed by hand; a run that writes no new file keeps vouching for the one it left."""
    out = tmp_path / "toy.jsonl"
    with ScriptedEndpoint(chat=toy_chat) as srv:
        generate(overrides(srv, tmp_path, "testset.n=4"))
        vouched = json.loads((tmp_path / "toy.summary.json").read_text())["out_sha256"]
        assert vouched == hashlib.sha256(out.read_bytes()).hexdigest()
        generate(overrides(srv, tmp_path, "testset.n=3"))  # its own file: replaced
        assert len(out.read_text().splitlines()) == 3
        generate(overrides(srv, tmp_path, "testset.n=3", "testset.dry_run=true"))
        assert main(overrides(srv, tmp_path, "testset.n=3")) == 0, "a dry run leaves the vouching alone"
        capsys.readouterr()
        edited = out.read_text().replace("What should I know", "What must I know", 1)
        out.write_text(edited)
        sent = len(srv.requests)
        assert main(overrides(srv, tmp_path, "testset.n=2")) == 2 and len(srv.requests) == sent
    assert f"testset.out={out} was changed since python -m rag.testset wrote it" in capsys.readouterr().err
    assert out.read_text() == edited


def test_an_input_folder_of_the_corpus_holds_no_output():
    from rag.testset.out import check_out

    node = {"n": 3, "seed": 0, "out": str(ROOT / "examples" / "toy" / "generated.jsonl"), "generator": "llm",
            "dry_run": False, "oversample": 2.0, "kinds": {"factoid": 1}, "passages": {"_target_": "x"}, "filters": {}}
    ts = load_testset(node)
    with pytest.raises(RagError, match=r"is inside the corpus folder corpus.docs_dir="):
        check_out(ts, {"_target_": "rag.corpus.Folder", "docs_dir": str(ROOT / "examples" / "toy")}, None)
    check_out(ts, {"_target_": "rag.corpus.Folder", "docs_dir": str(ROOT / "docs")}, None)  # elsewhere: fine


# ---- templates read the structure of any corpus's text -------------------------------------------

HEADED_DOC = """Caring for a bicycle
====================

1.2 Chain care

Clean the chain with a rag and degreaser before oiling it. Put one drop of chain oil on each roller
while turning the pedals backwards, then wipe off the excess so the chain does not collect grit.

## Brake pads

Replace disc brake pads when the friction material is thinner than half a millimetre. Worn pads
squeal, pull to one side and take longer to stop the bike on a wet descent.
"""
DOCSTRING = """kitchen.proof(dough, hours=12, cold=True)

Proofs a dough until it has doubled in size, slowly and in the fridge by default.

Args:
    hours (int): how long the dough rests before it is shaped and baked.
    cold (bool): whether the dough rests in the fridge rather than at room temperature.

Returns:
    The proofed dough, ready to be shaped into loaves.
"""


def test_templates_read_man_pages_docstrings_and_headed_docs_by_their_text(tmp_path):
    """A jsonl corpus whose ids say nothing of their structure: the text does."""
    corpus = write_jsonl(tmp_path / "docs.jsonl", [
        {"id": "sleep-page", "text": MAN_PAGE, "group": "reference"},
        {"id": "bike-care", "text": HEADED_DOC, "group": "guides"},
        {"id": "proof", "text": DOCSTRING, "group": "api"}])
    out = tmp_path / "questions.jsonl"
    summary = generate(["corpus=jsonl", f"corpus.path={corpus}", f"paths.cache={tmp_path / 'cache'}",
                        f"paths.model_cache={MODEL_CACHE}", f"testset.out={out}", "testset.generator=templates",
                        "testset.n=20", "testset.passages.chunk_size=200", "testset.filters.min_passage_chars=60",
                        "testset.filters.min_prose_share=0.5", "testset.filters.min_word_overlap=0"])
    rows = {r["question"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert "requests" not in summary and {r["doc_id"] for r in rows.values()} == {"sleep-page", "bike-care", "proof"}
    man = next(r for q, r in rows.items() if r["doc_id"] == "sleep-page" and "sleep()" in q)
    assert man["provenance"]["kind"] in ("template:description", "template:return_value")
    chain = next(r for q, r in rows.items() if "Chain care" in q)
    assert chain["provenance"]["kind"] == "template:section" and chain["answer"].startswith("Clean the chain")
    assert "Brake pads" not in chain["answer"], "an answer stops at the next heading"
    assert any("kitchen.proof" in q for q in rows), "a docstring is asked about by its object's name"


def test_a_corpus_with_none_of_them_is_one_line_naming_what_was_looked_for(tmp_path, capsys):
    assert main(["corpus=jsonl", f"corpus.path={TOY}", f"paths.cache={tmp_path / 'cache'}",
                 "testset.generator=templates", f"testset.out={tmp_path / 'x.jsonl'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "found nothing to ask about in the 20 documents: no man page" in err
    assert "no docstring" in err and "no headed documentation (# headings" in err
    assert "use testset.generator=llm" in err and not (tmp_path / "x.jsonl").exists()

