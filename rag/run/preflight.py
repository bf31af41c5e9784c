"""The checks that need the data, in one step: after the corpus and the questions are loaded and
sliced, before anything is chunked, embedded or any model loads. Each is one line and exit 2 (a
RagError), so a run that cannot give a meaningful result stops in seconds, not after the work.

The config's values alone are checked earlier, at start-up (rag/config/schema.py), and the components
against each other when they are created (rag/run/session.py `create_components`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from eval.labels import LABEL_METRICS
from eval.scoring import ANSWER_METRICS, SIMILARITY_METRICS
from rag.corpus.slicing import check_unique_ids
from rag.reranker.base import Reranker
from rag.retriever.base import Retriever
from rag.types import Document, QAItem, RagError

Asker = tuple[str, "str | None", "str | None"]  # who, corpus tag, answer document


def objective_applies(objective: str, qa: Sequence[QAItem]) -> None:
    """A question set without answers (BEIR), sources or labels cannot score the metrics that
    need them; an objective among those would come back empty after all the work."""
    needs: dict[str, tuple[str, Callable[[QAItem], bool]]] = {
        m: ("a ground-truth answer", lambda q: q.answer is not None) for m in SIMILARITY_METRICS + ANSWER_METRICS}
    needs.update({m: ("a source document", lambda q: q.source is not None) for m in ("hit_at_k_id", "mrr_id")})
    needs.update({m: ("a positive relevance label", lambda q: any(r.grade > 0 for r in q.labels)) for m in LABEL_METRICS})
    if objective in needs and not any(needs[objective][1](q) for q in qa):
        raise RagError(f"objective {objective!r} needs questions with {needs[objective][0]}, and no question has one; "
                       "choose another objective (e.g. objective=ndcg_at_k)")


def document_sizes(docs: Sequence[Document], max_chars: int | None) -> None:
    """A single giant document (a 50 MB log pasted as one record) would silently dominate time
    and the index; it is far more often a mistake than a wish, so it stops the run up front."""
    if max_chars is None:
        return
    for d in docs:
        if len(d.text) > max_chars:
            raise RagError(
                f"document {d.id!r} is {len(d.text):,} characters, over max_doc_chars ({max_chars:,}); "
                "split it or raise max_doc_chars"
            )


def questions_match_corpus(qa: Sequence[QAItem], docs: Sequence[Document]) -> None:
    """The questions are there, their ids unique, and every source and label names a document of
    the whole corpus (before slicing)."""
    if not qa:
        raise RagError("qa: the question set is empty")
    check_unique_ids([q.id for q in qa], "qa")
    known = {d.id for d in docs}
    missing = [q for q in qa if q.source is not None and q.source not in known]
    if missing:
        first = missing[0]
        raise RagError(
            f"qa: question {first.id!r} names source {first.source!r}, which is not a document of the corpus"
            + (f" ({len(missing) - 1} more questions have the same problem)" if len(missing) > 1 else "")
        )
    labels_inside_documents(qa, {d.id: len(d.text) for d in docs})


def labels_inside_documents(qa: Sequence[QAItem], doc_lengths: dict[str, int]) -> None:
    """Every relevance label names a document of the corpus, and its span lies inside the text."""
    for q in qa:
        for r in q.relevant:
            if r.doc not in doc_lengths:
                raise RagError(f"qa: question {q.id!r} labels document {r.doc!r}, which is not a document of the corpus")
            if r.span is not None and r.span[1] > doc_lengths[r.doc]:
                raise RagError(
                    f"qa: question {q.id!r} labels span {list(r.span)} of {r.doc!r}, "
                    f"past the end of its text ({doc_lengths[r.doc]} characters)"
                )


def run(objective: str, all_qa: Sequence[QAItem], all_docs: Sequence[Document], qa: Sequence[QAItem],
        docs: Sequence[Document], max_doc_chars: int | None, retriever: Retriever, reranker: Reranker,
        askers: Sequence[Asker] = ()) -> None:
    """Every data check, in this order (the first failure stops the run); `all_*` are the loaded
    inputs, `qa` and `docs` the slice the run evaluates:

    1. the questions exist, their ids are unique, and every source and relevance label names a
       document of the corpus, each span inside its text (`questions_match_corpus`);
    2. the objective can be scored on the sliced questions (`objective_applies`);
    3. no sliced document is over `max_doc_chars` (`document_sizes`);
    4. every source filter matches the corpus and keeps each question's answer document
       (the retriever's `check_filters`; with rag.ask's --corpus among the askers);
    5. no evaluated question is one the reranker was trained on (the reranker's `check_questions`).
    """
    questions_match_corpus(all_qa, all_docs)
    objective_applies(objective, qa)
    document_sizes(docs, max_doc_chars)
    retriever.check_filters([(f"question {q.id!r}", q.corpus, q.source) for q in qa] + list(askers), docs)
    reranker.check_questions(list(qa))
