"""The configuration reference's option table is generated from conf/: every option of every
group is on the page with its file's first comment sentence, and the page is what the generator
writes now."""
from __future__ import annotations

import re

import pytest

from rag.config import reference as CR
from rag.config.compose import PROJECT_ROOT
from rag.types import RagError

PAGE = PROJECT_ROOT / "docs" / "reference" / "config.md"


def test_every_option_in_conf_is_a_row_of_the_configuration_reference():
    page = PAGE.read_text(encoding="utf-8")
    rows = CR.page_block(page).splitlines()
    named: set[tuple[str, str]] = set()
    group = ""
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        group = cells[0].strip("`") or group
        named.add((group, re.match(r"`([^`]+)`", cells[1]).group(1)))
    in_conf = {(f.parent.relative_to(CR.CONF).as_posix(), f.stem) for f in CR.CONF.rglob("*.yaml")
               if f.parent != CR.CONF}
    assert sorted(in_conf - named) == [], "run: python -m rag.config.reference --write docs/reference/config.md"
    assert {("reranker", "llm_listwise"), ("reranker", "http"), ("llm", "openvino"), ("qa", "heldout"),
            ("qa", "none"), ("embedder", "minilm_onnx"), ("embedder", "minilm_ray")} <= named


def test_the_page_is_what_the_generator_writes_from_conf():
    assert CR.page_block(PAGE.read_text(encoding="utf-8")) == CR.markdown(), \
        "docs/reference/config.md is stale: python -m rag.config.reference --write docs/reference/config.md"


def test_every_option_file_opens_with_a_comment_that_describes_it():
    undescribed = [f"{o.group}/{o.name}" for o in CR.options() if not o.description]
    assert undescribed == []


def test_the_defaults_of_the_primary_configuration_are_marked():
    defaults = {(o.group, o.name) for o in CR.options() if o.default}
    assert {("corpus", "mixed"), ("llm", "none"), ("reranker", "none"), ("testset", "default"),
            ("hydra/job_logging", "ragrig")} <= defaults
    assert ("llm", "smollm2") in defaults, "conf/testset.yaml overrides llm with smollm2"
    assert ("reranker", "cross_encoder") not in defaults


@pytest.mark.parametrize("comment, first", [
    ("# Keep the retrieval order.\n_target_: x\n", "Keep the retrieval order."),
    ("# @package _global_\n# python run.py -m sweep=alpha\n# A 5-point sweep. Every job reuses the cache.\n",
     "A 5-point sweep."),
    ("# Any chat model: a hub id or a local folder, e.g.\n#   python run.py llm=hf\n# More.\n",
     "Any chat model: a hub id or a local folder."),
    ("# Runs jobs on a cluster:\n#   python run.py -m ...\n", "Runs jobs on a cluster."),
    ("# Uses qa=beir unless qa=... is given, e.g. in a sweep; both are used whole.\n# Second.\n",
     "Uses qa=beir unless qa=... is given, e.g. in a sweep; both are used whole."),
    ("# One line\n# goes on here. Then more.\n", "One line goes on here."),
    ("_target_: x\n", ""),
])
def test_an_options_description_is_the_first_sentence_of_its_opening_comment(comment, first):
    assert CR.description(comment) == first


def test_a_cell_keeps_placeholders_and_stars_as_text():
    assert CR._cell("read by qa.path=<out>, `a<b`, llm.prompt.* | x") == \
        "read by qa.path=&lt;out>, `a<b`, llm.prompt.\\* \\| x"


def test_write_page_replaces_only_the_generated_block(tmp_path):
    conf = tmp_path / "conf"
    (conf / "reranker").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - reranker: none\n  - _self_\n")
    (conf / "reranker" / "none.yaml").write_text("# Keep the retrieval order.\n")
    (conf / "reranker" / "mmr.yaml").write_text("# Maximal marginal relevance.\n")
    page = tmp_path / "config.md"
    page.write_text(f"# Configuration\n\nbefore\n\n{CR.BEGIN}\nstale\n{CR.END}\n\nafter\n")
    assert CR.write_page(page, conf) and not CR.write_page(page, conf)
    text = page.read_text()
    assert text.startswith("# Configuration\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert CR.page_block(text) == ("| group | option | what it is |\n|---|---|---|\n"
                                   "| `reranker` | `mmr` | Maximal marginal relevance. |\n"
                                   "|  | `none` (default) | Keep the retrieval order. |\n")


def test_a_page_without_the_markers_is_one_error_naming_it(tmp_path):
    page = tmp_path / "config.md"
    page.write_text("# Configuration\n")
    with pytest.raises(RagError, match="config.md: no generated block"):
        CR.write_page(page)
    assert CR.main(["--write", str(page)]) == 2
