# Build image for the cibuildwheel compile step (builder/toolchain/cibw.py) with CUDA 12.9 on aarch64 (GH200, GB200,
# GB300, Jetson Thor, DGX Spark): the PyPA manylinux_2_28 aarch64 image (AlmaLinux 8, glibc 2.28;
# /opt/python/cp3XX-cp3XX, auditwheel, patchelf, uv) plus CUDA 12.9's compiler and the development libraries torch's
# headers include, from NVIDIA's rhel8 sbsa repository (the same package names as the x86_64 one). Wheels built here
# get the manylinux_2_28_aarch64 tag (what PyPI's aarch64 CUDA torch wheels target). The image is built and run on an
# arm64 machine (the nightly's ubuntu-24.04-arm runners): an x86_64 host would run every compile under qemu. Like
# manylinux-cuda-12.9.Dockerfile otherwise; BASE_IMAGE is a build argument so a local stand-in can replace it; pin it
# to a dated tag (quay.io/pypa/manylinux_2_28_aarch64:YYYY.MM.DD-N) for reproducible images.
ARG BASE_IMAGE=quay.io/pypa/manylinux_2_28_aarch64:latest
FROM ${BASE_IMAGE}

ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/rhel8/sbsa/cuda-rhel8.repo
# A base that already holds CUDA 12.9 at /usr/local/cuda-12.9 (a local stand-in) is used as it is; any other gets
# CUDA 12.9 from NVIDIA's repository.
# hadolint ignore=DL3041
RUN if [ ! -x /usr/local/cuda-12.9/bin/nvcc ]; then \
      curl -fsSL "${CUDA_REPO}" -o /etc/yum.repos.d/cuda-rhel8.repo \
      && dnf install -y --setopt=install_weak_deps=False \
        cuda-nvcc-12-9 cuda-cudart-devel-12-9 cuda-nvrtc-devel-12-9 cuda-nvtx-12-9 cuda-cccl-12-9 cuda-profiler-api-12-9 \
        libcublas-devel-12-9 libcusparse-devel-12-9 libcusolver-devel-12-9 libcurand-devel-12-9 libcufft-devel-12-9 \
      && dnf clean all \
      && rm -rf /var/cache/dnf; \
    fi \
 && ln -sfn /usr/local/cuda-12.9 /usr/local/cuda

ENV CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/cuda/bin:${PATH}
