"""What a run keeps of its corpus and questions (rag/corpus/slicing.py, conf/slice/): your own
files are used whole unless you ask for a sample, the shipped corpus keeps the sample the demo and
the seed are built on, and every sample a run takes is said in one line, "kept N of M questions
(slice.questions_per_corpus=50; null keeps all)", in run.log, metrics.json (`slice`) and report.html,
and in the terminal when the user set it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag.config.compose import PROJECT_ROOT
from rag.corpus.slicing import Kept
from rag.run.pipeline import run
from tests.conftest import MODEL_CACHE, TINY_DOCS, write_jsonl

GROUPS = ("libc", "pytorch", "pubmed")


def own_files(root: Path, n_questions: int, fillers: int = 0) -> dict[str, Path]:
    """A corpus of your own (the tiny documents, plus `fillers` documents no question names) and
    `n_questions` questions, spread evenly over the three groups, in the new field names."""
    docs = [{"id": i, "text": t, "group": g} for i, g, t in TINY_DOCS]
    docs += [{"id": f"note-{j}", "text": f"Note {j}: the office plants are watered on day {j} of the month.",
              "group": "notes"} for j in range(fillers)]
    named = {g: [(i, t) for i, gg, t in TINY_DOCS if gg == g] for g in GROUPS}
    questions = []
    for n in range(n_questions):
        group = GROUPS[n % 3]
        doc_id, text = named[group][n // 3 % len(named[group])]
        questions.append({"id": f"q{n}", "question": f"Question {n}: what does {doc_id} say?",
                          "answer": text.split(". ")[-1], "doc_id": doc_id, "group": group})
    return {"corpus": write_jsonl(root / "docs.jsonl", docs), "qa": write_jsonl(root / "questions.jsonl", questions)}


def own_overrides(files: dict[str, Path], cache: Path) -> list[str]:
    """Your own files as the README's own-data command gives them: no debug=tiny, whose slice is null."""
    return ["corpus=jsonl", f"corpus.path={files['corpus']}", "qa=jsonl", f"qa.path={files['qa']}",
            f"paths.cache={cache}", f"paths.model_cache={MODEL_CACHE}", "embedder.show_progress=false",
            "eval.bootstrap.resamples=50", "eval.latency.sample=2", "eval.latency.repeats=1",
            "chunker.chunk_size=120", "chunker.chunk_overlap=20"]


def test_the_line_a_sample_is_said_in():
    k = Kept("questions", 50, 60, "slice.questions_per_corpus", 50)
    assert k.line() == "kept 50 of 60 questions (slice.questions_per_corpus=50; null keeps all)"
    assert k.sampled and not Kept("documents", 9, 9, "slice.docs_per_source", None).sampled
    assert k.to_json() == {"kept": 50, "of": 60, "setting": "slice.questions_per_corpus", "value": 50}
    answered = Kept("answered questions", 6, 30, "slice.answer_questions_per_corpus", 2)
    assert Kept.from_json("answered_questions", answered.to_json()) == answered


@pytest.mark.parametrize("overrides, docs, questions", [
    (["corpus=jsonl", "corpus.path=d.jsonl", "qa=jsonl", "qa.path=q.jsonl"], None, None),
    (["corpus=beir", "corpus.path=/data/scifact"], None, None),  # qa=beir comes with it
    (["corpus=medline", "qa=jsonl", "qa.path=q.jsonl"], None, None),
    # your questions over the shipped corpus: all of them, among a sample of its documents
    (["qa=jsonl", "qa.path=q.jsonl"], 120, None),
    # a sample of your own, asked for
    (["corpus=jsonl", "corpus.path=d.jsonl", "qa=jsonl", "qa.path=q.jsonl", "slice.questions_per_corpus=20"], None, 20),
    (["corpus=jsonl", "corpus.path=d.jsonl", "qa=jsonl", "qa.path=q.jsonl", "slice.docs_per_source=5"], 5, None),
    # the shipped corpus and questions: the sample make demo and the seed are built on
    ([], 120, 50),
    (["sweep=demo"], 120, 50),
    (["slice=all"], None, None),
])
def test_your_own_files_are_used_whole_unless_you_ask_for_a_sample(compose_cfg, overrides, docs, questions):
    cut = compose_cfg(overrides).slice
    assert (cut.docs_per_source, cut.questions_per_corpus, cut.seed) == (docs, questions, 0)


def test_sixty_questions_of_your_own_are_all_scored(compose_cfg, tmp_path):
    files = own_files(tmp_path, 60)
    result = run(compose_cfg(own_overrides(files, tmp_path / "cache")), tmp_path / "out")
    assert result["counts"]["questions"] == 60
    assert result["metrics"]["mrr"]["n"] == 60
    assert result["slice"]["questions"] == {"kept": 60, "of": 60, "setting": "slice.questions_per_corpus", "value": None}
    assert result["slice"]["documents"]["kept"] == result["slice"]["documents"]["of"] == len(TINY_DOCS)


@pytest.mark.heavy
def test_a_sample_you_ask_for_is_said_in_the_terminal_run_log_metrics_and_report(tmp_path):
    files = own_files(tmp_path, 60, fillers=20)
    out = tmp_path / "out"
    samples = ["slice.questions_per_corpus=10", "slice.docs_per_source=5", "llm=extractive",
               "slice.answer_questions_per_corpus=2"]
    done = subprocess.run([sys.executable, "run.py", f"hydra.run.dir={out}",
                           *own_overrides(files, tmp_path / "cache"), *samples],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = json.loads((out / "metrics.json").read_text())["slice"]
    lines = [Kept.from_json(key, entry).line() for key, entry in recorded.items()]
    assert lines[0] == "kept 30 of 60 questions (slice.questions_per_corpus=10; null keeps all)"
    assert lines[1].startswith("kept ") and lines[1].endswith(" of 29 documents (slice.docs_per_source=5; null keeps all)")
    assert lines[2] == "kept 6 of 30 answered questions (slice.answer_questions_per_corpus=2; null keeps all)"
    log = (out / "run.log").read_text()
    report = (out / "report.html").read_text()
    for line in lines:
        assert line in done.stdout, f"terminal: {line}"
        assert line in log, f"run.log: {line}"
        assert line in report, f"report.html: {line}"



def test_a_sample_the_configuration_takes_goes_to_run_log_not_the_terminal(tmp_path):
    """make demo's slice and answered sample are its configuration's, documented in the README:
    no warning to a newcomer. Here a preset of the user's config directory takes the sample, as
    sweep=demo does; the line is in run.log, metrics.json and the report, not on the terminal."""
    files = own_files(tmp_path, 60, fillers=20)
    presets = tmp_path / "conf" / "sample"
    presets.mkdir(parents=True)
    (presets / "ten.yaml").write_text("# @package _global_\nslice:\n  questions_per_corpus: 10\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "run.py", "--config-dir", str(tmp_path / "conf"), f"hydra.run.dir={out}",
                           *own_overrides(files, tmp_path / "cache"), "+sample=ten"],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = "kept 30 of 60 questions (slice.questions_per_corpus=10; null keeps all)"
    assert line not in done.stdout + done.stderr
    assert line in (out / "run.log").read_text()
    assert json.loads((out / "metrics.json").read_text())["slice"]["questions"]["kept"] == 30
