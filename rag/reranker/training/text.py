"""Text helpers of the training-data builders: sentences, markup, passages, query matching."""
from __future__ import annotations

import re

MAX_PASSAGE_CHARS = 600

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_RST_ROLE = re.compile(r":[\w:.+-]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`")


def sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    return [s for s in _SENTENCE_END.split(text) if s]


def clean_markup(text: str) -> str:
    """Sphinx roles and literals to their text (":func:`~torch.cos`" -> "torch.cos")."""
    text = _RST_ROLE.sub(lambda m: m.group(1), text)
    text = _RST_LITERAL.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return " ".join(text.split())


def norm(text: str) -> str:
    return " ".join(text.lower().split())


def remove_query(passage: str, *queries: str) -> str:
    """Cut every literal (case-insensitive, whitespace-tolerant) occurrence of a query out."""
    for q in queries:
        words = q.split()
        if len(words) < 2:
            continue
        pattern = r"\s+".join(re.escape(w) for w in words)
        passage = re.sub(pattern, " ", passage, flags=re.I)
    return passage.strip()


def contains_query(passage: str, query: str) -> bool:
    """Whether the passage holds the query, as written or with its markup resolved."""
    q = norm(query)
    return q in norm(passage) or q in norm(clean_markup(passage))


def cut_words(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    return cut[:space] if space > max_chars // 2 else cut


def _units(text: str, max_chars: int) -> list[str]:
    """Paragraphs, or the sentences (then word-cut pieces) of paragraphs longer than max_chars."""
    units: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip("\n")
        if not para.strip():
            continue
        if len(para) <= max_chars:
            units.append(para)
            continue
        for sent in sentences(para):
            while len(sent) > max_chars:
                piece = cut_words(sent, max_chars)
                units.append(piece)
                sent = sent[len(piece):].strip()
            if sent:
                units.append(sent)
    return units


def split_passages(text: str, target: int, max_chars: int = MAX_PASSAGE_CHARS) -> list[str]:
    """Greedy packing of paragraphs (then sentences, then words) into passages of about `target`
    characters, at most `max_chars`, whitespace kept as in the text inside a paragraph."""
    passages: list[str] = []
    cur = ""
    for u in _units(text, max_chars):
        if cur and len(cur) + 2 + len(u) > max_chars:
            passages.append(cur)
            cur = ""
        cur = f"{cur}\n\n{u}" if cur else u
        if len(cur) >= target:
            passages.append(cur)
            cur = ""
    if cur:
        if passages and len(cur) < target // 3 and len(passages[-1]) + 2 + len(cur) <= max_chars:
            passages[-1] = f"{passages[-1]}\n\n{cur}"
        else:
            passages.append(cur)
    return passages


def first_passage(text: str, target: int) -> str:
    parts = split_passages(text, target)
    return parts[0] if parts else ""


def is_prose(sentence: str) -> bool:
    """Not code, an example or a table row: mostly letters and spaces."""
    if sentence.lstrip().startswith((">>>", "#", "..", "...", "$", "{", "}")):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in sentence)
    return letters >= 0.85 * len(sentence)


def ok_query(q: str, min_words: int = 2, max_words: int = 40) -> bool:
    n = len(q.split())
    return min_words <= n <= max_words and any(c.isalpha() for c in q)
