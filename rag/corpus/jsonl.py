"""A user corpus as JSON lines: one object per line with an id, a text and optionally a source."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from rag.corpus.base import Corpus, as_path, claim_id, file_fingerprint, iter_jsonl, text_field
from rag.types import Document, RagError


class JsonlCorpus(Corpus):
    """Every field other than id/text/source goes to `meta`; a "meta" object field is merged
    into it (its keys win, as they were put there on purpose)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        id_field: str = "id",
        text_field: str = "text",
        source_field: str = "source",
        default_source: str = "user",
    ) -> None:
        super().__init__()
        self.path = as_path(path)
        self.id_field = id_field
        self.text_field = text_field
        self.source_field = source_field
        self.default_source = default_source

    def settings(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "id_field": self.id_field,
            "text_field": self.text_field,
            "source_field": self.source_field,
            "default_source": self.default_source,
        }

    def inputs(self) -> Any:
        return file_fingerprint(self.path)

    def load(self) -> list[Document]:
        return list(self.iter_documents())

    def iter_documents(self) -> Iterator[Document]:
        self.skipped = []
        first_line: dict[str, int] = {}
        reserved = {self.id_field, self.text_field, self.source_field, "meta"}
        for lineno, obj in iter_jsonl(self.path):
            where = f"{self.path}:{lineno}"
            doc_id = text_field(obj, self.id_field, where, is_id=True)
            text = text_field(obj, self.text_field, where, required=False)
            if text is None:
                raise RagError(f"{where}: document {doc_id!r} has empty text (field '{self.text_field}')")
            claim_id(first_line, doc_id, lineno, where, "document")
            source = text_field(obj, self.source_field, where, required=False) or self.default_source
            extra = obj.get("meta")
            if extra is not None and not isinstance(extra, dict):
                raise RagError(f"{where}: field 'meta' must be an object, got {type(extra).__name__}")
            meta = {k: v for k, v in obj.items() if k not in reserved}
            meta.update(extra or {})
            yield Document(id=doc_id, text=text, source=source, meta=meta)
        if not first_line:
            raise RagError(f"{self.path}: file is empty")
