"""Importing the kernels, the modules or the image models imports no fairseq and changes nothing outside the
package; fairseq's ``--user-dir`` (fairseq imports the package) and ``hgrn_fairseq.register()`` register it.
Each check runs in a fresh interpreter (not the tests' warm one, which has fairseq loaded)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration  # fresh interpreters

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("ignore")
    import numpy, torch
    def safe_globals():  # (torch's own submodules add theirs when imported)
        return {repr(g) for g in torch.serialization.get_safe_globals() if "torch." not in repr(g)}
    load, hook, safe = torch.load, sys.excepthook, safe_globals()
    had_compat = hasattr(numpy, "compat")
    for name in sys.argv[1:]:
        __import__(name)
    loaded = sorted(m for m in sys.modules if m == "fairseq" or m.startswith("fairseq."))
    assert not loaded, f"importing {sys.argv[1:]} imported {loaded[:5]}"
    assert torch.load is load, "torch.load was replaced"
    assert sys.excepthook is hook, "sys.excepthook was replaced"
    assert safe_globals() == safe, "torch's safe globals changed"
    assert hasattr(numpy, "compat") == had_compat, "numpy.compat was added"
    print("clean")
""")


def _python(code, *args):
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("modules", [
    ["hgrn_fairseq.kernels"],
    ["hgrn_fairseq.modules"],
    ["hgrn_fairseq.image"],
    ["hgrn_fairseq", "hgrn_fairseq.kernels", "hgrn_fairseq.modules", "hgrn_fairseq.image",
     "hgrn_fairseq.image.train", "hgrn_fairseq.checkpoint_io"],
])
def test_plain_pytorch_imports_leave_fairseq_alone(modules):
    pytest.importorskip("timm")
    proc = _python(CHECK, *modules)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("clean"), proc.stderr[-3000:]


REGISTERED = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("ignore")
    how = sys.argv[1]
    if how == "user-dir":  # what fairseq-train --user-dir hgrn_fairseq does
        import argparse
        from fairseq import utils
        utils.import_user_module(argparse.Namespace(user_dir=sys.argv[2]))
    elif how == "register":
        import hgrn_fairseq
        hgrn_fairseq.register()
        hgrn_fairseq.register()  # idempotent
    elif how == "after-fairseq":
        import fairseq
        import hgrn_fairseq.kernels
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY
    from fairseq import checkpoint_utils
    from hgrn_fairseq.checkpoint_io import TorchWithSafeLoad
    assert "hgrn_lm_tiny" in ARCH_MODEL_REGISTRY and "mqar" in TASK_REGISTRY
    assert isinstance(checkpoint_utils.torch, TorchWithSafeLoad)
    print("registered")
""")


@pytest.mark.parametrize("how", ["user-dir", "register", "after-fairseq"])
def test_fairseq_side_registers_through_user_dir_and_register(how):
    pytest.importorskip("fairseq")
    proc = _python(REGISTERED, how, os.path.join(REPO, "hgrn_fairseq"))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("registered"), proc.stderr[-3000:]
