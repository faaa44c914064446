"""BanditSpec core: adaptive speculative decoding (Hou et al., ICML 2025).

Importable without Triton. The Triton models under ``model_repository/`` only
convert tensors to and from the dataclasses of :mod:`banditspec.types`.
"""

from banditspec.errors import BanditSpecValidationError

__all__ = ["BanditSpecValidationError"]
__version__ = "0.1.0"
