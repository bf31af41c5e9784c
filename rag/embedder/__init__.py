"""Embedders (config group `embedder`): the sentence-transformer model on torch or ONNX Runtime
(`sentence_transformer`), and its bulk stage on a Ray cluster (`ray_data`)."""
