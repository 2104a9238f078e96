# Build image for `builder build --toolchain docker --cuda 12.8`: the nvidia/cuda devel image (nvcc, headers,
# libraries) plus what a wheel build needs. BASE_IMAGE is a build argument so that a local stand-in can replace it
# where no registry is reachable (`builder images build --cuda 12.8 --base-image IMAGE`).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04
FROM ${BASE_IMAGE}

ARG UV_VERSION=0.13.9
ENV DEBIAN_FRONTEND=noninteractive \
    CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    UV_PYTHON_INSTALL_DIR=/opt/uv-python \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt

# Python (3.12 on Ubuntu 24.04) with its headers, a C++ compiler for host code, ninja, git and patch.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-dev python3-venv python3-pip g++ ninja-build git patch \
    ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# uv makes the build venv with the pinned torch. Installed into a throwaway venv and linked onto PATH, so the
# image works for any uid: nothing lives under a home folder; /work and /opt/uv-python are writable by all.
RUN python3 -m venv /opt/uv \
 && /opt/uv/bin/pip install --no-cache-dir "uv==${UV_VERSION}" \
 && ln -s /opt/uv/bin/uv /usr/local/bin/uv \
 && mkdir -p /work /opt/uv-python \
 && chmod 1777 /work /opt/uv-python

WORKDIR /work
