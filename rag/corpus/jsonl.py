"""A user corpus as JSON lines: one object per line with an id, a text and optionally a group tag.

    {"id": "note-1", "text": "Backups run nightly at 02:00.", "group": "ops"}
    {"id": "note-2", "text": "The VPN needs a token.", "group": "it"}

`group` is the tag that source filters, the per-source chunker and the per-group metrics use;
files written before it was called so give it as `source`, which is still read."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rag.corpus.base import Corpus, aliased_field, as_path, claim_id, file_fingerprint, iter_jsonl, present_field
from rag.config.schema import FilePath, checked
from rag.types import Document, RagError

GROUP, OLD_GROUP = "group", "source"


class JsonlCorpus(Corpus):
    """Every field other than id/text/group is kept in `meta`; a "meta" object field is merged
    into it (its keys win, as they were put there on purpose). The group tag becomes the
    document's `source` (rag.types.Document)."""

    format_version = 2  # the group tag's field: `group`, `source` read as its old name

    @checked("corpus")
    def __init__(
        self,
        path: FilePath,
        id_field: str = "id",
        text_field: str = "text",
        group_field: str = GROUP,
        default_group: str = "user",
    ) -> None:
        super().__init__()
        self.path = as_path(path)
        self.id_field = id_field
        self.text_field = text_field
        self.group_field = group_field
        self.default_group = default_group

    def settings(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "id_field": self.id_field,
            "text_field": self.text_field,
            "group_field": self.group_field,
            "default_group": self.default_group,
        }

    def inputs(self) -> Any:
        return file_fingerprint(self.path)

    def title(self) -> str:
        return self.path.name

    def load(self) -> list[Document]:
        return list(self.iter_documents())

    def iter_documents(self) -> Iterator[Document]:
        self.skipped = []
        first_line: dict[str, int] = {}
        # The old name is the group only while the group field keeps its default name.
        old = OLD_GROUP if self.group_field == GROUP else None
        reserved = {self.id_field, self.text_field, self.group_field, "meta"}
        read = reserved | {OLD_GROUP}  # never suggested as the id or the text
        for lineno, obj in iter_jsonl(self.path):
            where = f"{self.path}:{lineno}"
            doc_id = present_field(obj, self.id_field, where, "corpus.id_field", is_id=True,
                                   taken=read - {self.id_field})
            text = present_field(obj, self.text_field, where, "corpus.text_field", required=False,
                                 taken=read - {self.text_field})
            if text is None:
                raise RagError(f"{where}: document {doc_id!r} has empty text (field '{self.text_field}')")
            claim_id(first_line, doc_id, lineno, where, "document")
            group, group_name = aliased_field(obj, self.group_field, old, where)
            extra = obj.get("meta")
            if extra is not None and not isinstance(extra, dict):
                raise RagError(f"{where}: field 'meta' must be an object, got {type(extra).__name__}")
            meta = {k: v for k, v in obj.items() if k not in reserved and k != group_name}
            meta.update(extra or {})
            yield Document(id=doc_id, text=text, source=group or self.default_group, meta=meta)
        if not first_line:
            raise RagError(f"{self.path}: file is empty")
