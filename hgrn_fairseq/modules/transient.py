"""Per-instance helpers that a module builds on first use and keeps out of its state.

A compiled forward or a cache of CUDA graphs belongs to one live module: it must not be pickled,
deep-copied or rebuilt on every call. ``TransientAttrs._transient(name, build)`` stores it in the
instance ``__dict__`` (not as a submodule, so no state_dict or ``.to()`` sees it), and ``__getstate__``
leaves out every name listed in the class's ``_TRANSIENT``.
"""
from __future__ import annotations

from typing import Callable, Tuple, TypeVar

T = TypeVar("T")


class TransientAttrs:
    """Mixin for nn.Module subclasses (put it first among the bases)."""

    _TRANSIENT: Tuple[str, ...] = ()

    def _transient(self, name: str, build: Callable[[], T]) -> T:
        assert name in self._TRANSIENT, f"{name} is not listed in {type(self).__name__}._TRANSIENT"
        value = self.__dict__.get(name)
        if value is None:
            value = build()
            self.__dict__[name] = value
        return value

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in self._TRANSIENT:
            state.pop(name, None)
        return state
