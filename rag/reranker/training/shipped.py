"""The trained cross-encoder that ships with the repository (models/cross_encoder/).

Training the default recipe takes 3 to 4 minutes on 2 CPU cores, most of a first demo's wait. The
repository carries its result instead: every tensor that training changed (`trained_layers.
safetensors`; the frozen token embeddings are left out, they are the packaged MiniLM's), the small
files of the model folder (config, tokenizer, reranker.json, train_metrics.json) and `shipped.json`
with the training key, the base model's checksum, and the checksum of every file of the folder as
training wrote it.

`restore(key, out_dir)` rebuilds that folder when `key` (rag.reranker.training.artifact: base model,
every weight-changing setting, the training data's content) is the shipped one and the base model
is the one it was trained from, and checks each rebuilt file against its recorded checksum, so the
cross_encoder artifact it becomes is byte for byte the folder training wrote. Any other key, or
any mismatch, returns False and the caller trains as before.

`python -m rag.reranker.training.shipped ARTIFACT_DIR` writes models/cross_encoder/ from a trained
artifact (what a maintainer runs after changing the recipe; the model card is written by hand), with
`fitted_on.json`: the corpora the model learnt from, by name, content fingerprint and document
count (rag/run/fitted.py), beside the model rather than in it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rag.store.atomic import umask_mode
from rag.store.cache import file_sha256
from rag.config.compose import PROJECT_ROOT

log = logging.getLogger(__name__)

SHIPPED_DIR = PROJECT_ROOT / "models" / "cross_encoder"
MANIFEST = "shipped.json"
LAYERS = "trained_layers.safetensors"
WEIGHTS = "model.safetensors"
FITTED_ON = "fitted_on.json"  # the corpora the shipped model learnt from (rag/run/fitted.py)




def _base_weights(base_model: str) -> tuple[Path, str]:
    from rag.store.models import resolve_model

    path = Path(resolve_model(base_model, "reranker base").path) / WEIGHTS
    return path, file_sha256(path)


def _base_name(name: str, base: dict[str, Any]) -> str | None:
    """The base model's tensor that a cross-encoder tensor was initialized from: the same name,
    or the same name below the model's prefix (`bert.embeddings.x` <- `embeddings.x`)."""
    if name in base:
        return name
    tail = name.partition(".")[2]
    return tail if tail in base else None


def ship(artifact_dir: Path, key: str, base_model: str, out: Path = SHIPPED_DIR,
         fitted_on: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Writes `out` from a trained model folder: the tensors that differ from the base model's,
    the other files as they are, the manifest and, given the artifact's record of what it learnt
    from (`fitted_on`), that record by name, fingerprint and count."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    artifact_dir = Path(artifact_dir)
    base_path, base_sha = _base_weights(base_model)
    base = load_file(str(base_path))
    trained = load_file(str(artifact_dir / WEIGHTS))
    with safe_open(str(artifact_dir / WEIGHTS), "pt") as f:
        metadata = f.metadata()
    from_base: dict[str, str] = {}
    layers: dict[str, Any] = {}
    for name, tensor in trained.items():
        source = _base_name(name, base)
        if source is not None and base[source].dtype == tensor.dtype and torch.equal(base[source], tensor):
            from_base[name] = source
        else:
            layers[name] = tensor.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(layers, str(out / LAYERS), metadata={"format": "pt"})
    os.chmod(out / LAYERS, umask_mode())  # safetensors writes 0600; a shipped file is for everyone
    files = {}
    for f in sorted(artifact_dir.iterdir()):
        if f.is_file() and f.name not in ("manifest.json",):
            files[f.name] = file_sha256(f)
            if f.name != WEIGHTS:
                shutil.copyfile(f, out / f.name)
    manifest = {
        "key": key,
        "base_model": base_model,
        "base_sha256": base_sha,
        "files": files,
        "weights_metadata": metadata,
        "from_base": from_base,
        "trained_layers_sha256": file_sha256(out / LAYERS),
        "trained_layers_bytes": (out / LAYERS).stat().st_size,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if fitted_on is not None:
        write_fitted_on(out, key, fitted_on)
    return manifest


def write_fitted_on(out: Path, key: str, fitted_on: list[dict[str, Any]]) -> None:
    """FITTED_ON beside the model: the corpora it learnt from. Neither a file of the model folder
    nor read by `restore`, so it changes no key and no checksum of the model or its scores."""
    from rag.run.fitted import described

    doc = {"key": key, "corpora": described(fitted_on)}
    (out / FITTED_ON).write_text(json.dumps(doc, indent=2) + "\n")


def shipped_fitted_on(src: Path = SHIPPED_DIR) -> dict[str, Any] | None:
    """The shipped model's FITTED_ON ({"key", "corpora"}), or None."""
    try:
        return json.loads((src / FITTED_ON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def shipped_manifest(src: Path = SHIPPED_DIR) -> dict[str, Any] | None:
    try:
        return json.loads((src / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def restore(key: str, base_model: str, out_dir: Path, src: Path = SHIPPED_DIR) -> bool:
    """Rebuilds the shipped model folder into `out_dir` when it was trained under `key` from
    `base_model`; True when every file matches its recorded checksum."""
    manifest = shipped_manifest(src)
    if manifest is None or manifest.get("key") != key or manifest.get("base_model") != base_model:
        return False
    from safetensors.torch import load_file, save_file

    base_path, base_sha = _base_weights(base_model)
    if base_sha != manifest["base_sha256"]:
        log.warning("shipped cross-encoder: the base model %s differs from the one it was trained from; training",
                    base_model)
        return False
    if file_sha256(src / LAYERS) != manifest["trained_layers_sha256"]:
        log.warning("shipped cross-encoder: %s does not match its checksum; training", src / LAYERS)
        return False
    base = load_file(str(base_path))
    tensors = {name: base[source] for name, source in manifest["from_base"].items()}
    tensors.update(load_file(str(src / LAYERS)))
    out_dir = Path(out_dir)
    save_file(tensors, str(out_dir / WEIGHTS), metadata=manifest["weights_metadata"])
    for name in manifest["files"]:
        if name != WEIGHTS:
            shutil.copyfile(src / name, out_dir / name)
    bad = [n for n, sha in manifest["files"].items() if file_sha256(out_dir / n) != sha]
    if bad:
        log.warning("shipped cross-encoder: rebuilt %s differ from the trained model's; training", ", ".join(bad))
        for n in manifest["files"]:
            (out_dir / n).unlink(missing_ok=True)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rag.reranker.training.shipped",
                                 description="Write models/cross_encoder/ from a trained cross_encoder artifact.")
    ap.add_argument("artifact", type=Path, help="<cache>/cross_encoder/<key> (its manifest.json gives the key)")
    ap.add_argument("--out", type=Path, default=SHIPPED_DIR)
    args = ap.parse_args(argv)
    art = json.loads((args.artifact / "manifest.json").read_text())
    m = ship(args.artifact, art["key"], art["inputs"]["base_model"], args.out, art.get("fitted_on"))
    print(f"shipped {args.out}: key {m['key']}, {len(m['from_base'])} tensors from the base model, "
          f"trained layers {m['trained_layers_bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    from rag.config.cli import run_cli  # a reader that goes away (| head -1) costs no traceback

    run_cli(main)
