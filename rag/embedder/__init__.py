"""Embedders (config group `embedder`), each a `base.Embedder`: the sentence-transformer model on
torch or ONNX Runtime (`sentence_transformer`, the ONNX export in `onnx`) and its bulk stage on a
Ray cluster (`ray_data.RayEngine`, the embedder's `engine`), a served model (`openai`), and
vectors made elsewhere (`precomputed`)."""
