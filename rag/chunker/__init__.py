"""Chunkers: `split(doc) -> list[Chunk]`, each built from keyword arguments (Hydra `_target_`)."""
from rag.chunker.base import BaseChunker, Chunker, paragraph_spans, sentence_spans
from rag.chunker.paragraph import ParagraphChunker
from rag.chunker.recursive import RecursiveChunker
from rag.chunker.router import RoutedChunker
from rag.chunker.semantic import SemanticChunker
from rag.chunker.sentence import SentenceChunker
from rag.chunker.sliding_window import SlidingWindowChunker
from rag.chunker.token import TokenChunker

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
