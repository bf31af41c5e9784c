"""Embedders (config group `embedder`): the sentence-transformer model on torch or ONNX Runtime
(`sentence_transformer`, the ONNX export in `onnx`), and its bulk stage on a Ray cluster
(`ray_data.RayEngine`, the embedder's `engine`)."""
