"""Chunkers: `split(doc) -> list[Chunk]`, each built from keyword arguments (Hydra `_target_`)."""
from rag.chunking.base import BaseChunker, Chunker, paragraph_spans, sentence_spans
from rag.chunking.paragraph import ParagraphChunker
from rag.chunking.recursive import RecursiveChunker
from rag.chunking.router import RoutedChunker
from rag.chunking.semantic import SemanticChunker
from rag.chunking.sentence import SentenceChunker
from rag.chunking.sliding_window import SlidingWindowChunker
from rag.chunking.token import TokenChunker

__all__ = [
    "BaseChunker",
    "Chunker",
    "ParagraphChunker",
    "RecursiveChunker",
    "RoutedChunker",
    "SemanticChunker",
    "SentenceChunker",
    "SlidingWindowChunker",
    "TokenChunker",
    "paragraph_spans",
    "sentence_spans",
]
