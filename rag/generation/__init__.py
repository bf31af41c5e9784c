"""Answer generators: `generate(questions, contexts) -> list[str] | None`."""
from rag.generation.base import Generator, NoGenerator

__all__ = ["Generator", "NoGenerator"]
