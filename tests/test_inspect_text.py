"""`builder inspect`'s build-record lines are words, not a Python dict (issue 55 item 8)."""

from __future__ import annotations

from builder.stages.inspection import toolchain_text


def test_toolchain_is_told_in_words() -> None:
    text = toolchain_text({"kind": "host", "nvcc": "13.0.88", "cuda_home": "/usr/local/cuda",
                           "reason": "host CUDA at /usr/local/cuda", "nvcc_flags": "-frandom-seed=x"})
    assert text == "toolchain host: nvcc 13.0.88 at /usr/local/cuda (host CUDA at /usr/local/cuda)"
    assert "{" not in toolchain_text({"kind": "docker", "image": "cuda-wheel-builder/manylinux-cuda-13.0:abc"})
    assert toolchain_text({}) == "toolchain ?"
