"""Fine-tuning: plain PyTorch on the cross-encoder's logit (the `datasets` package that
CrossEncoderTrainer needs is not installed), on CPU or CUDA with the same code.

Loss: binary cross-entropy on the logit and/or a listwise term (softmax cross-entropy of each
query's positive against its own negatives, batches made of whole queries). AdamW with a 10x
learning rate on the new head, linear warmup and decay, dynamic padding, token embeddings (and
optionally lower layers) frozen, dropout off and bf16 autocast where the hardware computes bf16
natively (each roughly halves a CPU step).
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rag.store.models import resolve_model
from rag.reranker.training.examples import Group, Pair
from rag.types import RagError

log = logging.getLogger(__name__)

Batch = list[list[Pair]]  # units: single pairs (bce), or a query's positive then its negatives


def set_threads(n: int) -> None:
    import torch

    if n > 0:
        torch.set_num_threads(n)


def load_base_model(base_model: str, max_length: int, seed: int, device: str = "cpu",
                    layers: int | None = None) -> Any:
    """The base model as a CrossEncoder with a fresh one-logit head (seeded), cut to its first
    `layers` transformer layers when given (the saved config says so, so it loads as it trained)."""
    import torch
    from sentence_transformers import CrossEncoder

    path = resolve_model(base_model, "reranker base").path
    torch.manual_seed(seed)
    logging.getLogger("transformers").setLevel(logging.ERROR)  # the "newly initialized head" report
    # sentence-transformers warns that it turns an embedding model into a cross-encoder: that is
    # the point here, and a warning would reach the terminal of every run that trains
    st_log = logging.getLogger("sentence_transformers.base.model")
    level = st_log.level
    st_log.setLevel(logging.ERROR)
    try:
        model = CrossEncoder(path, num_labels=1, max_length=max_length, device=device)
    except OSError as e:
        raise RagError(f"reranker base model {base_model!r} could not be loaded: {str(e).splitlines()[0]}") from e
    finally:
        st_log.setLevel(level)
    if layers is not None:
        truncate(model, layers, base_model)
    return model


def truncate(model: Any, layers: int, name: str) -> None:
    hf = model.model
    encoder = getattr(hf, hf.base_model_prefix, hf).encoder
    have = len(encoder.layer)
    if not 1 <= layers <= have:
        raise RagError(f"reranker.train.layers must be between 1 and {have} (the layers of {name}), got {layers}")
    encoder.layer = encoder.layer[:layers]
    hf.config.num_hidden_layers = layers


def freeze(model: Any, embeddings: bool, n_layers: int) -> None:
    hf = model.model
    base = getattr(hf, hf.base_model_prefix, hf)
    if embeddings or n_layers > 0:
        for p in base.embeddings.parameters():
            p.requires_grad_(False)
    for layer in base.encoder.layer[:n_layers]:
        for p in layer.parameters():
            p.requires_grad_(False)


def bf16_ok(device: str) -> bool:
    """Whether the device computes bf16 natively (emulated bf16 is slower than fp32)."""
    import torch

    try:
        if device.startswith("cuda"):
            return bool(torch.cuda.is_bf16_supported())
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def use_bf16(precision: str, device: str) -> bool:
    """Whether `precision` asks for bf16 autocast and the device computes it natively (training,
    its validation and reranking decide alike)."""
    return precision == "bf16" and bf16_ok(device)


def batches(groups: Sequence[Group], batch_size: int, listwise: bool, rng: random.Random) -> list[Batch]:
    """One epoch of batches of about batch_size pairs."""
    units = [g.pairs() for g in groups] if listwise else [[pair] for g in groups for pair in g.pairs()]
    rng.shuffle(units)
    out: list[Batch] = []
    cur: Batch = []
    n = 0
    for u in units:
        cur.append(u)
        n += len(u)
        if n >= batch_size:
            out.append(cur)
            cur, n = [], 0
    return out + ([cur] if cur else [])


def optimizer(model: Any, s: Mapping[str, Any]) -> Any:
    import torch

    hf = model.model
    params = [(n, p) for n, p in hf.named_parameters() if p.requires_grad]
    is_head = lambda n: n.startswith(("classifier.", "score.", "pre_classifier."))  # noqa: E731
    return torch.optim.AdamW([
        {"params": [p for n, p in params if not is_head(n) and p.ndim > 1], "lr": s["lr"], "weight_decay": s["weight_decay"]},
        {"params": [p for n, p in params if not is_head(n) and p.ndim <= 1], "lr": s["lr"], "weight_decay": 0.0},
        {"params": [p for n, p in params if is_head(n)], "lr": s["head_lr"], "weight_decay": 0.0},
    ])


def batch_loss(model: Any, batch: Batch, loss: str, device: str, bf16: bool) -> Any:
    import torch

    flat = [pair for unit in batch for pair in unit]
    features = model.preprocess([(q, p) for q, p, _ in flat])
    features = {k: v.to(device) if hasattr(v, "to") else v for k, v in features.items()}
    with torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(features)["scores"].reshape(-1).float()
    total = torch.zeros((), device=logits.device)
    if "listwise" in loss:  # each unit: its positive (first) against its negatives
        sizes = [len(unit) for unit in batch]
        grid = torch.full((len(batch), max(sizes)), float("-inf"), device=logits.device)
        at = 0
        for i, n in enumerate(sizes):
            grid[i, :n] = logits[at : at + n]
            at += n
        total = total + torch.nn.functional.cross_entropy(grid, torch.zeros(len(batch), dtype=torch.long, device=logits.device))
    if "bce" in loss:
        labels = torch.tensor([lab for _, _, lab in flat], dtype=torch.float32, device=logits.device)
        total = total + torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return total


def fit(model: Any, groups: Sequence[Group], s: Mapping[str, Any],
        progress: Callable[[str], None] | None = None, bar: bool = False) -> dict[str, Any]:
    """Trains `model` in place on the groups; returns statistics. `progress` gets a line every 25
    steps; `bar` shows a progress bar too."""
    import torch

    seed, device = int(s["seed"]), str(s["device"])
    torch.manual_seed(seed)
    rng = random.Random(seed + 1)
    freeze(model, bool(s["freeze_embeddings"]), int(s["freeze_layers"]))
    bf16 = use_bf16(s["precision"], device)
    if s["precision"] == "bf16" and not bf16:
        log.warning("reranker training: %s has no native bf16; training in fp32", device)
    opt = optimizer(model, s)
    listwise = s["loss"] != "bce"
    epochs = [batches(groups, int(s["batch_size"]), listwise, rng) for _ in range(int(s["epochs"]))]
    total = sum(len(e) for e in epochs)
    warmup = int(total * s["warmup_ratio"])
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: (step + 1) / max(1, warmup) if step < warmup else max(0.0, (total - step) / max(1, total - warmup))
    )
    # Dropout stays off (eval mode): on CPU it costs almost as much as the forward pass itself,
    # and a few epochs over a few thousand pairs hardly overfit.
    model.eval()
    t0 = time.perf_counter()
    step, losses, epoch_loss = 0, [], []
    trainable = [p for g in opt.param_groups for p in g["params"]]
    steps = tqdm(total=total, desc="training the cross-encoder reranker (once, then cached)", unit="step",
                 disable=not bar, leave=False)
    for epoch, epoch_batches in enumerate(epochs):
        run = []
        for batch in epoch_batches:
            loss = batch_loss(model, batch, s["loss"], device, bf16)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            run.append(loss.item())
            step += 1
            steps.update()
            if progress and (step % 25 == 0 or step == total):
                el = time.perf_counter() - t0
                progress(f"step {step}/{total} epoch {epoch + 1} loss {np.mean(run[-25:]):.4f} "
                         f"{el:.0f}s elapsed, ~{el / step * (total - step):.0f}s left")
        losses += run
        epoch_loss.append(round(float(np.mean(run)), 4) if run else None)
    steps.close()
    return {
        "steps": step,
        "bf16": bf16,
        "device": device,
        "epoch_loss": epoch_loss,
        "final_loss_last50": round(float(np.mean(losses[-50:])), 4) if losses else None,
        "train_seconds": round(time.perf_counter() - t0, 1),
    }
