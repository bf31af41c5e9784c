"""Fitted parts say what they were fitted on (rag/run/fitted.py, experiments/fitted.py): the
cross-encoder by the content of the corpora it learnt from, the router and the per-group chunker by
the group tags they were chosen for. A run on another corpus says so in its table, metrics.json,
report.html, summary.md and the verdict's first sentence, with the one sweep that checks it; a run
on the demo's corpora says nothing."""
from __future__ import annotations

import copy
import itertools
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from experiments.aggregate import RunRecord
from experiments.fitted import of_runs
from rag.store.cache import ArtifactCache
from rag.config.compose import PROJECT_ROOT
from rag.corpus.loading import load_corpus
from rag.run.fitted import among, chunker_part, corpus_record, fitted_lines, reranker_part, router_part, section
from rag.reranker.training.artifact import TrainingInputs
from rag.run.result import RunResult
from rag.types import Document
from tests.conftest import MODEL_CACHE, write_jsonl

TOY = PROJECT_ROOT / "examples" / "toy"
DEMO_GROUPS = [["pubmed"], ["libc", "pytorch"]]
DEMO_TAGS = {"pubmed", "libc", "pytorch"}
SENTENCE = ("v3's reranker learnt from PubMedQA, libc and PyTorch, not from this corpus; v3's router splits by "
            "groups chosen for other corpora (pubmed | libc, pytorch): this corpus has no libc, pubmed or pytorch "
            "documents; their gains on the demo are no evidence here")
AXES = "reranker=cross_encoder,none retriever.source_filter.mode=router,none"


def docs(prefix: str, n: int, source: str = "notes") -> list[Document]:
    return [Document(f"{prefix}-{i}", f"{prefix} note {i}: the backup runs at {i} o'clock.", source) for i in range(n)]


def test_a_corpus_is_among_what_a_part_learnt_from_when_every_document_is_one_of_theirs():
    a, b = docs("a", 5), docs("b", 3)
    learnt = [corpus_record("A", a), corpus_record("B", b)]
    assert learnt[0]["documents"] == 5 and len(learnt[0]["fingerprint"]) == 20
    assert learnt[0]["fingerprint"] != corpus_record("A", a[:4])["fingerprint"]
    assert among(learnt, a + b) and among(learnt, b) and among(learnt, a[1:3]), "both, one, or a sample of one"
    assert not among(learnt, a + docs("c", 1)), "one document of its own is enough to be another corpus"
    edited = [Document(a[0].id, a[0].text + " Changed.", a[0].source)]
    assert not among(learnt, edited) and not among(learnt, [])
    part = reranker_part(learnt, docs("c", 2))
    assert part == {"on": [{k: r[k] for k in ("name", "fingerprint", "documents")} for r in learnt],
                    "this_corpus": False}, "metrics.json names them; it does not list every document"


def test_the_cross_encoder_records_each_training_corpus_by_name_and_content(tmp_path):
    first = write_jsonl(tmp_path / "first.jsonl", [{"id": d.id, "text": d.text} for d in docs("a", 4)])
    second = write_jsonl(tmp_path / "second.jsonl", [{"id": d.id, "text": d.text} for d in docs("b", 2)])
    corpus = {"_target_": "rag.corpus.MixedCorpus", "parts": [
        {"_target_": "rag.corpus.JsonlCorpus", "path": str(first)},
        {"_target_": "rag.corpus.JsonlCorpus", "path": str(second)}]}
    inputs = TrainingInputs({"corpus": corpus, "queries": {"labelled": 0, "templates": 10}},
                            ArtifactCache(tmp_path / "cache"))
    record = inputs.fitted_on()
    assert [(r["name"], r["documents"]) for r in record] == [("first.jsonl", 4), ("second.jsonl", 2)]
    loaded, _ = load_corpus(instantiate(corpus, _convert_="all"), ArtifactCache(tmp_path / "other-cache"))
    assert among(record, loaded), "the same files read through another cache are the same corpus"


def test_the_router_and_the_chunker_are_fitted_elsewhere_when_their_tags_are_not_this_corpus():
    assert router_part(DEMO_GROUPS, DEMO_TAGS, "k")["this_corpus"]
    toy = router_part(DEMO_GROUPS, {"bikes", "bread"}, "k")
    assert not toy["this_corpus"] and toy["absent"] == ["libc", "pubmed", "pytorch"]
    assert toy["fit"] == {"name": "this run's chunk vectors", "fingerprint": "k"}, "fit on the run's own vectors"
    assert chunker_part({"libc": 0, "pytorch": 0, "pubmed": 0}, DEMO_TAGS)["this_corpus"]
    assert chunker_part({"libc": 0, "pytorch": 0, "pubmed": 0}, {"libc"})["this_corpus"], "one of the tuned groups"
    unrouted = chunker_part({"libc": 0, "pytorch": 0, "pubmed": 0}, {"bikes", "libc"})
    assert not unrouted["this_corpus"] and unrouted["unrouted"] == ["bikes"]
    v4 = section("docs.jsonl", 20, {"chunker": unrouted}, "python run.py -m +version=v4 chunker=per_source,sliding_window")
    assert fitted_lines(v4, "v4") == [
        "v4's per-group chunking was tuned for libc, pytorch and pubmed: this corpus's bikes documents get its "
        "default chunker; its gain on the demo is no evidence here.",
        "Check on this corpus: python run.py -m +version=v4 chunker=per_source,sliding_window"]


def test_the_demo_corpora_are_what_the_shipped_recipe_learnt_from_and_get_no_note(compose_cfg):
    """The default recipe's training corpus is the demo's (cached once in the tests' model cache)."""
    cfg = compose_cfg(["+version=v3"])
    cache = ArtifactCache(MODEL_CACHE)
    learnt = TrainingInputs(instantiate(cfg.reranker.train, _convert_="all"), cache).fitted_on()
    assert [r["name"] for r in learnt] == ["PubMedQA", "libc", "PyTorch"]
    for corpus in ("mixed", "libc", "pytorch", "pubmedqa"):
        documents, _ = load_corpus(instantiate(compose_cfg([f"corpus={corpus}"]).corpus, _convert_="all"), cache)
        assert among(learnt, documents), corpus
    parts = {"reranker": reranker_part(learnt, documents), "router": router_part(DEMO_GROUPS, DEMO_TAGS, "k"),
             "chunker": chunker_part({"libc": 0, "pytorch": 0, "pubmed": 0}, DEMO_TAGS)}
    assert section("PubMedQA", len(documents), parts, "unused") is None
    assert fitted_lines(None, "v3") == []


@pytest.mark.heavy
def test_a_toy_run_of_v3_says_everywhere_that_its_parts_were_fitted_elsewhere(tmp_path, compose_cfg):
    run_dir, cmp_dir = tmp_path / "run", tmp_path / "compare"
    own = ["debug=tiny", f"corpus.path={TOY / 'docs.jsonl'}", f"qa.path={TOY / 'questions.jsonl'}", "+version=v3",
           "llm=none", f"paths.cache={tmp_path / 'cache'}", f"paths.model_cache={MODEL_CACHE}",
           "eval.latency.sample=1", "eval.latency.repeats=1"]
    done = subprocess.run([sys.executable, "run.py", *own, f"hydra.run.dir={run_dir}"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    command = f"python run.py -m {' '.join(own)} {AXES}"
    assert f"{SENTENCE}.\nCheck on this corpus: {command}\n" in done.stdout, "the run's table"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    fitted = metrics["fitted"]
    assert fitted["corpus"] == {"name": "docs.jsonl", "documents": 20} and fitted["check"] == command
    assert [r["name"] for r in fitted["parts"]["reranker"]["on"]] == ["PubMedQA", "libc", "PyTorch"]
    assert not fitted["parts"]["reranker"]["this_corpus"] and not fitted["parts"]["router"]["this_corpus"]
    verdict = f"{SENTENCE} (check on this corpus: `{command}`)."
    page = (run_dir / "report.html").read_text()
    assert f'<p class="meta fitted">{SENTENCE.replace(chr(39), "&#39;")}.</p>' in page
    assert f'id="verdict-text">{verdict.replace(chr(39), "&#39;")} ' in page, "the verdict opens with it"
    compared = subprocess.run([sys.executable, "-m", "experiments.compare", str(run_dir), "--out", str(cmp_dir),
                               "--no-charts"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert compared.returncode == 0, compared.stderr[-3000:]
    summary = (cmp_dir / "summary.md").read_text()
    assert f"## Verdict\n\n{verdict} " in summary
    assert f"## Fitted on other corpora\n\n{SENTENCE}.\n\nCheck on this corpus: `{command}`\n" in summary
    # the command is a sweep of v3 with and without each part, on the same data and settings
    words = shlex.split(command)[3:]
    axes = [w.split("=", 1) for w in words if "," in w]
    for values in itertools.product(*[v.split(",") for _, v in axes]):
        cfg = compose_cfg([w for w in words if "," not in w] + [f"{k}={v}" for (k, _), v in zip(axes, values)])
        assert cfg.variant == "v3" and cfg.corpus.path == str(TOY / "docs.jsonl")
        assert cfg.reranker._target_.endswith("NoReranker" if values[0] == "none" else "CrossEncoderReranker")
        assert cfg.retriever.source_filter.mode == values[1]


def test_a_sweep_names_each_part_once_with_the_versions_it_holds_for():
    full = json.loads((Path(__file__).parent / "fixtures" / "metrics" / "full.json").read_text())
    reranker = full["fitted"]["parts"]["reranker"]
    router = router_part(DEMO_GROUPS, {"bikes"}, "k")
    runs = []
    for variant, parts, check in (("v1", None, None), ("v2", {"router": router}, "python run.py -m +version=v2 X"),
                                  ("v3", {"reranker": reranker, "router": router}, "python run.py -m +version=v3 X Y"),
                                  ("v4", {"reranker": reranker, "router": router}, "python run.py -m +version=v4 X Y")):
        doc = copy.deepcopy(full)
        doc["variant"] = variant
        doc["fitted"] = None if parts is None else {"corpus": {"name": "x", "documents": 1}, "parts": parts,
                                                    "check": check}
        runs.append(RunRecord(Path(variant), "ok", RunResult.from_json(doc)))
    said = of_runs(runs)
    assert said.clauses == ("the reranker of v3 and v4 learnt from PubMedQA, libc and PyTorch, not from this corpus",
                            "the router of v2, v3 and v4 splits by groups chosen for other corpora (pubmed | libc, "
                            "pytorch): this corpus has no libc, pubmed or pytorch documents")
    assert said.command == "python run.py -m +version=v3 X Y", "the first run with the most parts fitted elsewhere"
    assert said.words().startswith("The reranker of v3 and v4 learnt from")
    assert said.words().endswith("their gains on the demo are no evidence here (check on this corpus: "
                                 "`python run.py -m +version=v3 X Y`).")
    assert not of_runs(runs[:1]) and of_runs(runs[:1]).words() == "" and of_runs(runs[:1]).view() is None
