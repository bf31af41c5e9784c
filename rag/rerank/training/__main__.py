import sys

from rag.rerank.training.cli import main

sys.exit(main())
