"""``hgrn_lra --compile-blocks``: training steps through ``torch.compile`` of each block give the eager
model's numbers: masked token batches (batch norms whose statistics skip the pads), unpadded ones and
2-D pixel grids. CPU, with the ``aot_eager`` backend (no C compiler needed; it traces
the same graphs inductor would fuse, graph breaks around our scans included). Tolerances as the fp32
CUDA-graph twins': six SGD steps let float noise grow a little. The GPU A/B of the speed is
``bench/lra_train_speed.sh`` with ``@--compile-blocks`` (docs/lra.md, Findings)."""
import pytest
import torch

from tests.models.test_hgrn_lra_cuda_graphs import batch_norm_state, train_twins, twin_models

pytestmark = pytest.mark.integration


# both mixers, token batches (masked and unmasked) and a 2-D pixel grid; (the pair head and HGRN2 on tokens go
# through the same blocks: tests/models/test_hgrn_lra_cuda_graphs.py has all four cases)
@pytest.mark.parametrize("case", ["hgrn1_listops", "hgrn2_pathfinder"])
def test_compiled_blocks_train_as_eager(case, monkeypatch):
    monkeypatch.setenv("HGRN_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    eager, compiled = twin_models(case, compile_blocks=True)
    blocks = [m for m in compiled.modules() if getattr(m, "compile_mode", None) is not None]
    assert blocks and all(b.compile_mode == "train" for b in blocks)
    losses, grad_errors, net_input, shapes = train_twins(eager, compiled, case, "cpu", bf16=False)
    assert all("_compiled_forward" in b.__dict__ for b in blocks)  # the training forwards went through compile
    for step, (a, b) in enumerate(losses):
        assert abs(a - b) <= 1e-4 * abs(a), f"step {step}: eager loss {a} vs compiled {b}"
    for step, (name, err) in enumerate(grad_errors):
        assert err <= 1e-3, f"step {step}: {name}.grad relative difference {err:.2e}"
    for (m1, v1, n1), (m2, v2, n2) in zip(batch_norm_state(eager), batch_norm_state(compiled)):
        assert n1 == n2 == len(shapes)
        torch.testing.assert_close(m2, m1, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(v2, v1, rtol=1e-3, atol=1e-3)
    eager.eval(), compiled.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(**net_input), eager(**net_input), rtol=1e-3, atol=1e-3)
