"""PubMedQA (PQA-L, `ori_pqal.json`): one document per abstract.

The file maps PMID -> record. `CONTEXTS` is the abstract without its conclusion and
`LONG_ANSWER` is the conclusion, so the retrievable document is the two put back together.
"""
from __future__ import annotations

import os
from typing import Any

from rag.corpus.base import Corpus, as_path, check_documents, file_fingerprint, load_json, text_field, text_value
from rag.config.schema import FilePath, checked
from rag.types import Document, RagError

# Document ids: "pmid:{PMID}" (MEDLINE records use the same scheme, so the two corpora agree).
ID_PREFIX = "pmid:"


def pmid_id(pmid: str | int) -> str:
    return f"{ID_PREFIX}{pmid}"


def load_pubmedqa(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The PMID -> record mapping, with the fields both the corpus and the question set rely on
    checked, so that a malformed record fails with its PMID rather than a KeyError."""
    p = as_path(path)
    data = load_json(p)
    if not isinstance(data, dict):
        raise RagError(f"{p}: expected a JSON object mapping PMID to record, got {type(data).__name__}")
    if not data:
        raise RagError(f"{p}: file has no records")
    for pmid, rec in data.items():
        if not isinstance(rec, dict):
            raise RagError(f"{p}: record {pmid}: expected an object, got {type(rec).__name__}")
        where = f"{p}: record {pmid}"
        contexts = rec.get("CONTEXTS")
        if not isinstance(contexts, list):
            raise RagError(f"{where}: field 'CONTEXTS' must be a list of strings")
        for i, c in enumerate(contexts):
            text_value(c, f"CONTEXTS[{i}]", where)
        for field in ("QUESTION", "LONG_ANSWER"):
            text_field(rec, field, where)
    return data


def document_text(rec: dict[str, Any]) -> tuple[str, tuple[int, int]]:
    """The retrievable text of one record (its contexts, then the conclusion) and the conclusion's
    character span in it. The question set labels that span, so both must come from here."""
    body = "\n\n".join(rec["CONTEXTS"])
    conclusion = rec["LONG_ANSWER"]
    text = f"{body}\n\n{conclusion}" if body else conclusion
    return text, (len(text) - len(conclusion), len(text))


class PubMedQACorpus(Corpus):
    @checked("corpus")
    def __init__(self, path: FilePath) -> None:
        super().__init__()
        self.path = as_path(path)

    def settings(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def inputs(self) -> Any:
        return file_fingerprint(self.path)

    def load(self) -> list[Document]:
        self.skipped = []
        docs = []
        for pmid, rec in load_pubmedqa(self.path).items():
            text, _ = document_text(rec)
            docs.append(
                Document(
                    id=pmid_id(pmid),
                    text=text,
                    source="pubmed",
                    meta={
                        "pmid": pmid,
                        "year": rec.get("YEAR"),
                        "meshes": list(rec.get("MESHES") or []),
                        "labels": list(rec.get("LABELS") or []),
                        "title": None,  # PQA-L does not carry titles
                    },
                )
            )
        return check_documents(docs, str(self.path))
