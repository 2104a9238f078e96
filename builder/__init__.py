"""cuda-wheel-builder: verified CUDA extension wheels for new GPU architectures, from declarative recipes."""

__version__ = "0.1.0"
