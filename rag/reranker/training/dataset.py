"""From training documents (and labelled questions) to training and validation groups: queries of
each family (labelled, templates, mined, generated), a train/validation split by document, and
negatives from other documents.

Negatives: the top BM25 hits of the query among the training passages (hard), sampled among the
first HARD_POOL distinct documents, plus random passages of the same source (easy). Never a
passage of the query's own document, of a document that yields the same query, one equal to a
passage of the own document (shared boilerplate), one that contains the query literally, or,
for training groups, one of a validation document.
"""
from __future__ import annotations

import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rag.reranker.training.examples import Example, Group, Pair
from rag.reranker.training.passages import PassagePool
from rag.reranker.training.text import contains_query, norm
from rag.types import Document, QAItem, RagError

log = logging.getLogger(__name__)
T = TypeVar("T")

HARD_POOL = 10  # hard negatives are sampled among this many top BM25 hits (one per document)
BM25_DEPTH = 60
FAMILIES = ("labelled", "templates", "mined", "generated")


@dataclass
class Dataset:
    train: list[Group]
    val: list[Group]
    stats: dict[str, Any]

    def train_pairs(self) -> list[Pair]:
        return [p for g in self.train for p in g.pairs()]


def is_validation_doc(doc_id: str, seed: int, fraction: float) -> bool:
    h = int(hashlib.sha256(f"val:{seed}:{doc_id}".encode()).hexdigest()[:12], 16)
    return h / float(1 << 48) < fraction


def round_robin(examples: Sequence[Example], n: int, rng: random.Random) -> list[Example]:
    """Up to n examples taken in turn from each (source, kind) bucket, each bucket shuffled, so that
    no source or template dominates."""
    buckets: dict[tuple[str, str], list[Example]] = {}
    for e in examples:
        buckets.setdefault((e.source, e.kind), []).append(e)
    return take_in_turn(buckets, n, rng)


def take_in_turn(buckets: Mapping[Any, list[T]], n: int, rng: random.Random) -> list[T]:
    """Up to n items, one from each bucket in turn (buckets in sorted key order, each shuffled by
    `rng` first). The buckets are consumed."""
    queues = [buckets[k] for k in sorted(buckets)]
    for q in queues:
        rng.shuffle(q)
    out: list[T] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop())
    return out


class NegativeSampler:
    def __init__(self, pool: PassagePool, examples: Sequence[Example], val_docs: set[str]) -> None:
        self.pool = pool
        self.val_docs = val_docs
        # documents that yield the same query (ZeroPad1d/2d/3d share a summary) are all positives
        self.docs_by_query: dict[str, set[str]] = {}
        for e in examples:
            self.docs_by_query.setdefault(norm(e.query), set()).add(e.doc_id)
        self.own_texts: dict[str, set[str]] = {}
        for p in pool.passages:
            self.own_texts.setdefault(p.doc_id, set()).add(norm(p.text))
        self.rows_by_source: dict[str, list[int]] = {}
        for i, p in enumerate(pool.passages):
            self.rows_by_source.setdefault(p.source, []).append(i)

    def groups(self, chosen: Sequence[Example], hard: int, easy: int, rng: random.Random, training: bool) -> list[Group]:
        if not chosen:
            return []
        hits = self.pool.bm25.search([e.query for e in chosen], min(len(self.pool), BM25_DEPTH))
        out = []
        for qi, e in enumerate(chosen):
            negs = self._negatives(e, [int(r) for r in hits.ids[qi] if r >= 0], hard, easy, rng, training)
            if negs:
                out.append(Group(e.query, e.doc_id, e.source, e.kind, e.positive, tuple(negs)))
        return out

    def _negatives(self, e: Example, ranked: list[int], hard: int, easy: int, rng: random.Random,
                   training: bool) -> list[str]:
        pool = self.pool
        same_query = self.docs_by_query.get(norm(e.query), {e.doc_id}) | {e.doc_id}
        own = self.own_texts.get(e.doc_id, set())
        used: set[str] = {e.positive}

        def usable(row: int) -> bool:
            p = pool.passages[row]
            return (p.doc_id not in same_query and norm(p.text) not in own and pool.text(row) not in used
                    and not (training and p.doc_id in self.val_docs) and not contains_query(p.text, e.query))

        top: list[int] = []
        top_docs: set[str] = set()
        for r in ranked:
            if len(top) < HARD_POOL and pool.passages[r].doc_id not in top_docs and usable(r):
                top.append(r)
                top_docs.add(pool.passages[r].doc_id)
        negs: list[str] = []
        # sampled among the top hits rather than the very top ones, which are the most likely to
        # be relevant passages that merely sit in another document
        for r in sorted(rng.sample(top, min(hard, len(top)))):
            negs.append(pool.text(r))
            used.add(negs[-1])
        same = self.rows_by_source.get(e.source, [])
        for _ in range(50 * max(1, hard + easy)):
            if len(negs) >= hard + easy:
                break
            r = same[rng.randrange(len(same))] if same and rng.random() < 0.8 else rng.randrange(len(pool))
            if usable(r):
                negs.append(pool.text(r))
                used.add(negs[-1])
        return negs


def collect_examples(docs: Sequence[Document], pool: PassagePool, questions: Sequence[QAItem],
                     s: Mapping[str, Any], generated: Sequence[Example] = ()) -> dict[str, list[Example]]:
    """Every candidate example of each family that has a budget."""
    from rag.reranker.training.labelled import labelled_examples
    from rag.reranker.training.mining import mined_examples, unique_headings
    from rag.reranker.training.templates import template_examples

    budget = s["queries"]
    out: dict[str, list[Example]] = {f: [] for f in FAMILIES}
    if budget["labelled"]:
        out["labelled"] = labelled_examples(questions, pool)
    if budget["templates"]:
        out["templates"] = [e for d in docs for e in template_examples(d, pool)]
        if not out["templates"]:
            from rag.reranker.training.structure import LOOKED_FOR

            log.warning("reranker.train.queries.templates=%s: the %d training documents have %s; the templates "
                        "family adds no query", budget["templates"], len(docs), LOOKED_FOR)
    if budget["mined"]:
        headings = unique_headings(docs)
        kinds = set(s["mined_kinds"])
        out["mined"] = [e for d in docs for e in mined_examples(d, pool, s["passage_chars"], kinds, headings)]
    if budget["generated"]:
        out["generated"] = list(generated)
    return out


def build_dataset(docs: Sequence[Document], s: Mapping[str, Any], questions: Sequence[QAItem] = (),
                  generated: Sequence[Example] = ()) -> Dataset:
    """Training and validation groups (deterministic for the settings' seed)."""
    t0 = time.perf_counter()
    seed = int(s["seed"])
    pool = PassagePool(docs, s["chunk_size"], s["chunk_overlap"], s["label_passages"])
    families = collect_examples(docs, pool, questions, s, generated)
    val_docs = {d.id for d in docs if is_validation_doc(d.id, seed, s["val_fraction"])}
    # separate generators, so that the validation set does not change with the training budget
    rng_train, rng_val = random.Random(f"train:{seed}"), random.Random(f"val:{seed}")
    chosen_train: list[Example] = []
    val_candidates: list[Example] = []
    for family in FAMILIES:
        exs = families[family]
        chosen_train += round_robin([e for e in exs if e.doc_id not in val_docs], s["queries"][family], rng_train)
        val_candidates += [e for e in exs if e.doc_id in val_docs]
    chosen_val = round_robin(val_candidates, s["val_queries"], rng_val)
    if not chosen_train:
        raise RagError(f"reranker training: no training queries could be built from {len(docs)} documents "
                       f"(queries: {dict(s['queries'])})")
    sampler = NegativeSampler(pool, [e for f in families.values() for e in f], val_docs)
    train = sampler.groups(chosen_train, s["hard_negatives"], s["random_negatives"], rng_train, training=True)
    val = sampler.groups(chosen_val, s["hard_negatives"], s["random_negatives"], rng_val, training=False)
    stats = {
        "documents": len(docs),
        "validation_documents": len(val_docs),
        "passages": len(pool),
        "candidates_by_family": {f: len(v) for f, v in families.items()},
        "train_queries": len(train),
        "train_pairs": sum(1 + len(g.negatives) for g in train),
        "train_by_kind": dict(sorted(Counter(g.kind for g in train).items())),
        "val_queries": len(val),
        "val_by_kind": dict(sorted(Counter(g.kind for g in val).items())),
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    return Dataset(train, val, stats)
