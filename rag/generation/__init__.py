"""Answer generators: `generate(questions, contexts) -> list[str] | None`."""
from rag.generation.base import Generator, NoGenerator
from rag.generation.extractive import ExtractiveGenerator
from rag.generation.hf import HFGenerator
from rag.generation.openai import OpenAIGenerator
from rag.generation.prompt import PromptBuilder

__all__ = ["ExtractiveGenerator", "Generator", "HFGenerator", "NoGenerator", "OpenAIGenerator", "PromptBuilder"]
