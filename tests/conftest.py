"""Shared fixtures: a tiny two-source corpus with questions, and Hydra config composition."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rag.config.compose import PROJECT_ROOT, register_resolvers

register_resolvers()

TINY_DOCS = [
    ("man:fcntl.2", "libc", "fcntl - manipulate file descriptor. The original Linux fcntl() system call was not designed "
     "to handle large file offsets in the flock structure. Consequently, an fcntl64() system call was added in Linux 2.4. "
     "The newer system call employs a different structure for file locking, flock64."),
    ("man:mmap.2", "libc", "mmap, munmap - map or unmap files or devices into memory. mmap() creates a new mapping in the "
     "virtual address space of the calling process. The munmap() system call deletes the mappings for the specified "
     "address range."),
    ("man:malloc.3", "libc", "malloc, free - allocate and free dynamic memory. The malloc() function allocates size bytes "
     "and returns a pointer to the allocated memory. The free() function frees the memory space pointed to by ptr."),
    ("man:pipe.2", "libc", "pipe - create pipe. pipe() creates a pipe, a unidirectional data channel that can be used for "
     "interprocess communication. The array pipefd is used to return two file descriptors referring to the ends."),
    ("torch:torch.nn.Module.register_forward_hook", "pytorch", "Register a forward hook on the module. The hook will be "
     "called every time after forward has computed an output. It can modify the output without changing forward."),
    ("torch:torch.optim.AdamW", "pytorch", "Implements AdamW algorithm, Adam with decoupled weight decay: the weight "
     "decay is applied directly to the parameters instead of being added to the gradient."),
    ("pmid:1", "pubmed", "Ciclesonide nasal spray in seasonal allergic rhinitis. At the end point, a greater decrease from "
     "baseline was observed in physician-assessed nasal signs and symptoms for the ciclesonide group than for placebo."),
    ("pmid:2", "pubmed", "Mitochondria in programmed cell death of lace plant leaves. Mitochondrial dynamics change during "
     "developmentally regulated cell death, and cyclosporine A treatment reduced the number of perforations."),
    ("pmid:3", "pubmed", "Statin therapy and cardiovascular outcomes. Patients receiving statins had fewer major "
     "cardiovascular events than those receiving placebo over five years of follow up."),
]
TINY_QA = [
    ("q1", "Why was the fcntl64 system call added?", "Because the original fcntl could not handle large file offsets "
     "in the flock structure, fcntl64 was added in Linux 2.4.", "man:fcntl.2", "libc"),
    ("q2", "How do I release memory obtained from malloc?", "Call free on the pointer that malloc returned.",
     "man:malloc.3", "libc"),
    ("q3", "What is register_forward_hook used for?", "It registers a hook that runs after forward computes an output "
     "and can modify that output.", "torch:torch.nn.Module.register_forward_hook", "pytorch"),
    ("q4", "How does AdamW apply weight decay?", "AdamW decouples weight decay, applying it directly to the parameters "
     "rather than adding it to the gradient.", "torch:torch.optim.AdamW", "pytorch"),
    ("q5", "How did physician-assessed nasal signs change with ciclesonide?", "They decreased more from baseline with "
     "ciclesonide than with placebo.", "pmid:1", "pubmed"),
    ("q6", "Do statins reduce cardiovascular events?", "Yes, patients on statins had fewer major cardiovascular events.",
     "pmid:3", "pubmed"),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def tiny_files(tmp_path: Path) -> dict[str, Path]:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"id": i, "text": t, "source": s} for i, s, t in TINY_DOCS])
    qa = write_jsonl(
        tmp_path / "qa.jsonl",
        [{"id": i, "question": q, "answer": a, "source": s, "corpus": c} for i, q, a, s, c in TINY_QA],
    )
    return {"corpus": corpus, "qa": qa, "cache": tmp_path / "cache", "out": tmp_path / "out"}


# The tests' model artifacts (the embedder's ONNX export) are shared by every test of a session:
# exporting once per test's own cache would cost 10-20 s each.
MODEL_CACHE = Path(tempfile.gettempdir()) / "ragrig-test-model-cache"


def tiny_overrides(files: dict[str, Path]) -> list[str]:
    """The tiny corpus through `debug=tiny` (conf/debug/tiny.yaml: JSONL corpus and questions used
    whole, no progress bars, 200 bootstrap resamples), with small chunks so that each document
    gives several."""
    return [
        "debug=tiny",
        f"paths.model_cache={MODEL_CACHE}",
        f"corpus.path={files['corpus']}",
        f"qa.path={files['qa']}",
        f"paths.cache={files['cache']}",
        "chunker.chunk_size=120",
        "chunker.chunk_overlap=20",
    ]


@pytest.fixture
def compose_cfg():
    def _compose(overrides: list[str]):
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)

    return _compose
