"""torch.library.opcheck over every tunedb op a family registers (schema, fake kernel, autograd
registration, AOT dispatch with static and dynamic shapes) on CPU inputs, and the cases opcheck
found: group_gemm's id check and grad form under fake tensors and torch.compile, and the
[1, N] weight scale torch._scaled_mm takes."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.bmm import ops as bmm_ops
from tunedb.families.group_gemm import ops as group_ops
from tunedb.families.linalg import ops as linalg_ops
import tunedb.families.conv.ops  # noqa: F401 - registers conv1d / conv2d
import tunedb.families.gemm.ops  # noqa: F401 - registers gemm / gemm_act
import tunedb.families.gemm_log_softmax.ops  # noqa: F401
import tunedb.families.scaled_mm.ops  # noqa: F401

bmm_ops.register()
group_ops.register()
linalg_ops.register()
ns = torch.ops.tunedb

# opcheck's schema test compares inputs with ops fp8 has no CPU kernel for (mul): fp8 cases skip it
_NO_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _r(*shape, dt=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dt, requires_grad=grad)


def _cases():
    torch.manual_seed(0)
    bf, hf = torch.bfloat16, torch.float16
    out = []
    for g in (False, True):
        out += [
            (f"bmm-{g}", ns.bmm.default, (_r(3, 4, 5, grad=g), _r(3, 5, 6, grad=g)), {}),
            (f"bmm-strided-{g}", ns.bmm.default, (_r(3, 5, 4, grad=g).transpose(1, 2), _r(3, 5, 6, grad=g)), {}),
            (f"glsm-{g}", ns.gemm_log_softmax.default,
             (_r(4, 8, dt=bf, grad=g), _r(10, 8, dt=bf, grad=g), _r(10, dt=bf, grad=g)), {}),
            (f"glsm-3d-{g}", ns.gemm_log_softmax.default, (_r(2, 3, 8, dt=hf, grad=g), _r(10, 8, dt=hf, grad=g), None), {}),
            (f"conv1d-dw-{g}", ns.conv1d.default,
             (_r(2, 4, 9, grad=g), _r(4, 1, 3, grad=g), _r(4, grad=g), [1], [1], [1], 4, "silu"), {}),
            (f"conv1d-pw-{g}", ns.conv1d.default, (_r(2, 4, 9, grad=g), _r(6, 4, 1, grad=g), None, [1], [0], [1], 1, "none"), {}),
            (f"conv2d-{g}", ns.conv2d.default,
             (_r(2, 3, 8, 8, grad=g), _r(5, 3, 3, 3, grad=g), _r(5, grad=g), [2, 2], [1, 1], [1, 1], 1, "relu"), {}),
            (f"gemm_act-{g}", ns.gemm_act.default, (_r(4, 8, grad=g), _r(6, 8, grad=g), _r(6, grad=g), "gelu_tanh"), {}),
            (f"gemm-{g}", ns.gemm.default, (_r(2, 3, 8, grad=g), _r(6, 8, grad=g)), {}),
        ]
    e, n, k, t, top = 4, 6, 8, 5, 2
    ids = torch.randint(0, e, (t, top))
    out += [
        ("group_gemm", ns.group_gemm.default, (_r(t, k, dt=bf), _r(e, n, k, dt=bf), ids, torch.rand(t, top).to(bf)), {}),
        ("group_gemm-grad", ns.group_gemm.default,
         (_r(t, k, dt=bf, grad=True), _r(e, n, k, dt=bf, grad=True), ids, torch.rand(t, top).to(bf).requires_grad_()), {}),
        ("group_gemm-no-weights", ns.group_gemm.default, (_r(t, k, dt=bf), _r(e, n, k, dt=bf), ids, None), {}),
    ]
    xi = torch.randint(-127, 127, (4, 16), dtype=torch.int8)
    wi = torch.randint(-127, 127, (8, 16), dtype=torch.int8)
    out += [
        ("int8", ns.scaled_mm_int8.default, (xi, wi, torch.rand(4, 1), torch.rand(8, 1)), {"out_dtype": bf}),
        ("int8_quant", ns.scaled_mm_int8_quant.default, (xi, wi, torch.rand(4, 1), torch.rand(8)), {}),
    ]
    xf, wf = _r(4, 16).to(torch.float8_e4m3fn), _r(8, 16).to(torch.float8_e4m3fn)
    xb, wb = _r(4, 256).to(torch.float8_e4m3fn), _r(128, 256).to(torch.float8_e4m3fn)
    out += [
        ("fp8-tensor", ns.scaled_mm_fp8.default, (xf, wf, torch.tensor(0.5), torch.tensor(2.0)), {"scale": "tensor"}),
        ("fp8-row", ns.scaled_mm_fp8.default, (xf, wf, torch.rand(4, 1), torch.rand(1, 8)), {"scale": "row"}),
        ("fp8-quant-row", ns.scaled_mm_fp8_quant.default, (xf, wf, torch.rand(4, 1), torch.rand(8, 1)), {"scale": "row"}),
        ("fp8-block", ns.scaled_mm_fp8.default, (xb, wb, torch.rand(4, 2), torch.rand(1, 2)), {"scale": "block"}),
    ]
    return out


@pytest.mark.parametrize("name,op,args,kwargs", _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_opcheck(name, op, args, kwargs):
    utils = {"test_utils": _NO_SCHEMA} if name.startswith("fp8") else {}
    torch.library.opcheck(op, args, kwargs, **utils)


def test_group_gemm_grad_form_under_compile_matches_eager():
    """A direct user of the op who trains under torch.compile: the traced grad form has static
    shapes (Dynamo refused the data-dependent per-expert index: unbacked sizes not in the output)
    and gives eager's loss and gradients."""
    torch.manual_seed(1)
    e, n, k, t, top = 4, 6, 8, 5, 2

    def f(x, w, ids, wt):
        return ns.group_gemm(x, w, ids, wt).float().square().sum()

    x = _r(t, k, dt=torch.bfloat16, grad=True)
    w = _r(e, n, k, dt=torch.bfloat16, grad=True)
    wt = torch.rand(t, top).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, e, (t, top))
    loss = f(x, w, ids, wt)
    grads = torch.autograd.grad(loss, (x, w, wt))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss_c = compiled(x, w, ids, wt)
    grads_c = torch.autograd.grad(loss_c, (x, w, wt))
    assert torch.allclose(loss_c, loss, rtol=1e-2)
    for got, want in zip(grads_c, grads):
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max())


def test_group_gemm_ids_unchecked_on_fake_still_checked_on_real():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = ns.group_gemm(torch.randn(5, 8, dtype=torch.bfloat16), torch.randn(4, 6, 8, dtype=torch.bfloat16),
                          torch.randint(0, 4, (5, 2)))
    assert tuple(y.shape) == (5, 2, 6)
    bad = torch.tensor([[0, 4]] + [[0, 1]] * 4)
    with pytest.raises(SignatureError, match="expert id 4"):
        ns.group_gemm(torch.randn(5, 8, dtype=torch.bfloat16), torch.randn(4, 6, 8, dtype=torch.bfloat16), bad)


@pytest.mark.parametrize("family", ["int8", "fp8"])
def test_weight_scale_one_by_n_is_row_wise(family):
    """w_scale [1, N] (torch._scaled_mm's scale_b layout) serves as the row-wise [N] it holds."""
    torch.manual_seed(2)
    m, n, k = 3, 8, 16
    sx, sw = torch.rand(m, 1) + 0.5, torch.rand(n) + 0.5
    if family == "int8":
        x = torch.randint(-100, 100, (m, k), dtype=torch.int8)
        w = torch.randint(-100, 100, (n, k), dtype=torch.int8)
        op, kw = ns.scaled_mm_int8, {}
    else:
        x, w = _r(m, k).to(torch.float8_e4m3fn), _r(n, k).to(torch.float8_e4m3fn)
        op, kw = ns.scaled_mm_fp8, {}
    want = op(x, w, sx, sw, **kw)
    got = op(x, w, sx, sw.view(1, n), **kw)
    assert torch.equal(got, want)
    with pytest.raises(SignatureError, match=r"\[1, N\]|needs one of"):
        op(x, w, sx, torch.rand(2, n), **kw)
