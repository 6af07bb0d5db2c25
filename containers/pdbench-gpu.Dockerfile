# The image pdbench's SLURM tasks run in under pyxis (cluster.container_image): pdbench, the
# CUDA vLLM 0.32.0 its connector plugin is written against (vllm_install.py), NIXL, and the
# kernels vLLM would otherwise fetch at its first start (compute nodes are offline).
#
#   make image                                   # docker build, then enroot import (README)
#   docker build -f containers/pdbench-gpu.Dockerfile -t pdbench-gpu:0.32.0 .
#   enroot import -o /shared/images/pdbench-gpu.sqsh dockerd://pdbench-gpu:0.32.0
#
# Then, on the cluster (one line of a copy of conf/cluster/h100_8gpu.yaml each):
#   cluster.container_image=/shared/images/pdbench-gpu.sqsh
#   cluster.container_has_pdbench=true   cluster.python=python3
#   cluster.container_mounts=[/shared:/shared]   (the run dir and the models, same paths)
#
# The build fails when what got installed is not vLLM 0.32.0 with its kernels
# (python3 -m pdbench.spec.vllm_install exits 1). pdbench passes --no-container-entrypoint:
# vLLM's image starts `vllm serve` as its entrypoint, which would take the task's command as
# its arguments.
ARG BASE=vllm/vllm-openai:v0.32.0
FROM ${BASE}

WORKDIR /opt/pdbench
COPY pyproject.toml README.md ./
COPY pdbench pdbench
COPY jobs jobs
COPY connector connector
COPY analysis analysis
COPY records records
COPY conf conf
# vLLM 0.32.0 is the base image's (the gpu extra admits it: nothing to fetch);
# NIXL, submitit, Hydra and the rest come from PyPI, torch stays the image's CUDA build.
RUN python3 -m pip install --no-cache-dir ".[gpu]" \
 && vllm download-kernels \
 && python3 -m pdbench.spec.vllm_install
ENTRYPOINT []
