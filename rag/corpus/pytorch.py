"""PyTorch API documentation: docstrings of the installed `torch` package, plus optionally the
reStructuredText/Markdown sources of the PyTorch docs.

The same object is reachable under many names (torch.nn.Linear is also
torch.nn.modules.linear.Linear) and many functions share one docstring (in-place and
out-of-place variants, deprecated aliases), so the walk deduplicates: the first occurrence in
walk order wins, by object identity and by cleaned docstring text.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag.corpus.base import Corpus, as_path, check_documents, decode_utf8, listing_fingerprint
from rag.config.schema import MaybeDirectory, checked
from rag.types import Document, RagError

log = logging.getLogger(__name__)

DEFAULT_MODULES = (
    "torch",
    "torch.Tensor",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.utils",
    "torch.optim",
    "torch.optim.lr_scheduler",
    "torch.utils.data",
    "torch.autograd",
    "torch.autograd.functional",
    "torch.linalg",
    "torch.fft",
    "torch.special",
    "torch.distributions",
    "torch.cuda",
    "torch.amp",
    "torch.jit",
    "torch.onnx",
    "torch.distributed",
    "torch.hub",
    "torch.random",
    "torch.sparse",
    "torch.testing",
    "torch.profiler",
    "torch.utils.checkpoint",
    "torch.func",
    "torch.export",
    "torch.compiler",
)

DOC_SUFFIXES = (".rst", ".md")

# Document ids: "torch:{qualified name}" for a docstring, "torchdoc:{relative path}" for a page
# of the reST/Markdown docs.
DOCSTRING_PREFIX = "torch:"
DOC_PAGE_PREFIX = "torchdoc:"


def docstring_id(qualname: str) -> str:
    return f"{DOCSTRING_PREFIX}{qualname}"


def doc_page_id(relative_path: str) -> str:
    return f"{DOC_PAGE_PREFIX}{relative_path}"


def is_docstring_id(doc_id: str) -> bool:
    return doc_id.startswith(DOCSTRING_PREFIX)


def is_doc_page_id(doc_id: str) -> bool:
    return doc_id.startswith(DOC_PAGE_PREFIX)


def docstring_parts(text: str) -> tuple[str, str, list[str]]:
    """(header line, docstring, its paragraphs) of a docstring document's text: the header is the
    qualified name with its signature ("torch.clone(input, *, memory_format=...) -> Tensor")."""
    header, _, doc = text.partition("\n\n")
    return header, doc, [p for p in re.split(r"\n\s*\n", doc) if p.strip()]


_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")


def page_sections(text: str) -> list[tuple[str, str]]:
    """(heading, text until the next heading) of a reST or Markdown page: reST headings are
    underlined (and maybe overlined), Markdown ones start with up to four #."""
    lines = text.splitlines()
    heads: list[tuple[int, str, int]] = []  # (line of the heading, heading, first body line)
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

# Sphinx scaffolding that carries no prose: toctrees, module markers, autosummary blocks and
# their options, link targets, comments. Directives that name an API object (autofunction,
# autoclass...) are kept, since the name is what a reader searches for.
_DIRECTIVE_ONLY = re.compile(
    r"^\s*\.\.\s+("
    r"toctree|currentmodule|module|py:module|automodule|autosummary|contents|include|raw|"
    r"highlight|role|default-role|only|image|figure|sectionauthor|moduleauthor|"
    r"_[^:]*"  # link targets such as ".. _forward-hooks:"
    r")::?.*$"
)
_DIRECTIVE_OPTION = re.compile(
    r"^\s*:(maxdepth|caption|glob|hidden|titlesonly|includehidden|numbered|name|toctree|"
    r"nosignatures|template|recursive|local|depth|backlinks|members|undoc-members|"
    r"inherited-members|show-inheritance|noindex|no-index|exclude-members|special-members|"
    r"private-members|member-order|platform|synopsis|deprecated|alt|width|height|align|scale|"
    r"target|class):.*$"
)
_BLANK_RUNS = re.compile(r"\n{3,}")


def clean_rst(text: str) -> str:
    """reST mostly as written (it reads fine as plain text) minus directive-only lines."""
    lines = [
        line.rstrip()
        for line in text.splitlines()
        if not _DIRECTIVE_ONLY.match(line) and not _DIRECTIVE_OPTION.match(line)
    ]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip()


def _safe_getattr(obj: Any, name: str) -> Any:
    # torch objects can raise anything from attribute access (lazy imports, deprecation
    # shims, properties that need CUDA); a failing attribute is just not documented
    try:
        return getattr(obj, name)
    except Exception:
        return None


# A default value's repr may hold its memory address ("<function noop_context_fn at 0x7f27...>"),
# which differs in every process: the corpus text, its chunks and their scores must not. pybind11
# writes such reprs into docstrings too (ProcessGroup.allreduce's "opts: AllreduceOptions =
# <... AllreduceOptions object at 0x7f1b...>").
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def _doc(obj: Any) -> str:
    try:
        doc = obj.__doc__
    except Exception:
        return ""
    return _ADDRESS.sub(">", inspect.cleandoc(doc)) if isinstance(doc, str) else ""


def _signature(obj: Any) -> str:
    try:
        return _ADDRESS.sub(">", str(inspect.signature(obj)))
    except Exception:  # builtins without text signatures, odd callables
        return ""


def _member_kind(raw: Any) -> tuple[Any, str] | None:
    """(documented object, kind) for a class attribute as stored in the class, or None for
    attributes that are not methods or properties."""
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__, "staticmethod" if isinstance(raw, staticmethod) else "classmethod"
    if isinstance(raw, property) or inspect.isgetsetdescriptor(raw) or inspect.ismemberdescriptor(raw):
        return raw, "property"
    if inspect.isroutine(raw):
        return raw, "method"
    return None


def _defined_elsewhere(raw: Any, cls: type) -> bool:
    """Whether a class attribute is a copy of another class's: the legacy torch.FloatTensor &
    co. carry Tensor's methods in their own __dict__ without inheriting from it."""
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    func = func.fget if isinstance(func, property) and func.fget is not None else func
    owner = getattr(func, "__objclass__", None)  # C descriptors name their class
    if isinstance(owner, type):
        return owner is not cls
    if inspect.isfunction(func):  # not builtins: pybind11 names them all "PyCapsule.<name>"
        qualname = func.__qualname__
        if "." in qualname and "<locals>" not in qualname:
            return qualname.rsplit(".", 1)[0] != cls.__qualname__
    return False


def _from_torch(obj: Any) -> bool:
    """Whether an object found by dir() belongs to torch rather than being an import such as
    typing.Optional; objects without a __module__ (some builtins) are given the benefit."""
    mod = getattr(obj, "__module__", None)
    return not isinstance(mod, str) or mod == "torch" or mod.startswith("torch.")


class PyTorchCorpus(Corpus):
    """Documents `torch:{qualified name}` (docstrings) and `torchdoc:{relative path}` (doc
    sources), all with source "pytorch".

    `modules` entries are module names, or a class given by its dotted name ("torch.Tensor")
    whose attributes, inherited ones included, are documented as its members.
    """

    @checked("corpus")
    def __init__(
        self,
        modules: list[str] | tuple[str, ...] = DEFAULT_MODULES,
        docs_dir: MaybeDirectory = None,
        include_docstrings: bool = True,
    ) -> None:
        super().__init__()
        self.modules = [str(m) for m in modules]
        self.docs_dir = as_path(docs_dir) if docs_dir else None
        self.include_docstrings = bool(include_docstrings)

    # ---- fingerprint ---------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        return {
            "modules": self.modules,
            "docs_dir": str(self.docs_dir) if self.docs_dir else None,
            "include_docstrings": self.include_docstrings,
            "render": 3,  # 2: memory addresses removed from signatures; 3: and from docstrings
        }

    def inputs(self) -> Any:
        out: dict[str, Any] = {}
        if self.include_docstrings and self.modules:
            import torch

            out["torch"] = {"version": torch.__version__, "path": str(Path(torch.__file__).parent)}
        if self.docs_dir is not None:
            out["docs"] = listing_fingerprint(self._doc_files(), root=self.docs_dir)
        return out

    # ---- load ----------------------------------------------------------------------------------

    def load(self) -> list[Document]:
        self.skipped = []
        docs: list[Document] = []
        if self.include_docstrings:
            docs.extend(self._docstring_documents())
        if self.docs_dir is not None:
            docs.extend(self._doc_file_documents())
        if not docs:
            raise RagError(f"PyTorchCorpus: no documents (modules={self.modules}, docs_dir={self.docs_dir})")
        return check_documents(docs, "PyTorchCorpus")

    def _docstring_documents(self) -> list[Document]:
        docs: list[Document] = []
        seen_objects: list[Any] = []  # held so that ids of transient objects are never reused
        seen_ids: set[int] = set()
        seen_docs: set[str] = set()
        seen_names: set[str] = set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation shims warn on attribute access
            for qualname, obj, kind in self._walk():
                if id(obj) in seen_ids or qualname in seen_names:
                    continue
                seen_ids.add(id(obj))
                seen_objects.append(obj)
                doc = _doc(obj)
                if not doc or doc in seen_docs:
                    continue
                seen_docs.add(doc)
                seen_names.add(qualname)
                sig = _signature(obj) if kind != "property" else ""
                docs.append(
                    Document(
                        id=docstring_id(qualname),
                        text=f"{qualname}{sig}\n\n{doc}",
                        source="pytorch",
                        meta={"object": qualname, "kind": kind},
                    )
                )
        return docs

    def _walk(self) -> Iterator[tuple[str, Any, str]]:
        """(qualified name, object, kind) in walk order, before deduplication.

        Class attributes copied from another class (see `_defined_elsewhere`) are held back to
        the end, so that they are documented under their own class when the walk reaches it,
        and under the class that carries them only when it does not."""
        deferred: list[tuple[str, Any, str]] = []
        for name in self.modules:
            target = self._resolve(name)
            if target is None:
                continue
            if inspect.isclass(target):
                yield from self._class_members(name, target, True, deferred)
            else:
                yield from self._module_members(name, target, deferred)
        yield from deferred

    def _resolve(self, name: str) -> Any:
        """The module, or the class for a dotted class name; None (with a warning) when neither
        can be had, e.g. a module that fails to import on this build."""
        try:
            return importlib.import_module(name)
        except Exception as e:
            error = e
        parent, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(parent), attr) if parent else None
        except Exception:
            obj = None
        if inspect.isclass(obj):
            return obj
        log.warning("PyTorchCorpus: skipping %s: %s: %s", name, type(error).__name__, error)
        return None

    def _module_members(
        self, modname: str, module: Any, deferred: list[tuple[str, Any, str]]
    ) -> Iterator[tuple[str, Any, str]]:
        exported = _safe_getattr(module, "__all__")
        if isinstance(exported, (list, tuple)):
            names, check_origin = [str(n) for n in exported], False
        else:
            try:
                names = sorted(n for n in dir(module) if not n.startswith("_"))
            except Exception:
                names = []
            check_origin = True  # dir() also lists what the module merely imported
        for name in names:
            obj = _safe_getattr(module, name)
            if obj is None or inspect.ismodule(obj):
                continue
            if check_origin and not _from_torch(obj):
                continue
            qualname = f"{modname}.{name}"
            if inspect.isclass(obj):
                yield qualname, obj, "class"
                yield from self._class_members(qualname, obj, False, deferred)
            elif inspect.isroutine(obj):
                yield qualname, obj, "function"

    def _class_members(
        self, qualname: str, cls: type, inherited: bool, deferred: list[tuple[str, Any, str]]
    ) -> Iterator[tuple[str, Any, str]]:
        """Public methods and properties of a class. Normally only those it defines itself, so
        that an inherited method is documented once, under the class that defines it; for a
        class walked as a namespace (torch.Tensor, whose methods live in its C base class) all
        of them."""
        try:
            names = sorted(n for n in (dir(cls) if inherited else vars(cls)) if not n.startswith("_"))
        except Exception:
            return
        for name in names:
            try:
                raw = inspect.getattr_static(cls, name)
            except Exception:
                continue
            member = _member_kind(raw)
            if member is None:
                continue
            item = (f"{qualname}.{name}", member[0], member[1])
            if not inherited and _defined_elsewhere(raw, cls):
                deferred.append(item)
            else:
                yield item

    def _doc_files(self) -> list[Path]:
        assert self.docs_dir is not None
        if not self.docs_dir.is_dir():
            raise RagError(f"{self.docs_dir}: docs directory not found")
        return sorted(
            p
            for p in self.docs_dir.rglob("*")
            if p.suffix in DOC_SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(self.docs_dir).parts)
        )

    def _doc_file_documents(self) -> list[Document]:
        assert self.docs_dir is not None
        docs = []
        for path in self._doc_files():
            rel = path.relative_to(self.docs_dir).as_posix()
            text = clean_rst(decode_utf8(path.read_bytes(), path))
            if not text:
                # an empty page, or one that is only a toctree: nothing to retrieve
                log.warning("PyTorchCorpus: skipping %s: no text", path)
                self.skipped.append(str(path))
                continue
            docs.append(Document(id=doc_page_id(rel), text=text, source="pytorch", meta={"path": rel}))
        return docs
