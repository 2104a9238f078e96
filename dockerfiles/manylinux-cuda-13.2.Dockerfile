# Build image for the cibuildwheel compile step (builder/toolchain/cibw.py) with CUDA 13.2: the PyPA manylinux_2_28
# image (AlmaLinux 8, glibc 2.28; /opt/python/cp3XX-cp3XX, auditwheel, patchelf, uv) plus CUDA 13.2's compiler and
# the development libraries torch's headers include, from NVIDIA's rhel8 repository. Wheels built here get the
# manylinux_2_28_x86_64 tag (what PyPI's torch wheels target). Chosen over nvidia/cuda:13.2-devel-rockylinux8 (no
# /opt/python, auditwheel or patchelf: every CPython would have to be added) and over
# quay.io/manylinux_cuda/manylinux_2_28_x86_64_cuda<ver> (not published for every CUDA we support, 12.8 and 13.2
# included; no cusolver/cusparse headers). BASE_IMAGE is a build argument so a local stand-in can replace it;
# pin it to a dated tag (quay.io/pypa/manylinux_2_28_x86_64:YYYY.MM.DD-N) for reproducible images.
ARG BASE_IMAGE=quay.io/pypa/manylinux_2_28_x86_64:latest
FROM ${BASE_IMAGE}

ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
# A base that already holds CUDA 13.2 at /usr/local/cuda-13.2 (a local stand-in where no registry is reachable:
# tests/test_docker_e2e.py) is used as it is; any other gets CUDA 13.2 from NVIDIA's repository.
# hadolint ignore=DL3041
RUN if [ ! -x /usr/local/cuda-13.2/bin/nvcc ]; then \
      curl -fsSL "${CUDA_REPO}" -o /etc/yum.repos.d/cuda-rhel8.repo \
      && dnf install -y --setopt=install_weak_deps=False \
        cuda-nvcc-13-2 cuda-cudart-devel-13-2 cuda-nvrtc-devel-13-2 cuda-nvtx-13-2 cuda-cccl-13-2 cuda-profiler-api-13-2 \
        libcublas-devel-13-2 libcusparse-devel-13-2 libcusolver-devel-13-2 libcurand-devel-13-2 libcufft-devel-13-2 \
      && dnf clean all \
      && rm -rf /var/cache/dnf; \
    fi \
 && ln -sfn /usr/local/cuda-13.2 /usr/local/cuda

ENV CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/cuda/bin:${PATH}
