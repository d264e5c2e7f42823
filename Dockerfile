# openai-serve: one image for the GPU (NVIDIA runtime) and the CPU. It starts from the official
# Python image and installs only from the package index (Debian's and PyPI), so it builds wherever
# Docker can pull its base. PyPI's torch brings its own CUDA libraries; the host needs only the
# NVIDIA driver and container toolkit, and the same image runs on a CPU.
FROM python:3.11-slim

# gcc: Triton compiles a small launcher for its kernels at run time on a GPU.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY core core
COPY gpu gpu
COPY openai_serve openai_serve
# gpu: triton for our kernels; flash: FlashAttention-4 and quack's gated GEMM (CuTe DSL kernels compiled at run
# time on Hopper and newer): what the GPU benchmarks run with. On a CPU they are installed and never imported.
RUN pip install --no-cache-dir ".[gpu,flash]"
COPY configs configs

# The model cache (the default model's files, Hub downloads, converted checkpoints, and the attention
# backend a GPU's first start measured): a volume in docker-compose.yml, so a replica fetches a model
# and measures once, not at every start.
ENV HF_HOME=/root/.cache/huggingface
# Triton's compiled kernels on that volume too (keyed by their source, triton's version and the GPU), so a
# recreated container loads them instead of compiling again.
ENV TRITON_CACHE_DIR=/root/.cache/triton
VOLUME /root/.cache
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10m --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
ENTRYPOINT ["openai-serve", "--host", "0.0.0.0", "--port", "8000"]
