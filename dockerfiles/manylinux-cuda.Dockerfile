# Build image for the cibuildwheel compile step (builder/toolchain/cibw.py): the PyPA manylinux_2_28 image
# (AlmaLinux 8, glibc 2.28; /opt/python/cp3XX-cp3XX, auditwheel, patchelf, uv) plus one CUDA's compiler and the
# development libraries torch's headers include, from NVIDIA's rhel8 repository (x86_64, or sbsa for aarch64: the
# same package names). Wheels built here get the manylinux_2_28_<platform> tag (what PyPI's torch wheels target).
# One template for every CUDA and platform: builder/toolchain/images.py fills the build arguments below (its
# IMAGE_CUDAS lists the CUDA lines, its BASE_COMPONENTS the libraries) and hashes this text and the arguments into
# the image tag, so an edit here or another argument gives another image. `builder images build --cuda X.Y
# [--platform aarch64] [--base-image IMAGE]` builds it; an aarch64 image is built on an arm64 machine (under qemu
# every compile would take hours).
# Chosen over nvidia/cuda:X.Y-devel-rockylinux8 (no /opt/python, auditwheel or patchelf: every CPython would have to
# be added) and over quay.io/manylinux_cuda/manylinux_2_28_<arch>_cuda<ver> (not published for every CUDA we
# support, 12.8 and 13.2 included; no cusolver/cusparse headers). BASE_IMAGE is an argument so a local stand-in can
# replace quay.io/pypa/manylinux_2_28_<platform>:latest; pin a dated tag (…:YYYY.MM.DD-N) for reproducible images.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

# CUDA_VERSION: the CUDA line ("12.8"); CUDA_REPO: NVIDIA's rhel8 repository file for the platform;
# CUDA_PACKAGES: the rpms of the compiler and BASE_COMPONENTS ("cuda-nvcc-12-8 … libcufft-devel-12-8");
# EXTRA_PACKAGES: the rpms of a recipe's [build] cuda-components that CUDA_PACKAGES lacks (empty for most images).
ARG CUDA_VERSION
ARG CUDA_REPO
ARG CUDA_PACKAGES
ARG EXTRA_PACKAGES=""

# A base that already holds this CUDA at /usr/local/cuda-X.Y (a local stand-in where no registry is reachable:
# tests/test_docker_e2e.py) is used as it is; any other gets it from NVIDIA's repository.
# hadolint ignore=DL3041,SC2086
RUN test -n "${CUDA_VERSION}" && test -n "${CUDA_REPO}" && test -n "${CUDA_PACKAGES}" \
 && if [ ! -x "/usr/local/cuda-${CUDA_VERSION}/bin/nvcc" ]; then \
      curl -fsSL "${CUDA_REPO}" -o /etc/yum.repos.d/cuda-rhel8.repo \
      && dnf install -y --setopt=install_weak_deps=False ${CUDA_PACKAGES} \
      && dnf clean all \
      && rm -rf /var/cache/dnf; \
    fi \
 && ln -sfn "/usr/local/cuda-${CUDA_VERSION}" /usr/local/cuda

# The extra components (the repository file is fetched here too for a base that came with CUDA already).
# hadolint ignore=DL3041,SC2086
RUN if [ -n "${EXTRA_PACKAGES}" ]; then \
      { [ -f /etc/yum.repos.d/cuda-rhel8.repo ] || curl -fsSL "${CUDA_REPO}" -o /etc/yum.repos.d/cuda-rhel8.repo; } \
      && dnf install -y --setopt=install_weak_deps=False ${EXTRA_PACKAGES} \
      && dnf clean all \
      && rm -rf /var/cache/dnf; \
    fi

ENV CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/cuda/bin:${PATH}
