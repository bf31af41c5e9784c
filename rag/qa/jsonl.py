"""`qa=jsonl`: questions from a JSONL file of your own."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rag.corpus.base import aliased_field, as_path, file_fingerprint, jsonl_records, present_field, text_field
from rag.qa.base import QuestionSet, QuestionSplit, parse_relevant
from rag.config.schema import FilePath, checked
from rag.types import QAItem, RagError

# The question file's fields other than the three renamable ones, and their old names.
QUESTION_NAMES = ("doc_id", "source", "group", "corpus", "relevant", "provenance")


class JsonlQuestions(QuestionSet):
    """One JSON object per line: id, question, answer, and optionally doc_id (the id of the
    document that holds the answer), group (the question's group tag, as the corpus file's
    `group`), relevant (graded labels, see `parse_relevant`; without it, `doc_id` is the one
    relevant document, grade 1) and provenance (an object: how `python -m rag.testset` made the
    question; the reports mark such a question as generated). A question with labels may leave out
    the answer.

        {"id": "q1", "question": "When do backups run?", "answer": "Nightly at 02:00.", "doc_id": "note-1", "group": "ops"}

    Files written before these names read as well: `source` is the old name of `doc_id` and
    `corpus` of `group`. `id_field`, `question_field` and `answer_field` read those from fields
    of other names."""

    @checked("qa")
    def __init__(self, path: FilePath, split: QuestionSplit | Mapping[str, Any] | None = None,
                 id_field: str = "id", question_field: str = "question", answer_field: str = "answer") -> None:
        super().__init__(split)
        self.path = as_path(path)
        self.fields = {"id": id_field, "question": question_field, "answer": answer_field}

    def inputs_fingerprint(self) -> dict[str, Any]:
        renamed = {f"{k}_field": v for k, v in self.fields.items() if v != k}
        # Only renamed fields: the default reading keeps the fingerprint it always had.
        return {"inputs": file_fingerprint(self.path), **({"fields": renamed} if renamed else {})}

    def items(self) -> list[QAItem]:
        items: list[QAItem] = []
        id_field, question_field, answer_field = self.fields.values()
        read = {*self.fields.values(), *QUESTION_NAMES}
        for where, qid, obj in jsonl_records(self.path, id_field, "question", "qa.id_field", read - {id_field}):
            relevant = parse_relevant(obj.get("relevant"), where)
            question = present_field(obj, question_field, where, "qa.question_field", taken=read - {question_field})
            # Labelled questions may leave the answer out: only the similarity metrics need it.
            answer = (text_field(obj, answer_field, where, required=False) if relevant else
                      present_field(obj, answer_field, where, "qa.answer_field", taken=read - {answer_field},
                                    otherwise="(or give graded 'relevant' labels)"))
            items.append(
                QAItem(
                    id=qid,
                    question=question,
                    answer=answer,
                    source=aliased_field(obj, "doc_id", "source", where, is_id=True)[0],
                    corpus=aliased_field(obj, "group", "corpus", where)[0],
                    relevant=relevant,
                    provenance=provenance_field(obj, where),
                )
            )
        if not items:
            raise RagError(f"{self.path}: the question set is empty")
        return items


def provenance_field(obj: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The line's optional `provenance`: an object, kept as read (None: a question written by a
    person, or unmarked)."""
    value = obj.get("provenance")
    if value is None or isinstance(value, dict):
        return value
    raise RagError(f"{where}: field 'provenance' must be an object (how python -m rag.testset made the question), "
                   f"got {type(value).__name__}")
