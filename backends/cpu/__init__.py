"""CPU backend: native C kernels for the decode FFN and its predictors (DESIGN 3.5), bound in kernels.py."""

from .backend import BACKEND

__all__ = ["BACKEND"]
