"""PubMed/MEDLINE XML (NCBI baseline format: PubmedArticleSet/PubmedArticle), plain or gzipped.

Baseline files hold ~30,000 articles and are ~150 MB uncompressed, so they are streamed with
iterparse and every article is cleared once read, keeping memory flat. NCBI distributes the
baseline as ~1,200 files (`pubmed25n0001.xml.gz` ...), so `paths` also takes glob patterns,
expanded in sorted order each time the corpus is fingerprinted or read.
"""
from __future__ import annotations

import glob
import gzip
import os
import re
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from io import BufferedIOBase
from typing import Annotated, Any

from rag.corpus.base import Corpus, as_path, checked_documents, file_fingerprint, normalize_space, text_value
from rag.corpus.pubmedqa import pmid_id
from rag.config.schema import checked, file_list
from rag.types import Document, RagError


def _text(elem: ET.Element | None) -> str:
    # itertext keeps text inside inline markup (<sub>, <i>, <sup>...)
    return normalize_space("".join(elem.itertext())) if elem is not None else ""


def _year(article: ET.Element) -> str | None:
    issue_date = article.find("Journal/JournalIssue/PubDate")
    if issue_date is not None:
        year = issue_date.findtext("Year")
        if year and year.strip():
            return year.strip()
        # older records have only a free-form MedlineDate such as "1998 Dec-1999 Jan"
        m = re.search(r"\b(\d{4})\b", issue_date.findtext("MedlineDate") or "")
        if m:
            return m.group(1)
    year = article.findtext("ArticleDate/Year")
    return year.strip() if year and year.strip() else None


def parse_article(elem: ET.Element) -> tuple[str, Document | None]:
    """(pmid, document) for one <PubmedArticle>; the document is None when there is no abstract."""
    citation = elem.find("MedlineCitation")
    pmid = (citation.findtext("PMID") if citation is not None else None) or ""
    pmid = pmid.strip()
    article = citation.find("Article") if citation is not None else None
    if not pmid or citation is None or article is None:
        return pmid, None
    title = _text(article.find("ArticleTitle")) or _text(article.find("VernacularTitle"))
    sections = []
    for part in article.findall("Abstract/AbstractText"):
        text = _text(part)
        if not text:
            continue
        label = (part.get("Label") or "").strip()
        sections.append(f"{label}: {text}" if label else text)
    if not sections:
        return pmid, None
    meshes = [_text(d) for d in citation.findall("MeshHeadingList/MeshHeading/DescriptorName")]
    doc = Document(
        id=pmid_id(pmid),
        text="\n\n".join([title, *sections] if title else sections),
        source="pubmed",
        meta={
            "pmid": pmid,
            "title": title or None,
            "year": _year(article),
            "journal": _text(article.find("Journal/Title")) or None,
            "meshes": [m for m in meshes if m],
        },
    )
    return pmid, doc


class MedlineCorpus(Corpus):
    """Documents `pmid:{PMID}` (source "pubmed") from one or more PubMed XML files, in file
    order. Articles without an abstract are left out and listed in `skipped` as "pmid:{PMID}"."""

    @checked("corpus")
    def __init__(self, paths: Annotated[str | os.PathLike[str] | Sequence[str | os.PathLike[str]], file_list]) -> None:
        super().__init__()
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        self.patterns = [as_path(p) for p in paths]
        if not self.patterns:
            raise RagError("MedlineCorpus: no input files given")

    @property
    def paths(self) -> list[Path]:
        """The files, each pattern expanded (sorted) in place; a pattern that matches nothing is an error."""
        files: list[Path] = []
        for p in self.patterns:
            if not glob.has_magic(str(p)):
                files.append(p)
                continue
            found = sorted(Path(f) for f in glob.glob(str(p)) if os.path.isfile(f))
            if not found:
                raise RagError(f"corpus.paths: {p} matches no file")
            files.extend(found)
        return list(dict.fromkeys(files))

    def settings(self) -> dict[str, Any]:
        return {"paths": [str(p) for p in self.patterns]}

    def inputs(self) -> Any:
        return [file_fingerprint(p) for p in self.paths]

    def load(self) -> list[Document]:
        return list(self.iter_documents())

    def iter_documents(self) -> Iterator[Document]:
        """The articles file by file, each file parsed as a stream (gunzipped as it is read)."""
        self.skipped = []
        yield from checked_documents(self._articles(), "MedlineCorpus")

    def _articles(self) -> Iterator[Document]:
        origin: dict[str, str] = {}
        files = self.paths
        for path in files:
            for doc in self._read(path):
                if doc.id in origin:  # named with the files, before checked_documents' plainer message
                    where = "earlier in the file" if origin[doc.id] == str(path) else f"also in {origin[doc.id]}"
                    raise RagError(f"{path}: duplicate article {doc.id} ({where})")
                origin[doc.id] = str(path)
                yield doc
        if not origin:
            raise RagError(f"{', '.join(map(str, files))}: no articles with an abstract")

    def _open(self, path: Path) -> BufferedIOBase:
        file_fingerprint(path)  # a missing file gets the usual one-line error
        if os.path.getsize(path) == 0:
            raise RagError(f"{path}: file is empty")
        return gzip.open(path) if path.suffix == ".gz" else open(path, "rb")

    def _read(self, path) -> Iterator[Document]:
        n_articles = 0
        try:
            with self._open(path) as f:
                root = None
                for event, elem in ET.iterparse(f, events=("start", "end")):
                    if root is None:
                        root = elem
                    if event != "end":
                        continue
                    if elem.tag == "PubmedArticle":
                        n_articles += 1
                        pmid, doc = parse_article(elem)
                        # An article without a PMID has no id to give it: malformed, not skippable.
                        text_value(pmid, "PMID", f"{path}: article {n_articles}", is_id=True)
                        if doc is None:
                            self.skipped.append(pmid_id(pmid))
                        else:
                            yield doc
                    if elem.tag in ("PubmedArticle", "PubmedBookArticle", "DeleteCitation"):
                        # drop finished records (books and deletions are not abstracts to
                        # retrieve) from the tree, or it would grow to the whole file
                        root.clear()
        except ET.ParseError as e:
            line = e.position[0] if getattr(e, "position", None) else "?"
            raise RagError(f"{path}:{line}: invalid XML: {normalize_space(str(e))}") from None
        except (OSError, EOFError, zlib.error) as e:
            raise RagError(f"{path}: cannot read: {normalize_space(str(e))}") from None
        if n_articles == 0:
            raise RagError(f"{path}: no <PubmedArticle> records")
