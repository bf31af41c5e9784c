"""The component families' base classes (rag/<family>/base.py) document what a new component must
implement: every required method (one the base leaves to subclasses: it raises
NotImplementedError, is abstract, or is a Protocol's `...`) has a Google-style docstring with its
arguments and what it returns, and the component-interfaces page shows it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rag.config.compose import PROJECT_ROOT

BASES = sorted((PROJECT_ROOT / "rag").glob("*/base.py"))
PAGE = PROJECT_ROOT / "docs" / "reference" / "components.md"


def _body(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """The statements of a function after its docstring."""
    docstring = ast.get_docstring(fn) is not None
    return fn.body[1:] if docstring else fn.body


def required(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Left to subclasses: abstract, `raise NotImplementedError`, or a Protocol's `...`."""
    if any(ast.unparse(d).endswith("abstractmethod") for d in fn.decorator_list):
        return True
    body = _body(fn)
    if len(body) != 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Raise) and stmt.exc is not None and "NotImplementedError" in ast.unparse(stmt.exc):
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis


def required_methods(path: Path) -> list[tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(class, method, node) of every required method of the public classes of a base module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
        for fn in cls.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and required(fn):
                out.append((cls.name, fn.name, fn))
    return out


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg not in ("self", "cls")]


REQUIRED = [(f"{path.parent.name}.{cls}.{name}", fn) for path in BASES for cls, name, fn in required_methods(path)]


def test_the_families_required_methods_are_found():
    """The finder sees what a contributor must write, so the checks below cannot pass on nothing."""
    found = {name for name, _ in REQUIRED}
    assert {"reranker.Reranker.rerank", "llm.Generator.generate", "embedder.Embedder.encode",
            "chunker.BaseChunker.split", "chunker.Chunker.split", "compressor.Compressor.select",
            "corpus.Corpus.load", "qa.QuestionSet.items", "index.VectorIndex._new",
            "retriever.Retriever._search"} <= found


@pytest.mark.parametrize("name, fn", REQUIRED, ids=[name for name, _ in REQUIRED])
def test_every_required_method_says_what_it_takes_and_returns(name, fn):
    doc = ast.get_docstring(fn)
    assert doc, f"{name} has no docstring: say what the runner passes, what to return and show an example"
    assert re.search(r"\bRequired\b", doc.split("\n\n")[0]), f"{name}: its summary says it is required"
    taken = params(fn)
    if taken:
        assert "Args:" in doc, f"{name}: an Args: section"
        for p in taken:
            assert re.search(rf"^\s+{p}( \([^)]*\))?:", doc, re.M), f"{name}: Args: names {p}"
    if fn.returns is not None and ast.unparse(fn.returns) != "None":
        assert "Returns:" in doc, f"{name}: a Returns: section"


def test_a_required_method_without_a_docstring_is_found(tmp_path):
    base = tmp_path / "base.py"
    base.write_text("class Thing:\n    def run(self, x: int) -> int:\n        raise NotImplementedError\n\n"
                    "    def helper(self) -> int:\n        return 1\n")
    [(cls, name, fn)] = required_methods(base)
    assert (cls, name) == ("Thing", "run") and ast.get_docstring(fn) is None


def test_the_interfaces_page_shows_each_familys_required_methods():
    page = PAGE.read_text(encoding="utf-8")
    blocks = dict(re.findall(r"^::: (rag\.\S+)\n((?:    .*\n)*)", page, re.M))
    for path in BASES:
        module = f"rag.{path.parent.name}.base"
        for cls, name, _ in required_methods(path):
            if cls == "Chunker":  # the Protocol: the page shows BaseChunker, which implements it
                continue
            block = blocks.get(f"{module}.{cls}")
            assert block is not None, f"docs/reference/components.md shows {module}.{cls}"
            assert re.search(rf"^\s+- {re.escape(name)}$", block, re.M), f"{module}.{cls}: lists {name}"
