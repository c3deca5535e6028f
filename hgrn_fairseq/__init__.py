"""hgrn-fairseq: HGRN / HGRN2 gated linear RNNs as a fairseq plugin.

``fairseq-train --user-dir hgrn_fairseq`` imports this package after fairseq, and the import registers the
models, tasks, criterions and optimizer groups and applies the fairseq fixes (``fairseq_compat.py``).
Programs that import fairseq themselves call ``hgrn_fairseq.register()``. ``hgrn_fairseq.kernels``,
``hgrn_fairseq.modules`` and ``hgrn_fairseq.image`` import no fairseq and change nothing: importing the
package registers only when fairseq is already imported.
"""
import sys

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Import fairseq, apply the fixes of ``fairseq_compat`` and register this package's models, tasks,
    criterions and optimizer groups with fairseq. Idempotent."""
    global _registered
    if _registered:
        return
    import fairseq  # noqa: F401

    from . import criterions, fairseq_compat, models, optim, tasks  # noqa: F401

    fairseq_compat.install()
    _registered = True


if sys.modules.get("fairseq") is not None:  # imported by fairseq (--user-dir) or after it: register with it
    register()
