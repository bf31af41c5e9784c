"""Contexts for the LLM: source labels (metadata mapping) and neighbour expansion."""
import pytest

from rag.store.chunk_set import ChunkSet
from rag.context import ContextBuilder, merge_chunks, source_label
from rag.types import Document, Hits, RagError, make_chunk

DOC = Document("man:fcntl.2", "AAAA BBBB CCCC DDDD EEEE", "libc")
OTHER = Document("pmid:17304887", "The ciclesonide group improved more than placebo.", "pubmed")
# Five 4-character chunks of DOC (positions 0..4), then OTHER as one chunk.
CHUNKS = [make_chunk(DOC, 5 * i, 5 * i + 4, i) for i in range(5)] + [make_chunk(OTHER, 0, len(OTHER.text), 0)]
CHUNK_SET = ChunkSet("k", CHUNKS)


@pytest.mark.parametrize("doc_id,label", [
    ("pmid:17304887", "PubMed PMID 17304887"),
    ("man:fcntl.2", "man page fcntl(2)"),
    ("man:stat.3type", "man page stat(3type)"),
    ("torch:torch.nn.Module.register_forward_hook", "PyTorch torch.nn.Module.register_forward_hook"),
    ("torchdoc:notes/modules.rst", "PyTorch docs notes/modules.rst"),
    ("my-own-id", "my-own-id"),
])
def test_source_labels(doc_id, label):
    assert source_label(doc_id) == label


def test_without_expansion_each_hit_is_one_passage_in_rank_order():
    hits = Hits.from_rows([[(5, 1.0), (2, 0.5)]], 2)
    ctx = ContextBuilder().build(hits, CHUNK_SET)[0]
    assert [c.text for c in ctx] == [OTHER.text, "CCCC"]
    assert all(c.label is None for c in ctx)


def test_labels_are_attached_when_enabled():
    hits = Hits.from_rows([[(5, 1.0), (2, 0.5)]], 2)
    ctx = ContextBuilder(labels=True).build(hits, CHUNK_SET)[0]
    assert [c.label for c in ctx] == ["PubMed PMID 17304887", "man page fcntl(2)"]


def test_expansion_adds_neighbours_and_merges_by_offsets():
    hits = Hits.from_rows([[(2, 1.0)]], 1)
    ctx = ContextBuilder(expand_neighbors=1).build(hits, CHUNK_SET)[0]
    assert len(ctx) == 1
    assert ctx[0].text == "BBBB CCCC DDDD"  # the document's own text between the chunks
    assert sorted(ctx[0].chunk_rows) == [1, 2, 3]


def test_expansion_stops_at_document_ends():
    ctx = ContextBuilder(expand_neighbors=2).build(Hits.from_rows([[(0, 1.0)]], 1), CHUNK_SET)[0]
    assert ctx[0].text == "AAAA BBBB CCCC"


def test_expansion_respects_the_budget():
    # 4 chars retrieved + 4 per neighbour: a budget of 10 leaves room for one neighbour only.
    ctx = ContextBuilder(expand_neighbors=1, budget_chars=10).build(Hits.from_rows([[(2, 1.0)]], 1), CHUNK_SET)[0]
    assert ctx[0].text in ("BBBB CCCC", "CCCC DDDD")


def test_two_hits_of_one_document_share_a_passage_with_a_gap_marker():
    ctx = ContextBuilder().build(Hits.from_rows([[(0, 1.0), (3, 0.9)]], 2), CHUNK_SET)[0]
    assert len(ctx) == 1 and ctx[0].text == "AAAA … DDDD"


def test_merge_chunks_handles_overlap_and_containment():
    doc = Document("d", "0123456789", "x")
    merged = merge_chunks([make_chunk(doc, 4, 9, 1), make_chunk(doc, 0, 6, 0), make_chunk(doc, 5, 7, 2)])
    assert merged == "012345678"


def test_bad_settings_are_rejected():
    with pytest.raises(RagError, match="expand_neighbors"):
        ContextBuilder(expand_neighbors=-1)
    with pytest.raises(RagError, match="budget_chars"):
        ContextBuilder(budget_chars=0)
