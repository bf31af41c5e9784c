"""Training the cross-encoder reranker (see docs/explanation/cross_encoder.md)."""
