"""The functions and records behind `import ragrig` (the package docstring shows them in use)."""
from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from omegaconf import DictConfig

from rag.config import PROJECT_ROOT, config_error_line, is_config_error, register_resolvers
from rag.result import RunResult
from rag.types import RagError

if TYPE_CHECKING:
    from rag.session import Session as PipelineSession

PathLike = str | Path


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The configuration `python run.py OVERRIDES` runs (composed, not yet checked). A bad
    override raises RagError with the command line's one line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    try:
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    except Exception as e:
        if not is_config_error(e):
            raise
        raise RagError(config_error_line(e)) from None


# -- one run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """A finished run's directory, read back: its metrics.json (`result`, typed) and, on demand,
    its per-question records."""

    path: Path
    result: RunResult

    @property
    def variant(self) -> str:
        return self.result.variant

    @property
    def metrics(self) -> dict[str, float | None]:
        """Each metric's mean over the questions it applies to (None where nothing was measured)."""
        return {name: agg.get("mean") for name, agg in self.result.metrics.items()}

    @property
    def config(self) -> dict[str, Any]:
        """The resolved configuration the run used (metrics.json's `config`)."""
        return self.result.config

    def per_question(self) -> pd.DataFrame:
        """One row per question: the per_question.jsonl records (docs/datamodel.md)."""
        return pd.read_json(self.path / "per_question.jsonl", lines=True, dtype=False)


def load_run(path: PathLike) -> Run:
    """The run whose results are in `path` (a directory holding metrics.json). RagError when it
    holds none, or one that is not a run's result."""
    path = Path(path)
    metrics = path / "metrics.json"
    if not metrics.is_file():
        raise RagError(f"{path}: no metrics.json (not a finished run's directory)")
    try:
        return Run(path=path, result=RunResult.read(metrics))
    except ValueError as e:
        raise RagError(f"{metrics}: {e}") from None


def run(overrides: Sequence[str] = (), output_dir: PathLike | None = None) -> Run:
    """Runs one configuration end to end, as `python run.py OVERRIDES` does, and returns the
    finished run. Results go to `output_dir` (default: a new directory under outputs/runs/), which
    is claimed as the command line claims its run directory."""
    from rag import rundir
    from rag.pipeline import run as run_pipeline
    from rag.settings import load

    settings = load(compose(overrides))
    if settings.dry_run:
        raise RagError("dry_run=true counts requests and returns no run; use `python run.py dry_run=true ...`")
    out = Path(output_dir) if output_dir is not None else _new_run_dir(settings.variant)
    rundir.claim(out)
    try:
        run_pipeline(settings, out)
    finally:
        rundir.release(out)
    return load_run(out)


def _new_run_dir(variant: str) -> Path:
    # The command line's pattern (conf/config.yaml hydra.run.dir) with an id per call, not per
    # process: a notebook runs many configurations in one process and second.
    stamp = time.strftime("%Y-%m-%d/%H-%M-%S")
    return PROJECT_ROOT / "outputs" / "runs" / f"{stamp}-{variant}-{secrets.token_hex(3)}"


# -- asking questions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    label: str  # where the passage comes from (document id or its label)
    score: float | None  # the retriever's (or reranker's) score of its first chunk
    text: str


@dataclass(frozen=True)
class Answer:
    question: str
    answer: str | None  # None with llm=none (retrieval only)
    contexts: list[Context]
    latency_ms: dict[str, float]  # retrieve, rerank, generate


class Session:
    """A configured pipeline loaded once (from the artifact cache, building what is missing), asked
    many questions. Made by `open_session`."""

    def __init__(self, session: PipelineSession) -> None:
        self._session: PipelineSession | None = session

    @property
    def _pipeline(self) -> PipelineSession:
        if self._session is None:
            raise RagError("this session is closed: ask within the `with ragrig.open_session(...)` block")
        return self._session

    @property
    def variant(self) -> str:
        return self._pipeline.settings.variant

    @property
    def chunks(self) -> int:
        return len(self._pipeline.chunk_set)

    def ask(self, question: str, corpus: str | None = None) -> Answer:
        """One question through retrieve, rerank, contexts and generate. `corpus`: the group tag
        whose documents the retriever's source filter keeps (v2's filtering); None: all."""
        from rag.ask import answer

        if not question.strip():
            raise RagError("the question is empty")
        if corpus is not None:
            self._check_corpus(corpus)
        out = answer(self._pipeline, question, corpus)
        return Answer(question=out["question"], answer=out["answer"],
                      contexts=[Context(**c) for c in out["contexts"]], latency_ms=dict(out["latency_ms"]))

    def _check_corpus(self, corpus: str) -> None:
        # A typo would silently retrieve nothing.
        known = sorted({d.source for d in self._pipeline.docs})
        if corpus not in known:
            raise RagError(f"corpus {corpus!r} names no documents of this session; its groups: {', '.join(known)}")

    def close(self) -> None:
        self._session = None


@contextmanager
def open_session(overrides: Sequence[str] = ()) -> Iterator[Session]:
    """A Session for the configuration `overrides` names (as for `run`)."""
    from rag.session import open_session as open_pipeline
    from rag.settings import load

    session = open_pipeline(load(compose(overrides)), scored=False)
    session.generator.warm_up()
    wrapper = Session(session)
    try:
        yield wrapper
    finally:
        wrapper.close()


# -- comparing runs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """What `python -m experiments.compare` prints and writes, as values."""

    table: pd.DataFrame  # one row per run: labels, parameters, metrics with CIs (summary.csv)
    differences: pd.DataFrame  # each run against the baseline, per metric (comparison.csv)
    verdict: str  # the verdict in words, as summary.md opens
    baseline: str | None
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    terminal: str = ""  # everything the command line prints after the run count

    def __str__(self) -> str:
        return self.terminal


def compare(runs: Sequence[PathLike | Run], baseline: str | None = None, out_dir: PathLike | None = None,
            charts: bool = True, html: bool = True) -> Comparison:
    """Compares finished runs (run directories, sweep directories or parents of runs, or Run
    objects) as `python -m experiments.compare` does, writing its files into `out_dir` (default: a
    new directory under outputs/compare/; an existing one must be empty)."""
    from experiments.compare import default_out, runs_in
    from experiments.report import ReportSettings
    from experiments.report_files import build_report

    paths = [r.path if isinstance(r, Run) else Path(r) for r in runs]
    if not paths:
        raise RagError("compare: give at least one run")
    try:
        records = runs_in(paths)  # as the command line: a path with no run is named, never dropped
    except FileNotFoundError as e:
        raise RagError(str(e)) from None
    if out_dir is None:
        out = default_out()
    else:
        out = Path(out_dir)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise RagError(f"{out}: exists and is not an empty directory; give a new out_dir")
        out.mkdir(parents=True, exist_ok=True)
    rep = build_report(records, out, ReportSettings(baseline=baseline, charts=charts, html=html),
                       source="Runs: " + ", ".join(f"`{p}`" for p in paths))
    return Comparison(table=rep.frame, differences=rep.comparison, verdict=rep.verdict, baseline=rep.baseline,
                      out_dir=out, files=list(rep.files), terminal=rep.terminal())
