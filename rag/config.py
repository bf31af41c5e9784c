"""OmegaConf resolvers used by conf/ (registered before Hydra composes the config)."""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The development data shipped in data/ (or RAGRIG_DATA): what the default configs read."""
    env = os.environ.get("RAGRIG_DATA")
    return Path(env) if env else PROJECT_ROOT / "data"


def register_resolvers() -> None:
    # imported here so that PROJECT_ROOT needs no OmegaConf (benchmarks run on GPU machines without it)
    from omegaconf import OmegaConf

    # ${ragrig_root:} lets configs name project files (data/qa/...) independently of the cwd.
    if not OmegaConf.has_resolver("ragrig_root"):
        OmegaConf.register_new_resolver("ragrig_root", lambda: str(PROJECT_ROOT))
