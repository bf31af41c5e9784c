"""A cross-encoder's raw relevance logits: the one scoring call shared by the reranker, its ONNX
export's check and training's validation, below all three so that none imports another."""
from __future__ import annotations

from typing import Any

import numpy as np


def predict_logits(model: Any, pairs: list[tuple[str, str]], batch_size: int, bf16: bool = False) -> np.ndarray:
    """A CrossEncoder's raw relevance logits for (query, passage) pairs, one per pair (no sigmoid:
    it would saturate and tie the best candidates; a multi-label model's last logit is taken as
    "relevant"), under bf16 autocast when `bf16`."""
    if not pairs:
        return np.zeros(0, np.float32)
    import torch

    device_type = "cuda" if str(getattr(model, "device", "cpu")).startswith("cuda") else "cpu"
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        scores = model.predict(pairs, batch_size=batch_size, show_progress_bar=False,
                               activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    scores = np.asarray(scores, np.float32)
    if scores.ndim > 1:
        scores = scores[:, -1]
    return scores.reshape(-1)
