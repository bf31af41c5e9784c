"""ragrig's entry point: `python run.py +version=v2`, or a sweep with `python run.py -m ...`.

`main()` returns the configured objective metric so that Hydra sweepers can optimize it.
"""
from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rag.config import register_resolvers

register_resolvers()
log = logging.getLogger("ragrig")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from rag.pipeline import format_table, run
    from rag.types import RagError

    output_dir = HydraConfig.get().runtime.output_dir
    try:
        result = run(cfg, output_dir)
    except RagError as e:
        # A user error gets one line, not a traceback from deep inside a library.
        log.error("error: %s", e)
        print(f"ragrig: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_table(result))
    print(f"results: {output_dir}")
    return float(result["objective"]["value"])


if __name__ == "__main__":
    main()
