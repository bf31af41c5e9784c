"""The cross-encoder's training data (rag/reranker/training/): question templates, labelled questions
from a train split, mined pseudo-queries, negatives, metrics and settings."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rag.corpus import libc, pytorch
from rag.reranker.training import structure as ST
from rag.reranker.training import templates as TPL
from rag.reranker.training.dataset import build_dataset, round_robin
from rag.reranker.training.evaluate import group_metrics, roc_auc
from rag.reranker.training.examples import Example, Group
from rag.reranker.training.generated import clean_question, sample_passages
from rag.reranker.training.labelled import labelled_examples, question_set
from rag.reranker.training.mining import mined_examples, unique_headings
from rag.reranker.training.passages import PassagePool, with_label
from rag.reranker.training.settings import DEFAULT_TRAIN, key_settings, train_settings
from rag.reranker.training.text import MAX_PASSAGE_CHARS, clean_markup, norm, split_passages
from rag.types import Document, QAItem, RagError
from tests.conftest import TINY_QA

_WORDS = re.compile(r"[a-z]+")


def _indent(text: str, n: int = 7) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def man(name: str, desc: str, body: str, sub: tuple[str, str] | None = None, errors: str = "",
        ret: str = "") -> Document:
    text = f"NAME\n       {name} - {desc}\n\nLIBRARY\n       Standard C library (libc, -lc)\n\nDESCRIPTION\n{_indent(body)}\n"
    if sub:
        text += f"\n   {sub[0]}\n" + _indent(sub[1]) + "\n"
    if ret:
        text += f"\nRETURN VALUE\n{_indent(ret)}\n"
    if errors:
        text += f"\nERRORS\n{errors}\n"
    text += f"\nSEE ALSO\n       {name}(2)"
    return Document(libc.page_id(name, "2"), text, "libc", {"page": name, "section": "2", "title": f"{name} - {desc}"})


def torchdoc(qualname: str, summary: str, body: str) -> Document:
    return Document(pytorch.docstring_id(qualname), f"{qualname}(input)\n\n{summary} {body}", "pytorch", {"object": qualname})


def abstract(pmid: int, objective: str, methods: str, conclusion: str) -> Document:
    text = f"Background sentence about the topic area. {objective}\n\n{methods}\n\n{conclusion}"
    return Document(f"pmid:{pmid}", text, "pubmed", {"pmid": str(pmid)})


FILLER = "The call returns zero on success and minus one on error, setting errno to indicate the error. "


def mini_corpus() -> list[Document]:
    return [
        man("pipe", "create pipe", "pipe() creates a unidirectional data channel that can be used for interprocess "
            "communication between related processes.\n" + FILLER,
            ("Pipe capacity limits", "A pipe has a limited capacity in the kernel buffer and writes block when "
             "the pipe is full, unless the descriptor is nonblocking. " + FILLER),
            errors="       EFAULT pipefd is not valid.\n\n       EMFILE The per-process limit on the number of open "
                   "file descriptors has been reached.",
            ret="On success, zero is returned. On error, -1 is returned, errno is set to indicate the error, and "
                "pipefd is left unchanged."),
        man("mmap", "map files or devices into memory", "mmap() creates a new mapping in the virtual address space "
            "of the calling process, backed by a file or anonymous memory.\n\nMAP_SHARED\n       "
            "Share this mapping with other processes that map the same region.\n" + FILLER),
        man("malloc", "allocate and free dynamic memory", "malloc() allocates size bytes and returns a pointer to "
            "the allocated heap memory, which is not initialized.\n" + FILLER),
        man("fcntl", "manipulate file descriptor", "fcntl() performs one of the operations on the open file "
            "descriptor, such as duplicating it or setting record locks.\n" + FILLER),
        man("socket", "create an endpoint for communication", "socket() creates an endpoint for network "
            "communication and returns a file descriptor that refers to that endpoint.\n" + FILLER),
        torchdoc("torch.nn.Module.register_forward_hook", "Registers a forward hook on the module.",
                 "The hook will be called every time after forward has computed an output, and it may replace "
                 "the output by returning a new value. It returns a handle that removes the hook."),
        torchdoc("torch.optim.AdamW", "Implements the AdamW optimization algorithm.",
                 "Weight decay is decoupled from the gradient update and applied directly to the parameters, "
                 "which differs from L2 regularization in adaptive optimizers such as Adam.\n\n"
                 "Args:\n    lr (float): the learning rate of the optimizer.\n    weight_decay (float): the "
                 "decoupled weight decay coefficient."),
        torchdoc("torch.nn.functional.relu", "Applies the rectified linear unit function element-wise.",
                 "Negative inputs become zero while positive inputs pass through unchanged, giving a sparse "
                 "activation pattern that is cheap to compute on any device."),
        torchdoc("torch.linalg.svd", "Computes the singular value decomposition of a matrix.",
                 "The decomposition factors the input into orthogonal matrices and a diagonal of singular values "
                 "sorted in descending order, for batches of matrices as well."),
        torchdoc("torch.utils.data.DataLoader", "Combines a dataset and a sampler into an iterable.",
                 "It supports automatic batching, multi-process data loading with worker processes, memory "
                 "pinning and custom collate functions for map-style and iterable datasets."),
        abstract(1, "The aim of this study was to assess ciclesonide nasal spray in seasonal allergic rhinitis.",
                 "Patients were randomized to ciclesonide or placebo for two weeks and rated nasal symptoms daily "
                 "in diaries reviewed by physicians at every visit.",
                 "Ciclesonide reduced physician-assessed nasal signs and symptoms more than placebo did, with a "
                 "similar rate of adverse events in both groups of patients."),
        abstract(2, "We investigated mitochondrial dynamics during programmed cell death in lace plant leaves.",
                 "Leaves at several developmental stages were imaged with live-cell microscopy and treated with "
                 "cyclosporine A to inhibit the permeability transition pore.",
                 "Mitochondrial changes preceded cell death and cyclosporine A reduced the number of perforations "
                 "formed in the leaves, implicating the transition pore."),
        abstract(3, "The objective was to determine whether statin therapy improves cardiovascular outcomes.",
                 "A cohort of adults with raised cholesterol was followed for five years and major cardiac events "
                 "were adjudicated by a blinded committee of cardiologists.",
                 "Patients receiving statins had fewer major cardiovascular events than those receiving placebo "
                 "over five years of follow up, without excess harm."),
        abstract(4, "To evaluate closed reduction for nasal bone fractures and patient satisfaction.",
                 "Adults with isolated nasal fractures underwent closed reduction within two weeks and completed "
                 "a satisfaction questionnaire three months after treatment.",
                 "Closed reduction was sufficient for mild nasal fractures and early intervention raised the rate "
                 "of satisfied patients at follow up."),
    ]


QUESTIONS = [
    QAItem("pubmedqa:1", "Does ciclesonide help seasonal allergic rhinitis?", "Ciclesonide reduced physician-assessed "
           "nasal signs and symptoms more than placebo did.", "pmid:1", "pubmed"),
    QAItem("pubmedqa:3", "Do statins improve cardiovascular outcomes?", "Patients receiving statins had fewer major "
           "cardiovascular events.", "pmid:3", "pubmed"),
    QAItem("pubmedqa:9", "Is a missing document a problem?", "No.", "pmid:9", "pubmed"),
]


def settings(**kw) -> dict:
    base = {"queries": {"labelled": 10, "templates": 40, "mined": 20, "generated": 0}, "val_fraction": 0.2,
            "val_queries": 10, "chunk_size": 200, "chunk_overlap": 30}
    return train_settings({**base, **kw})


def words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


# ---- corpus-owned id schemes ------------------------------------------------------------------


def test_corpora_own_their_id_schemes():
    assert libc.page_id("fcntl", "2") == "man:fcntl.2" and libc.page_of("man:printf.h.3head") == ("printf.h", "3head")
    assert libc.page_of("torch:x") is None
    assert pytorch.is_docstring_id(pytorch.docstring_id("torch.cos")) and not pytorch.is_doc_page_id("torch:torch.cos")
    assert pytorch.is_doc_page_id(pytorch.doc_page_id("notes/cuda.rst"))
    page = man("pipe", "create pipe", "pipe() creates a pipe.", ("Pipe capacity", "Limited."))
    secs = dict(libc.sections(page.text))
    assert set(secs) == {"NAME", "LIBRARY", "DESCRIPTION", "SEE ALSO"}
    assert libc.subsections(secs["DESCRIPTION"])[0][0] == "Pipe capacity"
    assert "pipe() creates a pipe." in libc.body_text(page.text) and "Standard C library" not in libc.body_text(page.text)
    header, doc, paras = pytorch.docstring_parts("torch.cos(input)\n\nReturns the cosine.\n\nArgs: x")
    assert header == "torch.cos(input)" and paras == ["Returns the cosine.", "Args: x"]
    assert pytorch.page_sections("Title\n=====\n\nIntro.\n\n## Usage\nUse it.") == [("Title", "Intro."), ("Usage", "Use it.")]


# ---- question templates -----------------------------------------------------------------------


def test_templates_ask_about_the_object_and_point_at_the_answering_passage():
    docs = mini_corpus()
    pool = PassagePool(docs, 200, 30, label=False)
    pipe = [e for e in TPL.template_examples(docs[0], pool)]
    by_kind = {e.kind: e for e in pipe}
    assert by_kind["template:return_value"].query in [t.format(f="pipe()") for t in TPL.MAN_SECTION_QUESTIONS["RETURN VALUE"]]
    assert "zero is returned" in by_kind["template:return_value"].positive
    errno = [e for e in pipe if e.kind == "template:errno"]
    assert sorted(next(w for w in ("EFAULT", "EMFILE") if w in e.query) for e in errno) == ["EFAULT", "EMFILE"]
    assert all("pipe()" in e.query for e in errno)
    emfile = next(e for e in errno if "EMFILE" in e.query)
    assert "per-process limit" in emfile.positive
    flag = next(e for e in TPL.template_examples(docs[1], pool) if e.kind == "template:flag")
    assert "MAP_SHARED" in flag.query and "mmap()" in flag.query and "Share this mapping" in flag.positive
    adamw = {e.kind: e for e in TPL.template_examples(docs[6], pool)}
    assert "torch.optim.AdamW" in adamw["template:summary"].query
    assert adamw["template:howto"].query.endswith("implement the AdamW optimization algorithm in PyTorch?") or \
        adamw["template:howto"].query == "How can I implement the AdamW optimization algorithm?"
    args = [e for e in TPL.template_examples(docs[6], pool) if e.kind == "template:argument"]
    assert {a.query.split(" argument")[0].split()[-1] for a in args if " argument" in a.query} <= {"lr", "weight_decay"}
    assert all(e.doc_id == d.id for d in docs for e in TPL.template_examples(d, pool))
    assert TPL.template_examples(docs[-1], pool) == []  # abstracts have no template questions


def test_template_helpers():
    assert TPL.howto("Computes the sum of all elements.") == "compute the sum of all elements"
    assert TPL.howto("Applies a linear transformation.") == "apply a linear transformation"
    assert TPL.howto("Returns x.") is None  # too short to be a task
    assert TPL.torch_object("torch:torch.nn.Linear") == "nn.Linear"
    assert TPL.torch_object("torch:torch.nn.functional.relu") == "torch.nn.functional.relu"


def test_structure_is_recognised_by_the_text_of_a_document_of_any_corpus():
    page = man("sleep", "sleep for a number of seconds", "sleep() makes the calling thread sleep.",
               ret="Zero if the time has elapsed.")
    as_user = Document("notes/sleep.txt", page.text, "reference")
    assert ST.man_page(as_user.text) == "sleep()"
    kinds = {k: q for k, q, _ in TPL.structural_questions(as_user)}
    assert "sleep()" in kinds["return_value"] and "sleep()" in kinds["description"]
    assert ST.man_page("NAME\n       x - y\n") is None, "a NAME alone is no man page"
    numpy_style = "mylib.mean(a, axis=None)\n\nAverage of the elements.\n\nParameters\n----------\na : array_like\n" \
                  "    The values.\naxis : int\n    The axis to average over.\n"
    found = ST.docstring(numpy_style, "doc-7")
    assert found is not None and found.name == "mylib.mean" and numpy_style[found.offset:].startswith("Average")
    args = [q for k, q, _ in TPL.structural_questions(Document("doc-7", numpy_style, "api")) if k == "argument"]
    assert len(args) == 2 and "axis" in args[1], "each argument once, in order"
    assert ST.docstring("Average of the elements.\n\n>>> mean([1, 2])\n1.5", "mylib.stats.mean").name == "mylib.stats.mean"
    assert ST.docstring("Average of the elements.\n\n>>> mean([1, 2])", "note 7") is None, "no object to name"
    guide = ("Setup\n=====\n\nInstall the package first.\n\n```sh\n# not a heading\npip install x\n```\n\n"
             "2.1 Running it\n\nStart the server with one command.\n\n1. Open a terminal\n2. Type the command\n\n"
             "## Empty\n## Stopping\nPress Ctrl-C to stop it.\n")
    sections = ST.headed_sections(guide)
    assert [h for h, _, _ in sections] == ["Setup", "2.1 Running it", "Stopping"]
    assert [guide[at:].split("\n")[0] for _, at, _ in sections] == [
        "Install the package first.", "Start the server with one command.", "Press Ctrl-C to stop it."]
    questions = [q for k, q, _ in TPL.structural_questions(Document("guide", guide, "docs"))]
    assert len(questions) == 3 and "Running it" in questions[1] and "2.1" not in questions[1]
    assert TPL.structural_questions(Document("pmid:1", "Background. Statins lower risk.\n2 Methods were used.", "x")) == []


def test_a_templates_budget_over_documents_without_structure_says_so_in_one_line(caplog):
    prose = [Document(f"note-{i}", f"Backups of server {i} run nightly at two. Restores take an hour.", "ops")
             for i in range(6)]
    with pytest.raises(RagError, match="no training queries"):
        build_dataset(prose, settings(queries={"labelled": 0, "templates": 40, "mined": 0, "generated": 0}))
    (line,) = [r.getMessage() for r in caplog.records if "templates" in r.getMessage()]
    assert "reranker.train.queries.templates=40: the 6 training documents have no man page" in line
    assert "no headed documentation" in line


def test_labelled_passages_carry_the_document_label():
    docs = mini_corpus()
    pool = PassagePool(docs, 200, 30, label=True)
    e = TPL.template_examples(docs[0], pool)[0]
    assert e.positive.startswith("man page pipe(2)\n")
    assert with_label("torch:torch.cos", "x") == "PyTorch torch.cos\nx"


# ---- labelled questions -----------------------------------------------------------------------


def test_labelled_examples_use_the_passage_that_holds_the_answer():
    docs = mini_corpus()
    pool = PassagePool(docs, 200, 30, label=False)
    ex = labelled_examples(QUESTIONS, pool)
    assert [e.doc_id for e in ex] == ["pmid:1", "pmid:3"]  # pmid:9 is not a training document
    assert "physician-assessed" in ex[0].positive and ex[0].query == QUESTIONS[0].question


def test_labelled_questions_must_be_a_train_part(tmp_path: Path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": f"q{i}?", "answer": "a"}) + "\n" for i in range(20)))
    spec = {"_target_": "rag.qa.jsonl.JsonlQuestions", "path": str(path)}
    for part in ("all", "test"):
        with pytest.raises(RagError, match="train"):
            question_set({**spec, "split": {"part": part}})
    qs = question_set({**spec, "split": {"part": "train", "fraction": 0.5}})
    assert all(not qs.split.in_test(q.id) for q in qs.load())


# ---- mined pseudo-queries (the first recipe) --------------------------------------------------


def test_mined_queries_come_from_their_own_document_and_are_cut_out_of_the_positive():
    docs = mini_corpus()
    pool = PassagePool(docs, 450, 64, label=False)
    kinds = {"man_name", "man_subsection", "docstring", "abstract", "sentence"}
    headings = unique_headings(docs)
    ex = [e for d in docs for e in mined_examples(d, pool, 450, kinds, headings)]
    assert {e.kind for e in ex} >= {"mined:man_name", "mined:docstring", "mined:abstract", "mined:man_subsection"}
    by_id = {d.id: d for d in docs}
    for e in ex:
        own = " ".join(by_id[e.doc_id].text.split())
        assert clean_markup(e.query) in own or e.query in own
        assert norm(e.query) not in norm(e.positive)
        inner = " ".join(e.positive.split()[1:-1])  # sliding windows may cut the first and last word
        assert len(e.positive) <= MAX_PASSAGE_CHARS and words(inner) <= words(by_id[e.doc_id].text)
    name = next(e for e in ex if e.doc_id == "man:fcntl.2" and e.kind == "mined:man_name")
    assert name.query == "manipulate file descriptor" and "performs one of the operations" in name.positive


def test_split_passages_sizes():
    text = "\n\n".join(("Sentence number %d is here. " % i) * 12 for i in range(6))
    parts = split_passages(text, 450)
    assert all(150 <= len(p) <= MAX_PASSAGE_CHARS for p in parts)


# ---- the dataset: families, validation split, negatives ---------------------------------------


def test_dataset_negatives_come_from_other_documents_and_never_from_validation_docs():
    docs = mini_corpus()
    data = build_dataset(docs, settings(), QUESTIONS)
    assert data.train and data.val
    assert {g.kind.split(":")[0] for g in data.train} >= {"labelled", "template", "mined"}
    train_docs, val_docs = {g.doc_id for g in data.train}, {g.doc_id for g in data.val}
    assert not train_docs & val_docs
    for g in data.train + data.val:
        assert g.pairs()[0] == (g.query, g.positive, 1.0) and all(lab == 0.0 for _, _, lab in g.pairs()[1:])
        assert 1 <= len(g.negatives) <= 3 and g.positive not in g.negatives
        for n in g.negatives:  # never a passage of the query's own document (passages are verbatim)
            origin = {d.id for d in docs if n in d.text}
            assert origin and g.doc_id not in origin
    for g in data.train:
        for n in g.negatives:
            assert not {d.id for d in docs if n in d.text} <= val_docs


def test_dataset_is_deterministic_and_uses_no_evaluation_question():
    docs = mini_corpus()
    a = build_dataset(docs, settings(seed=3), QUESTIONS)
    b = build_dataset(list(docs), settings(seed=3), list(QUESTIONS))
    assert a.train == b.train and a.val == b.val
    evaluation = {norm(q[1]) for q in TINY_QA}
    for f in (Path(__file__).resolve().parent.parent / "data" / "qa").glob("*.jsonl"):
        evaluation |= {norm(json.loads(line)["question"]) for line in f.read_text().splitlines() if line.strip()}
    assert not {norm(g.query) for g in a.train + a.val} & evaluation


def test_documents_sharing_a_query_are_never_each_others_negatives():
    base = "Pads the input tensor boundaries with zero."
    body = "For N-dimensional padding use the functional pad. Args: padding (int, tuple): the size of the padding "
    docs = [torchdoc(f"torch.nn.ZeroPad{i}d", base, body * 2 + f"in {i} dimensions only.") for i in (1, 2, 3)]
    data = build_dataset(docs + mini_corpus(), settings(queries={"mined": 400}, val_fraction=0.01, chunk_size=450))
    pads = [g for g in data.train if g.query == base]
    assert pads
    for g in pads:
        assert not any("dimensions only" in n for n in g.negatives)


def test_round_robin_takes_every_bucket_in_turn():
    ex = [Example(f"d{i}", s, k, f"q{i}", "p") for i, (s, k) in enumerate([("a", "x")] * 5 + [("b", "y")] * 2)]
    import random

    out = round_robin(ex, 4, random.Random(0))
    assert sorted(e.source for e in out) == ["a", "a", "b", "b"]


# ---- generated questions: the parts that need no model ----------------------------------------


def test_generated_questions_are_cleaned_and_passages_sampled_per_source():
    assert clean_question("Question: What does pipe() return?\nmore") == "What does pipe() return?"
    assert clean_question("The answer to the question is:") is None
    assert clean_question("How do I get a copy of a tensor that does not track gradients?") is None  # a few-shot copy
    pool = PassagePool(mini_corpus(), 200, 30, label=False)
    rows = sample_passages(pool, 6, seed=0)
    assert len(rows) == 6 and len({pool.passages[r].source for r in rows}) == 3
    assert rows == sample_passages(pool, 6, seed=0)


# ---- metrics and settings ---------------------------------------------------------------------


def test_metrics():
    g = Group("q", "d", "s", "k", "pos", ("n1", "n2", "n3"))
    m = group_metrics([g, g], np.array([2.0, 1.0, 3.0, 0.0, 5.0, -1.0, -2.0, -3.0]))
    assert m["mrr"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["auc"] == pytest.approx(11 / 12, abs=1e-4)  # positive 2 beats 5 of the 6 negatives, 5 beats all
    assert m["pairwise_accuracy"] == pytest.approx((2 / 3 + 1) / 2, abs=1e-4)
    assert roc_auc(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 1.0


def test_settings_are_checked_and_speed_settings_stay_out_of_the_key():
    with pytest.raises(RagError, match="unknown setting"):
        train_settings({"pairz": 3})
    with pytest.raises(RagError, match="queries"):
        train_settings({"queries": {"templates": 0, "mined": 0}})
    with pytest.raises(RagError, match="unknown famil"):
        train_settings({"queries": {"invented": 3}})
    with pytest.raises(RagError, match="device"):
        train_settings({"device": "tpu"})
    s = train_settings({})
    assert s["queries"] == DEFAULT_TRAIN["queries"]
    assert key_settings(train_settings({"threads": 1, "device": "cuda"})) == key_settings(s)
    assert key_settings(train_settings({"lr": 1e-4})) != key_settings(s)
