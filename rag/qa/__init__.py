"""Question sets (config group conf/qa/): `load() -> list[QAItem]` (the split's part) and
`fingerprint()`, on the base class and split of rag/qa/base.py."""
from rag.corpus.beir import BeirQuestions
from rag.qa.base import NoQuestions, QuestionSet, QuestionSplit, parse_relevant, split_hash
from rag.qa.jsonl import JsonlQuestions
from rag.qa.mixed import MixedQuestions
from rag.qa.pubmedqa import PubMedQAQuestions

__all__ = ["BeirQuestions", "JsonlQuestions", "MixedQuestions", "NoQuestions", "PubMedQAQuestions", "QuestionSet",
           "QuestionSplit", "parse_relevant", "split_hash"]
