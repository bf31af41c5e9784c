"""Storage: the content-addressed artifact cache (`cache`) and its read-only seed (`seed`), the
checks a record or directory read back must pass (`cache_records`), files written whole or not at
all (`atomic`) and in JSON every reader accepts (`strict_json`), the chunk and document store read
by row (`chunk_store`, `chunk_set`, and `legacy_cache` for the format before it), and where model
artifacts go (`models`). Which data kinds a run caches, under which keys, is `rag.run.artifacts`."""
