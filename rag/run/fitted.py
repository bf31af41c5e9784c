"""What a run's fitted parts were fitted on, and whether the run's corpus is among it.

Three parts of the versions come fitted or tuned to corpora other than the one a run searches: the
cross-encoder of v3 and v4 (`reranker.model="trained:"`) learnt from `reranker.train.corpus` (by
default the demo's PubMedQA, libc and PyTorch), the router of v2-v4 splits the corpus by the groups
`retriever.source_filter.groups` names (chosen for the demo's pubmed | libc, pytorch), and v4's
per-group chunker (`chunker.routes`) was tuned for the demo's groups. What they gain on the demo is
evidence about the demo's corpora only.

Each part's record (`reranker_part`, `router_part`, `chunker_part`; rag.run.pipeline.fitted_section
makes them for a run) compares it with the run's corpus. The reranker by content: each corpus it
learnt from is recorded by name, document count and the fingerprint of its documents' content (the
same on every machine, where the corpus artifact's key, made of paths and mtimes, is not), and the
run's corpus is among them when each of its documents is one of theirs (the demo's mixed corpus,
any one of its parts, or a sample of them). The router is fit on the run's own chunk vectors: what came
from elsewhere is its groups, so it counts as fitted elsewhere when they name a tag this corpus
lacks. The chunker's routes are keyed by tag: a document whose tag has no route gets its default
chunker.

metrics.json's `fitted` (written only when some part was fitted elsewhere, so the demo's results
read as they always have) holds each fitted part with what it was fitted on and `this_corpus`, and
`check`: the one ablation sweep that measures those parts on this corpus. `fitted_lines` says it in
words for the run's table; experiments.fitted says it for the reports and the verdict.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rag.corpus.slicing import content_fingerprint
from rag.types import Document

FINGERPRINT_CHARS = 20  # as an artifact key's
MEMBER_CHARS = 12
PARTS = ("reranker", "router", "chunker")
# What each part is called in a sentence, after its version ("v3's reranker").
PART_NAMES = {"reranker": "reranker", "router": "router", "chunker": "per-group chunking"}
# The sweep axis that runs each part and the run without it, in the order the command lists them.
AXES = {"reranker": "reranker=cross_encoder,none", "router": "retriever.source_filter.mode=router,none",
        "chunker": "chunker=per_source,sliding_window"}
# Overrides the ablation sweep sets itself (or that would sweep something else): left out of the run's own.
_REPLACED = ("reranker", "retriever.source_filter.mode", "chunker", "sweep")
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"  # the run's own overrides (rag.run.rundir.write_hydra_record)
NO_EVIDENCE = {1: "its gain on the demo is no evidence here", 2: "their gains on the demo are no evidence here"}
CHECK = "Check on this corpus: {command}"


def corpus_record(name: str, docs: Iterable[Document]) -> dict[str, Any]:
    """One corpus a part was fitted on: its name, its documents' count and content fingerprint,
    and `members`, the short hash of each of its documents (what `among` looks a run's up in)."""
    docs = list(docs)
    return {"name": name, "fingerprint": content_fingerprint(docs)[:FINGERPRINT_CHARS], "documents": len(docs),
            "members": sorted({document_hash(d) for d in docs})}


def document_hash(doc: Document) -> str:
    """A document's identity by content (id, source, text), short: 48 bits keep a chance match of
    a foreign corpus's documents with the few thousand of a fitted one far below one in a million."""
    return content_fingerprint([doc])[:MEMBER_CHARS]


def among(fitted_on: Sequence[Mapping[str, Any]], docs: Iterable[Document]) -> bool:
    """Whether every document of `docs` (a run's whole corpus) is one the part was fitted on: the
    demo's mixed corpus, any of its parts, or a sample of them. A corpus of its own stops at its
    first document, so a large one costs no full read."""
    known = {h for rec in fitted_on for h in rec.get("members") or ()}
    seen = False
    for d in docs:
        if document_hash(d) not in known:
            return False
        seen = True
    return seen


def described(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records as metrics.json shows them: name, fingerprint and count, not every member."""
    return [{k: v for k, v in r.items() if k != "members"} for r in records]


# -- the parts --------------------------------------------------------------------------------------


def reranker_part(fitted_on: Sequence[Mapping[str, Any]], docs: Sequence[Document]) -> dict[str, Any]:
    return {"on": described(fitted_on), "this_corpus": among(fitted_on, docs)}


def router_part(groups: Any, tags: Iterable[str], vectors_key: str | None) -> dict[str, Any]:
    """The router: fit on this run's chunk vectors (`vectors_key`), by groups chosen elsewhere."""
    named = [str(t) for g in groups or [] for t in g]
    absent = sorted(set(named) - set(tags))
    return {"on": [{"name": t} for t in dict.fromkeys(named)], "groups": [[str(t) for t in g] for g in groups or []],
            "fit": {"name": "this run's chunk vectors", "fingerprint": vectors_key},
            "absent": absent, "this_corpus": not absent}


def chunker_part(routes: Iterable[str], tags: Iterable[str]) -> dict[str, Any]:
    routed = [str(t) for t in routes]
    unrouted = sorted(set(tags) - set(routed))
    return {"on": [{"name": t} for t in routed], "unrouted": unrouted, "this_corpus": not unrouted}


def section(corpus: str, documents: int, parts: Mapping[str, dict[str, Any]], command: str) -> dict[str, Any] | None:
    """metrics.json `fitted`: every fitted part, when some part was fitted elsewhere (else None)."""
    if all(p["this_corpus"] for p in parts.values()):
        return None
    return {"corpus": {"name": corpus, "documents": documents}, "parts": dict(parts), "check": command}


# -- the one command that measures them on this corpus ----------------------------------------------


def run_overrides(output_dir: str | Path) -> list[str] | None:
    """The overrides the run was started with (None: a run started without run.py's record)."""
    try:
        found = yaml.safe_load((Path(output_dir) / OVERRIDES_FILE).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return [str(o) for o in found] if isinstance(found, list) else None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def ablation_command(variant: str, flagged: Sequence[str], overrides: Sequence[str] | None,
                     config: Mapping[str, Any]) -> str:
    """`python run.py -m` with the run's own overrides and, for each part fitted elsewhere, the
    axis that runs it and the run without it. Without the run's record of its overrides (a run
    started from Python), the version and a JSONL corpus and question file are read off the config."""
    if overrides is None:
        overrides = _config_overrides(variant, config)
    own = [o for o in overrides if _key(o) not in _REPLACED and not _key(o).startswith("hydra.")]
    axes = [AXES[p] for p in PARTS if p in flagged]
    return " ".join(["python run.py -m", *(shlex.quote(o) for o in own), *axes])


def _config_overrides(variant: str, config: Mapping[str, Any]) -> list[str]:
    out = [f"+version={variant}"] if variant in ("v1", "v2", "v3", "v4") else []
    corpus, qa = config.get("corpus") or {}, config.get("qa") or {}
    if corpus.get("_target_") == "rag.corpus.JsonlCorpus":
        out += ["corpus=jsonl", f"corpus.path={corpus.get('path')}"]
    if qa.get("_target_") == "rag.qa.jsonl.JsonlQuestions":
        out += ["qa=jsonl", f"qa.path={qa.get('path')}"]
    return out


# -- in words ---------------------------------------------------------------------------------------


def _and(items: Sequence[str], last: str = "and") -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {last} " + items[-1]


def part_words(part: str, entry: Mapping[str, Any], who: str) -> str:
    """One fitted-elsewhere part in words, `who` naming it ("v3's reranker")."""
    if part == "reranker":
        return f"{who} learnt from {_and([str(r.get('name')) for r in entry.get('on') or []])}, not from this corpus"
    if part == "router":
        groups = " | ".join(", ".join(g) for g in entry.get("groups") or [])
        return f"{who} splits by groups chosen for other corpora ({groups}): this corpus has no " \
               f"{_and(entry.get('absent') or [], 'or')} documents"
    routes = [str(r.get("name")) for r in entry.get("on") or []]
    return f"{who} was tuned for {_and(routes)}: this corpus's {_and(entry.get('unrouted') or [])} " \
           "documents get its default chunker"


def who(part: str, variants: Sequence[str]) -> str:
    """"v3's reranker", "the reranker of v3 and v4", "the reranker" (a run of no version)."""
    named = [v for v in dict.fromkeys(variants) if v in ("v1", "v2", "v3", "v4")]
    if not named:
        return f"the {PART_NAMES[part]}"
    if len(named) == 1:
        return f"{named[0]}'s {PART_NAMES[part]}"
    return f"the {PART_NAMES[part]} of {_and(named)}"


def flagged_parts(fitted: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The parts of metrics.json `fitted` that were fitted elsewhere, in PARTS order."""
    parts = (fitted or {}).get("parts") or {}
    return {p: parts[p] for p in PARTS if isinstance(parts.get(p), Mapping) and not parts[p].get("this_corpus", True)}


def sentence(clauses: Sequence[str], command: str | None = None) -> str:
    """The clauses of the parts fitted elsewhere, and what follows from them, as one sentence;
    with `command`, the sweep that checks them in brackets at its end."""
    text = "; ".join(clauses)
    if text.startswith("the "):  # "v3's reranker" keeps its lower-case v
        text = "T" + text[1:]
    check = f" (check on this corpus: `{command}`)" if command else ""
    return text + f"; {NO_EVIDENCE[min(len(clauses), 2)]}{check}."


def fitted_lines(fitted: Mapping[str, Any] | None, variant: str) -> list[str]:
    """A run's fitted-elsewhere parts in words, and the command that checks them on this corpus;
    none when every part was fitted on this corpus (or there is none)."""
    parts = flagged_parts(fitted)
    if not parts:
        return []
    lines = [sentence([part_words(p, e, who(p, [variant])) for p, e in parts.items()])]
    command = (fitted or {}).get("check")
    return lines + ([CHECK.format(command=command)] if command else [])
