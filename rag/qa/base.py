"""Question sets: questions with ground-truth answers and, when known, the document holding it
and graded relevance labels (documents, optionally with the answer's character span).

Each set is built from keyword arguments (Hydra) and has `load() -> list[QAItem]` (deterministic
order) and `fingerprint()`, like the corpora, and a `split` (QuestionSplit): the part of the set
that `load()` returns. This module holds the split, the base class, qa=none and the graded labels'
parser; the sets are pubmedqa.py, jsonl.py and mixed.py (BEIR's is rag.corpus.beir's).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rag.corpus.base import text_field
from rag.types import QAItem, RagError, Relevance, check_grade

PARTS = ("all", "train", "test")


def split_hash(question_id: str, seed: int) -> float:
    """The question's place in [0, 1) under `seed`. The same seeded SHA-256 as the slice's stable
    order (rag.corpus.slicing), so that the questions a slice keeps first are the ones with the
    smallest values: a slice of the test part, with the same seed, is the slice of the whole set
    whenever the test part holds at least as many questions as the slice keeps."""
    return int(hashlib.sha256(f"{seed}:{question_id}".encode()).hexdigest(), 16) / float(1 << 256)


@dataclass(frozen=True)
class QuestionSplit:
    """A deterministic train/test split of a question set by a seeded hash of each question id:
    `fraction` of the questions (in expectation) form the test part, the rest the train part.
    `part` is what `load()` returns: all (the default: the split changes nothing), train or test.
    A question's part depends only on its id, the seed and the fraction, never on the other
    questions, so adding questions to a set moves none of the old ones across the line."""

    fraction: float = 0.2
    seed: int = 0
    part: str = "all"

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise RagError(f"qa.split.part must be one of {list(PARTS)}, got {self.part!r}")
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not 0 < self.fraction < 1:
            raise RagError(f"qa.split.fraction must be a number in (0, 1), got {self.fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise RagError(f"qa.split.seed must be an integer, got {self.seed!r}")

    @classmethod
    def of(cls, split: "QuestionSplit | Mapping[str, Any] | None") -> "QuestionSplit":
        if split is None or isinstance(split, QuestionSplit):
            return split or cls()
        if not isinstance(split, Mapping):
            raise RagError(f"qa.split must be a mapping (fraction, seed, part), got {type(split).__name__}")
        unknown = sorted(set(split) - {"fraction", "seed", "part"})
        if unknown:
            raise RagError(f"qa.split: unknown key(s) {unknown}; known: fraction, seed, part")
        return cls(**dict(split))

    def in_test(self, question_id: str) -> bool:
        return split_hash(question_id, self.seed) < self.fraction

    def part_of(self, question_id: str) -> str:
        return "test" if self.in_test(question_id) else "train"

    def apply(self, items: Sequence[QAItem]) -> list[QAItem]:
        if self.part == "all":
            return list(items)
        return [q for q in items if self.part_of(q.id) == self.part]

    def with_part(self, part: str) -> "QuestionSplit":
        return QuestionSplit(self.fraction, self.seed, part)

    @property
    def id(self) -> dict[str, Any]:
        return asdict(self)


class QuestionSet:
    """Base of the question sets: `load()` is the split's part of `items()`."""

    def __init__(self, split: QuestionSplit | Mapping[str, Any] | None = None) -> None:
        self.split = QuestionSplit.of(split)

    def items(self) -> list[QAItem]:
        """Reads every question of the set. Required.

        The runner calls `load()`, which keeps the part of `items()` that `qa.split` names (dev,
        test, ...) and refuses an empty part; the questions are cached by `fingerprint`.

        Returns:
            The questions, each with a unique `id`, its `question`, its `answer` (None where the
            set has labels only), and where known the id of its source document (`source`), that
            document's group tag (`corpus`) and graded `relevant` labels.

        Raises:
            RagError: An input file is missing or a line is malformed, in one line naming it.

        Example:
            A fixed pair of questions:

                class Two(QuestionSet):
                    def items(self):
                        return [QAItem("q1", "What does free do?", "It frees memory.", source="man:free.3"),
                                QAItem("q2", "What does fcntl do?", "It manipulates a descriptor.")]

                    def inputs_fingerprint(self):
                        return {"version": 1}
        """
        raise NotImplementedError

    def inputs_fingerprint(self) -> dict[str, Any]:
        """What the questions are read from. Required.

        Returns:
            A JSON-able mapping that changes when the questions may (input paths with their sizes
            and modification times, `rag.corpus.base.file_fingerprint`, and the reader's
            settings); the cached questions are reused while it is equal.
        """
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        return {"class": type(self).__name__, **self.inputs_fingerprint(), "split": self.split.id}

    def load(self) -> list[QAItem]:
        items = self.split.apply(self.items())
        if not items:
            raise RagError(f"{type(self).__name__}: the {self.split.part} part of the question set is empty")
        return items


class NoQuestions(QuestionSet):
    """qa=none: no question set. `python -m rag.ask` answers typed questions without one; a run,
    which scores questions, says what to add (rag.run.session)."""

    HINT = "qa=none: a run scores a question set; add qa=jsonl qa.path=my_questions.jsonl (python -m rag.ask needs none)"

    def inputs_fingerprint(self) -> dict[str, Any]:
        return {}

    def items(self) -> list[QAItem]:
        return []

    def load(self) -> list[QAItem]:
        return []


def parse_relevant(value: Any, where: str) -> tuple[Relevance, ...]:
    """The optional `relevant` field of a JSONL question: a list of {"doc", "grade" (int >= 0,
    default 1), "span" ([start, end) character offsets into the document text, optional)}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RagError(f"{where}: field 'relevant' must be a list of objects, got {type(value).__name__}")
    labels = []
    for i, obj in enumerate(value):
        at = f"{where}: relevant[{i}]"
        if not isinstance(obj, dict):
            raise RagError(f"{at} must be an object with 'doc', 'grade' and optional 'span', got {type(obj).__name__}")
        unknown = sorted(set(obj) - {"doc", "grade", "span"})
        if unknown:
            raise RagError(f"{at}: unknown field(s) {unknown}; expected 'doc', 'grade', 'span'")
        doc = text_field(obj, "doc", at, is_id=True)
        grade = obj.get("grade", 1)
        if isinstance(grade, bool) or not isinstance(grade, int) or grade < 0:
            raise RagError(f"{at}: 'grade' must be a non-negative integer, got {grade!r}")
        check_grade(grade, f"{at}: 'grade'")
        span = obj.get("span")
        if span is not None:
            ok = (isinstance(span, list) and len(span) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) for x in span) and 0 <= span[0] < span[1])
            if not ok:
                raise RagError(f"{at}: 'span' must be [start, end] character offsets with 0 <= start < end, got {span!r}")
            span = (span[0], span[1])
        labels.append(Relevance(doc, grade, span))
    if not labels:
        raise RagError(f"{where}: field 'relevant' is an empty list; leave it out to use 'source'")
    return tuple(labels)
