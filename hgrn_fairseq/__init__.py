"""hgrn-fairseq: HGRN / HGRN2 gated linear RNNs as a fairseq plugin.

``fairseq-train --user-dir hgrn_fairseq`` (or ``--user-dir`` pointing at this folder) imports this
package, which registers the models and tasks. ``hgrn_fairseq.kernels`` and ``hgrn_fairseq.modules``
do not depend on fairseq and work from plain PyTorch; the package imports fairseq only to register
with it, and only when fairseq is installed.
"""
__version__ = "0.1.0"


def _register_with_fairseq() -> None:
    try:
        import fairseq  # noqa: F401
    except ImportError:  # plain-PyTorch use of kernels/modules
        return
    from . import criterions, fairseq_compat, models, optim, tasks  # noqa: F401

    fairseq_compat.install()


_register_with_fairseq()
