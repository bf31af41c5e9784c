"""The import graph of the project's packages has no circle, and every module imports only modules
of its own layer or below (docs/explanation/architecture.md, "Layers"), but for the few back-arrows that page
lists. Imports inside functions count too: a lazy import hides a circle from Python, not from a
reader."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from rag.config.compose import PROJECT_ROOT

PACKAGES = ("rag", "eval", "experiments", "benchmarks")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for f in (PROJECT_ROOT / package).rglob("*.py"):
            parts = f.relative_to(PROJECT_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a.b import c` is a.b.c when that is a
    module, else a.b)."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                r = resolve(t)
                if r is not None and r != m:
                    graph[m].add(r)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_the_finder_sees_a_circle_through_a_lazy_import():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert len(graph) > 100 and "rag.run.pipeline" in graph and "rag.run.session" in graph["rag.run.pipeline"]
    assert circles(graph) == []


# Every module's layer (docs/explanation/architecture.md, "Layers"): the most specific prefix wins.
LAYERS = {
    # 1. foundations
    "rag.types": 1, "rag.timing": 1, "rag.logs": 1, "rag.endpoint": 1, "rag.config": 1, "rag.store": 1,
    "rag.serving": 1, "rag.embedder.onnx_runtime": 1,
    "eval.metrics": 1, "eval.stats": 1, "eval.record": 1, "experiments.metric_info": 1, "experiments.stats": 1,
    # 2. components
    "rag.corpus": 2, "rag.corpus.loading": 2, "rag.chunker": 2, "rag.embedder": 2, "rag.embedder.npy_writer": 2,
    "rag.index": 2, "rag.retriever.bm25": 2, "rag.retriever.tokens": 2, "rag.retriever.bm25_build": 2,
    "rag.retriever.maxscore": 2, "rag.retriever.fusion": 2, "rag.retriever.routing": 2,
    "rag.retriever.source_filter": 2, "rag.llm": 2, "rag.reranker": 2,
    "rag.compressor": 2, "rag.qa": 2, "rag.context": 2, "eval": 2,
    "rag.reranker.training.passages": 2,
    # 3. artifacts
    "rag.run.artifacts": 3, "rag.retriever": 3, "rag.run.query": 3, "rag.run.latency": 3,
    # 4. the session and the run
    "rag.run": 4, "rag.ask": 4, "rag.corpus.export": 4, "rag.reranker.training": 4,
    "rag.testset": 4,
    # 5. reading runs back; 6. benchmarks
    "experiments": 5,
    "benchmarks": 6,
}
DOC = PROJECT_ROOT / "docs" / "explanation" / "architecture.md"


def layer_prefix(module: str) -> str | None:
    """The most specific entry of LAYERS that holds `module`."""
    while module and module not in LAYERS:
        module = module.rpartition(".")[0]
    return module or None


def layered(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the packages' own roots (rag/__init__.py, ...), which import nothing."""
    assert all(not graph[p] for p in PACKAGES), "a package root imports nothing"
    return {m: {t for t in ts if t not in PACKAGES} for m, ts in graph.items() if m not in PACKAGES}


def back_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, what it reaches into) for each import of a module of a higher layer: the higher
    modules it imports, by the LAYERS entry that places them, named by their common prefix."""
    arrows = set()
    placed = {m: p for m in graph if (p := layer_prefix(m)) is not None}  # the others fail the test above
    for m, targets in graph.items():
        ups: dict[str, list[str]] = {}
        for t in targets:
            if m in placed and t in placed and LAYERS[placed[t]] > LAYERS[placed[m]]:
                ups.setdefault(placed[t], []).append(t)
        for group in ups.values():
            parts = [g.split(".") for g in group]
            common = [p[0] for p in zip(*parts) if len(set(p)) == 1]
            arrows.add((m, ".".join(common)))
    return arrows


def doc_layers() -> tuple[dict[int, str], set[tuple[str, str]]]:
    """The numbered list of the doc's "Layers" section ({layer: its text}) and its back-arrows."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Layers: who may import whom"):]
    section = section[: section.index("\n## ", 3)]
    listed, arrows_part = section.split("### Back-arrows")
    items = {int(m[1]): m[2] for m in re.finditer(r"^(\d)\. (.*?)(?=^\d\. |\Z)", listed, re.M | re.S)}
    arrows = set(re.findall(r"^- `([\w.]+)` -> `([\w.]+)`:", arrows_part, re.M))
    return items, arrows


def path_of(module: str) -> str:
    path = module.replace(".", "/")
    return f"{path}/" if (PROJECT_ROOT / path).is_dir() else f"{path}.py"


def test_the_finder_names_what_a_module_reaches_into_above_it(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "LAYERS", {"a": 1, "b": 2, "b.x": 2, "b.y": 2})
    assert back_arrows({"a": {"b.x.p", "b.x.q"}, "b.x.p": {"a"}, "b.x.q": set()}) == {("a", "b.x")}
    assert back_arrows({"a": {"b.x", "b.y"}, "b.x": set(), "b.y": set()}) == {("a", "b.x"), ("a", "b.y")}


def test_every_module_has_the_layer_the_architecture_page_gives_it():
    graph = layered(import_graph())
    unplaced = sorted(m for m in graph if layer_prefix(m) is None)
    assert not unplaced, f"name these in docs/explanation/architecture.md's layers and in LAYERS: {unplaced}"
    items, _ = doc_layers()
    assert sorted(items) == sorted(set(LAYERS.values()))
    for prefix, layer in LAYERS.items():
        assert f"`{path_of(prefix)}`" in items[layer], f"{path_of(prefix)} is not in layer {layer}'s item"
    for layer, text in items.items():  # and every module or package the page names is in its layer
        for path in re.findall(r"`((?:rag|eval|experiments|benchmarks)/[\w/]*?)(?:\.py|/)?`", text):
            module = path.replace("/", ".")
            if module in graph or any(m.startswith(module + ".") for m in graph):
                assert LAYERS[layer_prefix(module)] == layer, f"{path} is named in layer {layer}"


def test_the_imports_against_the_layers_are_the_ones_the_architecture_page_lists():
    found = back_arrows(layered(import_graph()))
    _, listed = doc_layers()
    assert found == listed, f"found {sorted(found - listed)} not listed; listed {sorted(listed - found)} not found"
    assert len(found) <= 2
