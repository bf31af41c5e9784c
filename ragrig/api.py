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

from rag.config.compose import PROJECT_ROOT, config_error_line, is_config_error, register_resolvers
from rag.run.result import RunResult
from rag.types import RagError

if TYPE_CHECKING:
    from rag.run.session import Session as PipelineSession

PathLike = str | Path


def _sequence(value: Any, what: str, example: str) -> list[Any]:
    """`value` as a list, where a list is expected. A string is a sequence too, and iterating it
    would read `"+version=v1"` as eleven one-letter overrides: TypeError saying what to pass."""
    if isinstance(value, (str, bytes, Path, Run)) or not isinstance(value, Sequence):
        raise TypeError(f"{what} must be a list, e.g. {example}; got {type(value).__name__} {value!r:.80}")
    return list(value)


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The configuration `python run.py OVERRIDES` runs, composed but not yet checked.

    Args:
        overrides: Overrides as on the command line, e.g. `["+version=v3", "eval.k=10"]`.

    Returns:
        The composed configuration (an OmegaConf `DictConfig`; `OmegaConf.to_yaml(cfg)` prints it).

    Raises:
        RagError: A bad override or config-group option, with the command line's one line.
        TypeError: `overrides` is a string rather than a list.

    Example:
        >>> import ragrig
        >>> ragrig.compose(["+version=v2"]).retriever.source_filter.mode
        'router'
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = _sequence(overrides, "overrides", "['+version=v1']")
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
    its per-question records.

    Attributes:
        path: The run directory (metrics.json, per_question.jsonl, report.html, run.log, ...).
        result: Its metrics.json, typed (`rag.run.result.RunResult`).
    """

    path: Path
    result: RunResult

    @property
    def variant(self) -> str:
        """The run's `variant` ("v1".."v4", or "custom")."""
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
        """The run's per-question records (per_question.jsonl, docs/reference/datamodel.md), read strictly.

        Returns:
            One row per question: `id`, `question`, each metric by key (`mrr_id`, `ndcg_at_k`,
            ...), `retrieved`, `answer`, `latency_ms`, ...

        Raises:
            RagError: The run wrote no per_question.jsonl, or a line of it does not read.
        """
        from eval.record import read_lines

        path = self.path / "per_question.jsonl"
        if not path.is_file():
            raise RagError(f"{path}: no such file (the run wrote no per-question records)")
        try:
            return pd.DataFrame(read_lines(path))
        except RagError as e:
            raise RagError(f"{self.path}: {e}") from None


def load_run(path: PathLike) -> Run:
    """Reads a finished run back from its directory.

    Args:
        path: A run directory, holding metrics.json (`outputs/runs/<date>/<time>-<variant>-<id>`).

    Returns:
        The run.

    Raises:
        RagError: `path` holds no metrics.json, or one that is not a run's result.
    """
    path = Path(path)
    metrics = path / "metrics.json"
    if not metrics.is_file():
        raise RagError(f"{path}: no metrics.json (not a finished run's directory)")
    try:
        return Run(path=path, result=RunResult.read(metrics))
    except ValueError as e:
        raise RagError(f"{metrics}: {e}") from None


def run(overrides: Sequence[str] = (), output_dir: PathLike | None = None) -> Run:
    """Runs one configuration end to end, as `python run.py OVERRIDES` does.

    Args:
        overrides: Overrides as on the command line, e.g. `["+version=v1", "corpus=jsonl",
            "corpus.path=examples/toy/docs.jsonl", "qa=jsonl", "qa.path=examples/toy/questions.jsonl"]`;
            relative paths are read from the current directory.
        output_dir: Where the results go; default: a new directory under `outputs/runs/`. It is
            claimed as the command line claims its run directory: one that another live run
            holds, or that holds files of another run, is refused.

    Returns:
        The finished run, read back from `output_dir`.

    Raises:
        RagError: A bad override, setting or input file, with the command line's one line;
            `dry_run=true`, which makes no run.

    Example:
        From the repository's root:

            v1 = ragrig.run(["+version=v1", "corpus=jsonl", "corpus.path=examples/toy/docs.jsonl",
                             "qa=jsonl", "qa.path=examples/toy/questions.jsonl"])
            v1.metrics["mrr_id"]
    """
    from rag.run import rundir
    from rag.run.pipeline import run as run_pipeline
    from rag.run.settings import load

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
    """One passage the generator read for an answer.

    Attributes:
        label: Where the passage comes from: its document id, or the document's label with
            `context.labels=true` ("man fcntl(2)", "PMID 17304887").
        score: The retriever's (or reranker's) score of its first chunk; None where none.
        text: The passage as the prompt numbers it (a chunk, possibly with its neighbours).
    """

    label: str  # where the passage comes from (document id or its label)
    score: float | None  # the retriever's (or reranker's) score of its first chunk
    text: str


@dataclass(frozen=True)
class Answer:
    """What `Session.ask` returns.

    Attributes:
        question: The question as asked.
        answer: The generator's answer; None with `llm=none` (retrieval only).
        contexts: The passages it read, best first.
        latency_ms: Milliseconds per stage: `retrieve`, `rerank`, `generate`.
    """

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
        """The configuration's `variant` ("v1".."v4", or "custom")."""
        return self._pipeline.settings.variant

    @property
    def chunks(self) -> int:
        """How many chunks the pipeline searches."""
        return len(self._pipeline.chunk_set)

    def ask(self, question: str, corpus: str | None = None) -> Answer:
        """One question through retrieve, rerank, contexts and generate.

        Args:
            question: The question text.
            corpus: The group tag whose documents the retriever's source filter keeps (v2's
                filtering; `retriever.source_filter.mode=question`); None: as configured.

        Returns:
            The answer, the passages it was given and each stage's latency.

        Raises:
            RagError: An empty question, a group tag that names no document of the session, or
                a session already closed.
        """
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
        """Ends the session (`open_session`'s block does it): later `ask`s raise RagError."""
        self._session = None


@contextmanager
def open_session(overrides: Sequence[str] = ()) -> Iterator[Session]:
    """Loads a configured pipeline once to ask it many questions, as `python -m rag.ask` does.

    The corpus is read, chunked, embedded and indexed through the artifact cache (built where
    missing, loaded where a run built it before) and the generator is loaded; the session closes
    when the `with` block ends. No question set is needed (`qa=none` is fine).

    Args:
        overrides: Overrides as on the command line (as for `run`).

    Yields:
        The session.

    Raises:
        RagError: A bad override, setting or input file, with the command line's one line.

    Example:
        From the repository's root:

            with ragrig.open_session(["+version=v1", "llm=extractive", "corpus=jsonl",
                                      "corpus.path=examples/toy/docs.jsonl"]) as session:
                print(session.ask("How much salt goes into bread dough?").answer)
    """
    from rag.run.session import open_session as open_pipeline
    from rag.run.settings import load

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
    """What `python -m experiments.compare` prints and writes, as values.

    Attributes:
        table: One row per run: its label, parameters, and each metric's mean with its CI
            (summary.csv).
        differences: Each run against the baseline, per metric: the paired difference, its CI,
            p-values, `significant`, `min_effect`, `matters`, `marker` (comparison.csv).
        verdict: The verdict in words, as summary.md opens.
        baseline: The baseline run's label.
        out_dir: Where the files were written.
        files: summary.csv, comparison.csv, summary.md, report.html and the charts.
        terminal: Everything the command line prints after the run count (also `str(comparison)`).
    """

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
    """Compares finished runs as `python -m experiments.compare` does.

    Args:
        runs: Run directories, sweep directories or folders above them, or `Run` objects.
        baseline: The run to compare against: a label, variant or job number; None: v1 when
            present, else the first run (as `report.baseline`).
        out_dir: Where the files go; default: a new directory under `outputs/compare/`. An
            existing one must be empty.
        charts: Draw the charts (`charts/`).
        html: Write report.html.

    Returns:
        The comparison: tables, differences and the verdict.

    Raises:
        RagError: No run given, a path that holds no run, or an `out_dir` that is not empty.
        TypeError: `runs` is a single path rather than a list.

    Example:
        Two runs of `ragrig.run`:

            cmp = ragrig.compare([v1, v2], charts=False)
            print(cmp.verdict)
    """
    from experiments.compare import default_out, runs_in
    from experiments.report import ReportSettings
    from experiments.report_files import build_report

    runs = _sequence(runs, "runs", "['outputs/a', 'outputs/b'] (run directories, sweep directories or Run objects)")
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
