"""BEIR-layout datasets (SciFact, NFCorpus, ...): a directory with

    corpus.jsonl        {"_id", "title", "text", optional "metadata"} per line
    queries.jsonl       {"_id", "text", optional "metadata"} per line
    qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score, after a header line

`BeirCorpus` reads the documents, `BeirQuestions` the queries of one split with their qrels as
graded relevance labels. BEIR queries carry no answer text, so the similarity metrics (which
compare chunks with a ground-truth answer) are not computed for them; the label metrics are.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag.corpus.base import Corpus, as_path, file_fingerprint, jsonl_records, read_text, text_field
from rag.config.schema import FilePath, checked
from rag.types import Document, QAItem, RagError, Relevance, check_grade


class BeirCorpus(Corpus):
    """Documents from `<path>/corpus.jsonl`: the text is the title, a blank line, then the text
    (BEIR's dense baselines encode title and text together too). Documents whose title and text
    are both empty are skipped and listed in `skipped`."""

    @checked("corpus")
    def __init__(self, path: FilePath, source: str = "beir") -> None:
        super().__init__()
        self.path = as_path(path)
        self.source = str(source)

    @property
    def file(self) -> Path:
        return self.path / "corpus.jsonl"

    def settings(self) -> dict[str, Any]:
        return {"path": str(self.path), "source": self.source}

    def inputs(self) -> Any:
        return file_fingerprint(self.file)

    def title(self) -> str:
        return self.path.name

    def load(self) -> list[Document]:
        return list(self.iter_documents())

    def iter_documents(self) -> Iterator[Document]:
        self.skipped = []
        n = 0
        for where, doc_id, obj in jsonl_records(self.file, "_id", "document"):
            title = (text_field(obj, "title", where, required=False) or "").strip()
            body = (text_field(obj, "text", where, required=False) or "").strip()
            if not title and not body:
                self.skipped.append(f"{where}: document {doc_id!r} has no title and no text")
                continue
            text = f"{title}\n\n{body}" if title and body else title or body
            meta = obj.get("metadata")
            meta = dict(meta) if isinstance(meta, dict) else {}
            n += 1
            yield Document(id=doc_id, text=text, source=self.source, meta={"title": title or None, **meta})
        if not n:
            raise RagError(f"{self.file}: no documents with text")


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """query id -> {document id: grade}, in file order. The header line is optional."""
    out: dict[str, dict[str, int]] = {}
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if lineno == 1 and fields and fields[0].strip().lower() in ("query-id", "query_id", "qid"):
            continue
        if len(fields) != 3:
            raise RagError(f"{path}:{lineno}: expected 3 fields (query-id, corpus-id, score), got {len(fields)}")
        qid, doc_id, score = (f.strip() for f in fields)
        try:
            grade = int(score)
        except ValueError:
            raise RagError(f"{path}:{lineno}: score must be an integer, got {score!r}") from None
        if grade < 0:
            raise RagError(f"{path}:{lineno}: score must be 0 or more, got {grade}")
        check_grade(grade, f"{path}:{lineno}: score")
        if not qid or not doc_id:
            raise RagError(f"{path}:{lineno}: empty query-id or corpus-id")
        out.setdefault(qid, {})[doc_id] = grade
    if not out:
        raise RagError(f"{path}: no relevance judgements")
    return out


class BeirQuestions:
    """The queries of one split (`qrels/<split>.tsv`), in queries.jsonl order, each with its
    judged documents as document-level labels (grade = the qrels score). Queries without a
    positive judgement are left out, as BEIR's own evaluation does; judgements of grade 0 stay as
    labels (judged non-relevant, as in trec_eval)."""

    @checked("qa")
    def __init__(self, path: FilePath, split: str = "test", corpus: str = "beir") -> None:
        self.path = as_path(path)
        self.split = str(split)
        self.corpus = str(corpus)

    @property
    def files(self) -> tuple[Path, Path]:
        return self.path / "queries.jsonl", self.path / "qrels" / f"{self.split}.tsv"

    def fingerprint(self) -> dict[str, Any]:
        queries, qrels = self.files
        return {"class": type(self).__name__, "split": self.split, "corpus": self.corpus,
                "inputs": [file_fingerprint(queries), file_fingerprint(qrels)]}

    def load(self) -> list[QAItem]:
        queries_file, qrels_file = self.files
        qrels = read_qrels(qrels_file)
        texts = {qid: text_field(obj, "text", where)
                 for where, qid, obj in jsonl_records(queries_file, "_id", "query")}
        unknown = [q for q in qrels if q not in texts]
        if unknown:
            raise RagError(f"{qrels_file}: query id {unknown[0]!r} is not in {queries_file.name}"
                           + (f" ({len(unknown) - 1} more)" if len(unknown) > 1 else ""))
        items = []
        for qid, text in texts.items():
            judged = qrels.get(qid)
            if not judged or max(judged.values()) <= 0:
                continue
            labels = tuple(Relevance(doc, grade) for doc, grade in judged.items())
            items.append(QAItem(id=qid, question=text, answer=None, corpus=self.corpus, relevant=labels))
        if not items:
            raise RagError(f"{qrels_file}: no query has a positive judgement")
        return items
