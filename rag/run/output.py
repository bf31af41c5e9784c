"""Writing a run's results: metrics.json, per_question.jsonl, the resolved config, TREC files and
report.html, whole or not at all; and the plain-text table a run prints."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from eval.trec import format_qrels, format_run
from experiments import metric_info as MI
from rag.store import strict_json
from rag.store.atomic import atomic_write_text
from rag.run.fitted import fitted_lines
from rag.llm.base import Stopped
from rag.run.plan import format_plan
from rag.run.provenance import provenance_lines
from rag.retriever.routing import routing_lines
from rag.serving.secrets import redacted_data
from rag.run.settings import RunReport
from rag.types import QAItem, RagError, Relevance

log = logging.getLogger(__name__)


def write_results(
    output_dir: Path, result: dict[str, Any], records: list[dict[str, Any]], extra: dict[str, str] | None = None
) -> None:
    """Results are written whole or not at all: each file to a temporary name and renamed,
    metrics.json last (its presence marks a finished run), and if anything fails or is interrupted
    (Ctrl-C) on the way, the files already written by this call are removed again. `extra`: more
    files (name -> text), written first."""
    output_dir.mkdir(parents=True, exist_ok=True)
    result = redacted_data(result)  # the config as resolved, but no value from ${oc.env:...} and no key
    files = {
        **(extra or {}),
        "per_question.jsonl": "".join(strict_json.dumps(r, ensure_ascii=False) + "\n" for r in records),
        "config_resolved.yaml": OmegaConf.to_yaml(OmegaConf.create(result["config"])),
        "metrics.json": strict_json.dumps(result, indent=2, default=str),
    }
    written: list[Path] = []
    try:
        for name, text in files.items():
            atomic_write_text(output_dir / name, text)
            written.append(output_dir / name)
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        raise


def trec_files(tag: str, records: list[dict[str, Any]], qa: list[QAItem],
               labels: Sequence[Sequence[Relevance]] | None = None) -> dict[str, str]:
    """run.trec and qrels.trec (eval.trec), or none when an id cannot be written in that format.
    `labels`: the questions' labels in place of their own (eval.relevance=llm's)."""
    try:
        return {"run.trec": format_run(records, tag), "qrels.trec": format_qrels(qa, labels)}
    except RagError as e:
        log.warning("no TREC run file: %s", e)
        return {}


def write_report(report: RunReport, output_dir: Path) -> None:
    """report.html next to metrics.json: after the results, so a report problem (logged by
    write_run_report, never raised) cannot cost them. `report.html=false` turns it off."""
    if not report.html:
        return
    try:
        from experiments.html_report import write_run_report
    except Exception as e:  # noqa: BLE001 - e.g. jinja2 missing: the results stand without the page
        log.warning("report.html skipped (%s: %s)", type(e).__name__, e)
        return
    limit = report.max_context_chars
    path = write_run_report(output_dir, **({"max_context_chars": int(limit)} if limit else {}))
    if path is not None:
        log.info("report: %s", path)


def judged_note(o: dict[str, Any]) -> str:
    """Beside a judge metric: how many questions went unmeasured, and the repeats' agreement."""
    if "unmeasured" not in o:
        return ""
    note = f"  unmeasured {o['unmeasured']}/{o['n'] + o['unmeasured']} questions, {o['judgements_unmeasured']}/{o['judgements']} judgements"
    if o.get("agreement") is not None:
        note += f"; agreement {o['agreement']:.2f} (n={o['agreement_n']})"
    return note


def format_table(result: dict[str, Any]) -> str:
    """A short plain-text table of the run's metrics (overall and per question corpus)."""
    if "dry_run" in result:
        return format_plan(result["dry_run"])
    metrics = list(result["metrics"])
    corpora = list(result["by_corpus"])
    k = ((result.get("config") or {}).get("eval") or {}).get("k", "k")
    names = {m: MI.label(m, k) for m in metrics}
    w = max([18, *(len(n) + 2 for n in names.values())])
    header = f"{'metric':<{w}}{'all':>22}" + "".join(f"{c:>12}" for c in corpora)
    lines = [f"variant {result['variant']}: {result['counts']['questions']} questions, "
             f"{result['counts']['documents']} documents, {result['counts']['chunks']} chunks", header]
    for m in metrics:
        o = result["metrics"][m]
        cell = "unmeasured" if o["mean"] is None else f"{o['mean']:.3f} [{o['ci95'][0]:.3f},{o['ci95'][1]:.3f}]"
        per = "".join(
            f"{result['by_corpus'][c][m]['mean']:>12.3f}" if result["by_corpus"][c].get(m, {}).get("mean") is not None
            else f"{'-':>12}" for c in corpora
        )
        lines.append(f"{names[m]:<{w}}{cell:>22}{per}" + judged_note(o))
    c = result.get("compression")
    if c:
        lines.append(f"compression ({c['compressor']}): {c['chars_removed_share']:.0%} of the answered questions' context "
                     f"characters removed (about {c['tokens_removed_estimate']} tokens); {c['fallback_questions']} of "
                     f"{c['questions']} questions kept their whole contexts (nothing passed)")
    lines += routing_lines(result.get("routing"))
    lines += fitted_lines(result.get("fitted"), str(result.get("variant")))
    lines += provenance_lines(result.get("provenance"))
    if (result.get("stopped_answers") or {}).get("stopped"):
        lines.append(Stopped.from_json(result["stopped_answers"]).line())
    t = result["timings_s"]
    lines.append("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()))
    return "\n".join(lines)
