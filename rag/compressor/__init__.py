from rag.compressor.base import Compressed, Compressor, NoCompressor
from rag.compressor.embedding import EmbeddingCompressor
from rag.compressor.llm import LLMCompressor

__all__ = ["Compressed", "Compressor", "NoCompressor", "EmbeddingCompressor", "LLMCompressor"]
