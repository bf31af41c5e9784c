"""MEDLINE reading: `corpus=medline` over a baseline-shaped set of generated `.xml.gz` files
matched by a glob, as NCBI distributes PubMed (about 1,200 files of 30,000 articles each).

Each article has a title, a structured abstract of about 1,500 characters (four labelled
sections), a journal, a year and MeSH headings, written in the baseline's XML layout and gzipped
as NCBI's files are. The reader (rag.corpus.medline) runs in a fresh process: articles a second,
compressed and uncompressed MB a second, and the peak RSS (VmHWM) against the process's size
before reading, which grows with the documents read (they are returned as a list) and not with
the size of any one file, since each article is dropped from the XML tree once parsed.
"""
from __future__ import annotations

import gzip
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    environment,
    finish,
    mb,
    proc_mem,
    reset_peak,
    row,
    run_case,
    run_mode,
    scratch_dir,
    start,
)

WORDS = ("patients", "treatment", "cohort", "randomized", "placebo", "outcome", "risk", "ratio", "clinical", "trial",
         "mortality", "incidence", "baseline", "follow-up", "significant", "reduced", "increased", "dose", "therapy",
         "analysis", "association", "adjusted", "confidence", "interval", "years", "median", "months", "controls",
         "exposure", "disease", "protein", "expression", "cells", "mice", "receptor", "pathway", "levels", "serum")
MESH = ("Humans", "Female", "Male", "Adult", "Middle Aged", "Aged", "Risk Factors", "Treatment Outcome",
        "Retrospective Studies", "Prospective Studies", "Animals", "Mice", "Cohort Studies", "Prognosis")
LABELS = ("BACKGROUND", "METHODS", "RESULTS", "CONCLUSIONS")


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def article_xml(pmid: int, rng: random.Random) -> str:
    sections = "".join(
        f'<AbstractText Label="{label}" NlmCategory="{label}">{" ".join(_sentence(rng, 12) for _ in range(4))}'
        "</AbstractText>" for label in LABELS)
    meshes = "".join(f'<MeshHeading><DescriptorName UI="D{i:06d}" MajorTopicYN="N">{m}</DescriptorName></MeshHeading>'
                     for i, m in enumerate(rng.sample(MESH, 6)))
    return (f'<PubmedArticle><MedlineCitation Status="MEDLINE" Owner="NLM"><PMID Version="1">{pmid}</PMID>'
            f'<Article PubModel="Print"><Journal><JournalIssue CitedMedium="Print"><PubDate><Year>{2000 + pmid % 25}'
            f"</Year></PubDate></JournalIssue><Title>Journal of {rng.choice(WORDS).capitalize()} Research</Title>"
            f"</Journal><ArticleTitle>{_sentence(rng, 10)}</ArticleTitle><Abstract>{sections}</Abstract></Article>"
            f"<MeshHeadingList>{meshes}</MeshHeadingList></MedlineCitation></PubmedArticle>\n")


def write_baseline(folder: Path, n_files: int, per_file: int, seed: int = 0) -> list[Path]:
    """`pubmed25nNNNN.xml.gz` files of consecutive PMIDs; returns them in order."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for f in range(n_files):
        path = folder / f"pubmed25n{f + 1:04d}.xml.gz"
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as out:
            out.write('<?xml version="1.0" encoding="utf-8"?>\n<PubmedArticleSet>\n')
            for i in range(per_file):
                out.write(article_xml(f * per_file + i + 1, rng))
            out.write("</PubmedArticleSet>\n")
        files.append(path)
    return files


def read_case(pattern: str) -> dict[str, Any]:
    """Reads every file `pattern` matches through MedlineCorpus (run in a fresh process)."""
    from rag.corpus.medline import MedlineCorpus

    before = proc_mem()
    reset_peak()
    corpus = MedlineCorpus(paths=[pattern])
    t0 = time.perf_counter()
    docs = corpus.load()
    seconds = time.perf_counter() - t0
    after = proc_mem()
    files = corpus.paths
    compressed = sum(p.stat().st_size for p in files)
    uncompressed = 0
    for p in files:
        with gzip.open(p) as f:
            while chunk := f.read(1 << 24):
                uncompressed += len(chunk)
    return {"files": len(files), "articles": len(docs), "seconds": round(seconds, 2),
            "articles_per_s": round(len(docs) / seconds, 1), "compressed_mb": mb(compressed),
            "uncompressed_mb": mb(uncompressed), "uncompressed_mb_per_s": round(uncompressed / 2**20 / seconds, 2),
            "text_mb": mb(sum(len(d.text.encode()) for d in docs)),
            "rss_before_mb": mb(before.get("VmRSS", 0)), "peak_rss_mb": mb(after.get("VmHWM", 0))}


def bench_medline(quick: bool = True, full: bool = False, tiny: bool = False) -> dict[str, Any]:
    """Reading a baseline-shaped set of MEDLINE .xml.gz files by glob: articles/s, MB/s, peak RSS."""
    clock = start()
    n_files, per_file = {"tiny": (2, 200), "quick": (4, 5_000), "full": (4, 30_000)}[run_mode(tiny, full)]
    with scratch_dir("medline") as tmp:
        t0 = time.perf_counter()
        write_baseline(tmp / "baseline", n_files, per_file)
        generate_s = round(time.perf_counter() - t0, 1)
        pattern = str(tmp / "baseline" / "pubmed25n*.xml.gz")
        res = read_case(pattern) if tiny else run_case("benchmarks.medline", "read_case", {"pattern": pattern})
    if "error" in res:
        table = [row(f"medline @ {n_files} x {per_file:,}", "failed", "", res["error"][:300])]
    else:
        table = [
            row(f"**articles read a second** ({n_files} files x {per_file:,} articles, by glob)", res["articles_per_s"],
                "articles/s", f"{res['articles']:,} articles in {res['seconds']} s; one core (the parser is Python's "
                              "expat through iterparse)"),
            row("uncompressed XML read a second", res["uncompressed_mb_per_s"], "MB/s",
                f"{res['uncompressed_mb']} MB of XML ({res['compressed_mb']} MB gzipped) -> {res['text_mb']} MB of text"),
            row("peak RSS while reading", res["peak_rss_mb"], "MiB", f"{res['rss_before_mb']} MiB before"),
        ]
    return finish({**res, "n_files": n_files, "per_file": per_file, "generate_s": generate_s, "table": table,
                   "environment": environment()}, clock)
