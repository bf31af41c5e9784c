from rag.config.cli import run_cli
from rag.reranker.training.cli import main

run_cli(main)
