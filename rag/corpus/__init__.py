"""Corpus readers: each turns one kind of source into a deterministic list of Documents.

Build one with `hydra.utils.instantiate` (e.g. `_target_: rag.corpus.PubMedQACorpus`), then call
`load()`; `fingerprint()` is the cache key for what `load()` returns.
"""
from rag.corpus.base import Corpus
from rag.corpus.beir import BeirCorpus
from rag.corpus.jsonl import JsonlCorpus
from rag.corpus.libc import LibcManCorpus
from rag.corpus.medline import MedlineCorpus
from rag.corpus.mixed import MixedCorpus
from rag.corpus.pubmedqa import PubMedQACorpus
from rag.corpus.pytorch import PyTorchCorpus

__all__ = [
    "BeirCorpus",
    "Corpus",
    "JsonlCorpus",
    "LibcManCorpus",
    "MedlineCorpus",
    "MixedCorpus",
    "PubMedQACorpus",
    "PyTorchCorpus",
]
