"""Answer generators: `generate(questions, contexts) -> list[str] | None`."""
from rag.llm.base import Generator, NoGenerator
from rag.llm.extractive import ExtractiveGenerator
from rag.llm.hf import HFGenerator
from rag.llm.openai import OpenAIGenerator
from rag.llm.prompt import PromptBuilder

__all__ = ["ExtractiveGenerator", "Generator", "HFGenerator", "NoGenerator", "OpenAIGenerator", "PromptBuilder"]
