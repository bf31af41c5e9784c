"""The `testset` node (conf/testset/default.yaml), typed and checked once, with one-line errors
that name the key, as rag.run.settings does for a run's own keys."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from hydra.utils import to_absolute_path

from rag.config.compose import near_names
from rag.config.schema import Check, boolean, check_all, integer, number, string
from rag.testset.prompts import KINDS
from rag.types import RagError

GENERATORS = ("llm", "templates")


@dataclass(frozen=True)
class Filters:
    """What a passage and a question must pass (rag/testset/filters.py says how each is measured)."""

    min_passage_chars: int = 120
    min_prose_share: float = 0.8
    max_copied_words: int = 6
    min_word_overlap: float = 0.3
    max_word_overlap: float = 1.0
    min_answer_support: float = 0.5
    max_duplicate_cosine: float = 0.9
    round_trip_k: int = 0

    RULES: ClassVar[dict[str, Check]] = {
        "min_passage_chars": integer(1), "min_prose_share": number(0, 1), "max_copied_words": integer(1),
        "min_word_overlap": number(0, 1), "max_word_overlap": number(0, 1), "min_answer_support": number(0, 1),
        "max_duplicate_cosine": number(-1, 1, note="a cosine threshold"), "round_trip_k": integer(0),
    }


@dataclass(frozen=True)
class TestsetSettings:
    n: int
    seed: int
    out: Path
    generator: str
    dry_run: bool
    oversample: float
    kinds: tuple[tuple[str, float], ...]  # (kind, share), shares summing to 1
    passages: dict[str, Any]  # the chunker node that cuts documents into passages
    filters: Filters

    __test__ = False  # not a pytest class, despite its name
    RULES: ClassVar[dict[str, Check]] = {
        "n": integer(1), "seed": integer(), "out": string(), "generator": string(choices=GENERATORS),
        "dry_run": boolean, "oversample": number(1), **{f"kinds.{k}": number(0) for k in KINDS},
    }

    @property
    def summary_path(self) -> Path:
        """`<out>` with the suffix .summary.json, or .dry_run.json for a dry run's counts (which
        leave the summary of the file already written alone)."""
        return self.out.with_suffix(".dry_run.json" if self.dry_run else ".summary.json")


def _known(node: dict[str, Any], known: list[str], where: str) -> None:
    for key in node:
        if key not in known:
            raise RagError(f"{where}.{key} is not a setting{near_names(key, known)}; its settings: {', '.join(known)}")


def load_testset(node: dict[str, Any] | None) -> TestsetSettings:
    """The checked settings of a resolved `testset` node."""
    if not isinstance(node, dict):
        raise RagError("the testset node is missing: compose conf/testset.yaml (python -m rag.testset)")
    top = [f.name for f in fields(TestsetSettings)]
    _known(node, top, "testset")
    check_all({"testset": node}, {f"testset.{k}": c for k, c in TestsetSettings.RULES.items()})
    kinds = dict(node.get("kinds") or {})
    _known(kinds, list(KINDS), "testset.kinds")
    total = sum(float(v) for v in kinds.values())
    if total <= 0:
        raise RagError(f"testset.kinds: the shares must add up to more than 0, got {kinds}")
    raw_filters = dict(node.get("filters") or {})
    _known(raw_filters, [f.name for f in fields(Filters)], "testset.filters")
    check_all({"testset": {"filters": raw_filters}}, {f"testset.filters.{k}": c for k, c in Filters.RULES.items()})
    filters = Filters(**raw_filters)
    if filters.min_word_overlap > filters.max_word_overlap:
        raise RagError(f"testset.filters.min_word_overlap ({filters.min_word_overlap}) is above "
                       f"max_word_overlap ({filters.max_word_overlap}): no question could pass")
    passages = node.get("passages")
    if not isinstance(passages, dict) or "_target_" not in passages:
        raise RagError("testset.passages must be a chunker node with a _target_ (e.g. rag.chunker.SentenceChunker)")
    return TestsetSettings(
        n=int(node["n"]), seed=int(node["seed"]), out=Path(to_absolute_path(str(node["out"]))),
        generator=str(node["generator"]), dry_run=bool(node["dry_run"]), oversample=float(node["oversample"]),
        kinds=tuple((k, float(kinds[k]) / total) for k in KINDS if float(kinds.get(k, 0)) > 0),
        passages=dict(passages), filters=filters)
