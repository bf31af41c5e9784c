"""Model roles behind a server, over HTTP: each request's one total deadline (`http_deadline`),
several requests at a time (`concurrent`), a reply read as data and checked (`reply`), API keys
that never reach a file or the terminal (`secrets`), whether a component calls a server
(`served`), and real serving engines started on 127.0.0.1 for tests and benchmarks (`servers`).
The transport itself is `rag/endpoint.py`, beside the `endpoint` config group it is built from."""
