"""What the LLM is asked to write a question, per kind, and how its reply is read.

A question is written in one request and answered in a second (rag/testset/generate.py): a model
as small as the packaged SmolLM2-135M writes a usable question from a few-shot prompt, but asked
for the question and its answer in one reply it mostly echoes the prompt ("What is the answer to
this question?"); measured on examples/toy, docs/how-to/testset.md. The answer comes from the
generator's own prompt (`llm.prompt`), as in a run.

Each kind has its own few-shot prompt: passages and a question they answer. The examples were
written for this purpose, on subjects far from any shipped corpus, so that a question copied from
them is recognisable (and dropped). The prompt is completion-shaped, like the reranker's training
questions (rag/reranker/training/generated.py): it ends with the new passage and "Question:".
"""
from __future__ import annotations

import hashlib
import re

from rag.llm.prompt import PromptBuilder
from rag.reranker.training.generated import clean_question

FACTOID = "factoid"
HOW_WHY = "how_why"
TWO_PASSAGE = "two_passage"
KINDS = (FACTOID, HOW_WHY, TWO_PASSAGE)

INSTRUCTIONS = {
    FACTOID: "Write a question that a user might ask, which the passage answers.",
    HOW_WHY: "Write a question that a user might ask, which the passage answers: how to do something, or why.",
    TWO_PASSAGE: "Write a question that a user might ask, which the two paragraphs of the passage answer together.",
}

# (passages, question) per kind
EXAMPLES: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    FACTOID: (
        (("Backups of the mail server run every night at 02:00 and are kept for 30 days. A restore takes about an "
          "hour and is requested through the help desk.",), "How long are the mail server backups kept?"),
        (("The library lends up to twelve books at a time. Loans last three weeks and can be renewed twice online, "
          "unless another reader has reserved the book.",), "How many books can I borrow from the library at once?"),
        (("The observatory's main telescope has a mirror 2.4 metres across. It was installed in 1987 and is used on "
          "about 250 clear nights a year.",), "In which year was the observatory's main telescope installed?"),
    ),
    HOW_WHY: (
        (("Ice forms first at the edges of a lake because the shallow water there cools faster than the deep "
          "water in the middle, which keeps releasing stored heat.",), "Why does a lake freeze at its edges first?"),
        (("Cast iron pans rust when they are left wet. Dry the pan on the stove after washing it and rub a thin "
          "layer of oil into it while it is still warm.",), "How can I keep a cast iron pan from rusting?"),
        (("To reset the router, hold the recessed button on the back for ten seconds with a paper clip until the "
          "lights blink. The settings return to the factory defaults printed on the label.",),
         "How do I reset the router to its factory settings?"),
    ),
    TWO_PASSAGE: (
        (("The night train to Vienna leaves the central station at 21:40 from platform 4.",
          "Passengers with a sleeper ticket may board the train thirty minutes before it departs."),
         "When and where can a sleeper passenger board the night train to Vienna?"),
        (("The community pool is open from 7:00 to 20:00 on weekdays.",
          "On Wednesdays the pool closes to the public at 17:00 for swimming club training."),
         "Until what time can the public swim at the community pool on a Wednesday?"),
        (("Form A-12 requests a parking permit for residents of the old town.",
          "Permit requests are handled by the town hall's mobility office within ten working days."),
         "Who handles a resident's parking permit request, and how long does it take?"),
    ),
}
EXAMPLE_QUESTIONS = frozenset(q for examples in EXAMPLES.values() for _, q in examples)


def _passages(texts: tuple[str, ...]) -> str:
    return "Passage: " + "\n\n".join(texts)


def template(kind: str) -> str:
    """The user message of `kind` as an `llm.prompt.template` ({contexts}: the new passages)."""
    shots = "".join(f"{_passages(p)}\nQuestion: {q}\n\n" for p, q in EXAMPLES[kind])
    shots = shots.replace("{", "{{").replace("}", "}}")  # literal braces, not placeholders
    return f"{INSTRUCTIONS[kind]}\n\n{shots}Passage: {{contexts}}\nQuestion:{{question}}"


def prompt_builder(kind: str) -> PromptBuilder:
    """The generator's prompt for `kind`, the passages laid out as in the examples."""
    return PromptBuilder(template=template(kind), context_format="{text}")


def digest(system_prompt: str | None, user: str) -> str:
    """What provenance names a prompt by: the sha256 of the exact messages, cut to 16 digits."""
    return hashlib.sha256(f"{system_prompt or ''}\0{user}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


def parse_question(reply: str | None) -> str | None:
    """The question of a reply, or None when it is none: its first line must end with a question
    mark and hold 4 to 30 words (the reranker's rule, `clean_question`), and it may not be one of
    the examples' questions."""
    question = clean_question(reply or "")
    return None if question is None or question in EXAMPLE_QUESTIONS else question


# "The answer to the question is: 15 minutes." -> "15 minutes." (small models open answers so)
_ANSWER_LEAD = re.compile(r"^(?:answer:|the answer(?: to (?:the|this) question)? is:?)\s*", re.I)


def clean_answer(reply: str | None) -> str:
    """The answer of a reply, whitespace collapsed, without a lead-in that says it is an answer."""
    return _ANSWER_LEAD.sub("", " ".join((reply or "").split()))
