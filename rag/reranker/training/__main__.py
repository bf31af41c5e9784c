import sys

from rag.reranker.training.cli import main

sys.exit(main())
