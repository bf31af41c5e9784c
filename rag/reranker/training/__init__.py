"""Training the cross-encoder reranker (see docs/cross_encoder.md)."""
