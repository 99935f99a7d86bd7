"""s42 audit of the product families as optimize() and their public ops apply them on the CPU:
bmm (products in model code, tunedb::bmm), gemm_log_softmax (a Linear + log_softmax head) and
group_gemm (MoE experts). What a user relies on: the optimized model computes what the plain one
does (bitwise on the CPU, where the same torch ops run), trains to the same gradients, raises the
exception type plain raises on a bad input, and survives deepcopy / pickle / state_dict.
Models in audit_products_models_s42.py (optimize() reads each model class's source file)."""
from __future__ import annotations

import copy
import io
import pickle

import audit_products_models_s42 as M  # (see the module docstring)
import pytest
import torch

import tunedb
from tunedb.errors import OperandMismatchError

pytestmark = pytest.mark.usefixtures("swap_unmeasured")  # the Linears swap too: the harder case


def _equal(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _pair(build, dtype=torch.float32, train=False):
    torch.manual_seed(0)
    plain = build().to(dtype).train(train)
    return plain, tunedb.optimize(copy.deepcopy(plain))


def _fused(model):
    return [n for n, m in model.named_modules() if type(m).__name__ == "TunedLinearLogSoftmax"]


def _loss(out):
    outs = out if isinstance(out, tuple) else (out,)
    return sum(o.abs().mean() if o.is_complex() else o.float().square().mean()
               for o in outs if o.is_floating_point() or o.is_complex())


def _same_grads(plain, tuned, x):
    xp, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = plain(xp), tuned(xt)
    assert _equal(a, b)
    _loss(a).backward()
    _loss(b).backward()
    assert torch.equal(xp.grad, xt.grad)
    for (name, p), (_, q) in zip(plain.named_parameters(), tuned.named_parameters()):
        assert (p.grad is None) == (q.grad is None), name
        assert p.grad is None or torch.equal(p.grad, q.grad), name


# --- gemm_log_softmax -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [-1, 2, 1, 0])
def test_only_a_last_dim_head_fuses_and_every_head_matches_plain(dim, dtype):
    plain, tuned = _pair(lambda: M.Head(dim=dim), dtype)
    assert bool(_fused(tuned)) == (dim == -1)  # dim=2 is the last dim of a 3-D input but not always
    x = torch.randn(2, 5, 16).to(dtype)
    with torch.no_grad():
        assert _equal(tuned(x), plain(x))
        if dim in (-1, 0):  # a 2-D call of the same model (dim=1/2 would be another axis, or none)
            assert _equal(tuned(x[0]), plain(x[0]))


@pytest.mark.parametrize("how", ["F", "torch", "method", "module"])
@pytest.mark.parametrize("kw", [{}, {"temp": 2.0}, {"dtype": torch.float32}, {"dim": 1}],
                         ids=["plain", "temperature", "dtype_arg", "dim1"])
def test_heads_written_in_code_keep_their_outputs(how, kw):
    if how == "module" and "dtype" in kw:
        pytest.skip("nn.LogSoftmax takes no dtype")
    plain, tuned = _pair(lambda: M.CodeHead(how=how, **kw), torch.bfloat16)
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        assert _equal(tuned(x), plain(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_fused_head_trains_to_plains_gradients(dtype):
    plain, tuned = _pair(M.Head, dtype, train=True)
    assert _fused(tuned)
    _same_grads(plain, tuned, torch.randn(2, 5, 16).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_fused_head_given_a_bad_input_raises_plains_runtime_error(dtype):
    # was SignatureError (a ValueError): `except RuntimeError` around the plain model's call missed it
    plain, tuned = _pair(M.OnlyHead, dtype)
    assert _fused(tuned)
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    with torch.no_grad():
        for bad in (torch.randn(3, 15).to(dtype), torch.randn(3, 16).to(other), torch.tensor(1.0).to(dtype)):
            with pytest.raises(RuntimeError) as want:
                plain(bad)
            with pytest.raises(RuntimeError) as got:
                tuned(bad)
            assert str(got.value) == str(want.value)  # session 55: plain's own words (was the family's)


def test_the_public_op_names_mismatched_operands_as_runtime_errors():
    from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax

    x, w, b = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(33, 16, dtype=torch.bfloat16), None
    for args in ((x, w.float()), (x.float(), w), (x.long(), w), (x[:, :15], w), (x, w, torch.zeros(32, dtype=w.dtype)),
                 (x, w, torch.zeros(33)), (x, w.to("meta"))):
        with pytest.raises(OperandMismatchError):
            gemm_log_softmax(*args)
    assert b is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_fused_head_runs_on_meta_tensors(dtype):
    # torch.is_autocast_enabled("meta") raises: the bf16 fused head failed a meta census
    plain, tuned = _pair(M.OnlyHead, dtype)
    plain, tuned = plain.to("meta"), tuned.to("meta")
    x = torch.empty(2, 5, 16, device="meta", dtype=dtype)
    with torch.no_grad():
        got, want = tuned(x), plain(x)
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_meta


def test_a_fused_head_under_autocast_compile_and_vmap_matches_plain():
    plain, tuned = _pair(M.Head, torch.bfloat16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.float16):
            assert _equal(tuned(x), plain(x))
        assert _equal(torch.compile(tuned, backend="eager")(x), plain(x))
        assert _equal(torch.vmap(tuned)(x), torch.vmap(plain)(x))


def test_a_fused_head_round_trips():
    plain, tuned = _pair(M.Head, torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        want = plain(x)
        buf = io.BytesIO()
        torch.save(tuned, buf)
        buf.seek(0)
        for copy_ in (copy.deepcopy(tuned), pickle.loads(pickle.dumps(tuned)), torch.load(buf, weights_only=False)):
            assert _equal(copy_(x), want)
        fresh = M.Head().to(torch.bfloat16)
        fresh.load_state_dict(tuned.state_dict())
        assert _equal(fresh(x), want)
    assert isinstance(tunedb.tuning_report(), str)


# --- bmm: products in model code --------------------------------------------------------------

@pytest.mark.parametrize("how", ["matmul", "at", "einsum", "baddbmm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_products_match_plain_everywhere(how, dtype):
    plain, tuned = _pair(lambda: M.Attention(how=how), dtype, train=True)
    x = torch.randn(2, 5, 16, dtype=dtype)
    _same_grads(plain, tuned, x)
    with torch.no_grad():
        assert _equal(tuned(x), plain(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _equal(tuned(x), plain(x))
        xs = x[None].expand(3, -1, -1, -1).contiguous()
        assert _equal(torch.vmap(tuned)(xs), torch.vmap(plain)(xs))
        assert _equal(torch.compile(tuned, backend="eager")(x), plain(x))
        assert _equal(pickle.loads(pickle.dumps(tuned))(x), plain(x))
        assert _equal(copy.deepcopy(tuned)(x), plain(x))


def test_broadcast_1d_integer_complex_and_no_grad_products_match_plain():
    plain, tuned = _pair(M.OddProducts, train=True)
    _same_grads(plain, tuned, torch.randn(2, 3, 16))


@pytest.mark.parametrize("mode", ["hooks", "none"])
def test_the_product_mode_hooks_change_nothing_on_the_cpu(mode, monkeypatch):
    """optimize() installs the product mode only where CUDA runs: forced on here, its hooks and
    TorchFunctionMode pass every CPU product through to torch unchanged."""
    from tunedb.families.bmm import serving

    if mode == "hooks":
        monkeypatch.setattr(serving, "can_serve", lambda: True)
        monkeypatch.setattr(serving, "has_table", lambda: True)
    plain, tuned = _pair(lambda: M.Attention(how="at"), train=True)
    assert bool(tuned._forward_pre_hooks) == (mode == "hooks")
    x = torch.randn(2, 5, 16)
    _same_grads(plain, tuned, x)
    with torch.no_grad():
        assert _equal(torch.vmap(tuned)(x[None].expand(2, -1, -1, -1)), torch.vmap(plain)(x[None].expand(2, -1, -1, -1)))
        assert _equal(torch.compile(tuned, backend="eager")(x), plain(x))
        assert _equal(pickle.loads(pickle.dumps(tuned))(x), plain(x))


@pytest.mark.parametrize("cls, native", [(M.TinyMHA, "_native_multi_head_attention"),
                                         (M.TinyEncoder, "_transformer_encoder_layer_fwd")])
@pytest.mark.parametrize("force_mode", [False, True])
def test_torchs_attention_keeps_its_fast_path(cls, native, force_mode, monkeypatch):
    from tunedb.families.bmm import serving

    if force_mode:  # even where the product mode could be installed (CUDA and a table)
        monkeypatch.setattr(serving, "can_serve", lambda: True)
        monkeypatch.setattr(serving, "has_table", lambda: True)
    calls = []
    real = getattr(torch, native)
    monkeypatch.setattr(torch, native, lambda *a, **k: calls.append(1) or real(*a, **k))
    plain, tuned = _pair(cls)
    plain.eval(), tuned.eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        want = plain(x)
        n = len(calls)
        assert n > 0
        assert _equal(tuned(x), want)
    assert len(calls) == 2 * n
    assert not tuned._forward_pre_hooks


def test_the_bmm_op_computes_torchs_product_for_every_dtype_and_layout():
    from tunedb.families.bmm.ops import bmm

    r = torch.randn
    cases = [(r(2, 3, 4), r(2, 4, 5)), (r(3, 4), r(4, 5)), (r(2, 2, 3, 4), r(2, 2, 4, 5)),
             (r(2, 4, 3).mT, r(2, 5, 4).mT), (r(2, 3, 4).bfloat16(), r(2, 4, 5).bfloat16()),
             (torch.randint(0, 5, (2, 3, 4)), torch.randint(0, 5, (2, 4, 5))),
             (r(2, 3, 4, dtype=torch.complex64), r(2, 4, 5, dtype=torch.complex64)),
             (r(2, 3, 4, dtype=torch.float64), r(2, 4, 5, dtype=torch.float64)),
             (r(0, 3, 4), r(0, 4, 5)), (r(2, 3, 0), r(2, 0, 5)), (r(2, 2, 0, 4), r(2, 2, 4, 5))]
    for a, b in cases:
        assert _equal(bmm(a, b), torch.matmul(a, b))
    a, b = r(4, 2, 3, 5), r(2, 5, 6)
    assert _equal(torch.vmap(bmm, in_dims=(0, None))(a, b), torch.vmap(torch.bmm, in_dims=(0, None))(a, b))


def test_the_bmm_op_raises_torchs_runtime_error_on_mismatched_operands():
    # was SignatureError (a ValueError) where torch.bmm raises RuntimeError
    from tunedb.families.bmm.ops import bmm

    r = torch.randn
    for a, b in ((r(2, 3, 4), r(2, 4, 5).double()), (r(2, 3, 4).bfloat16(), r(2, 4, 5)),
                 (r(2, 3, 4), r(2, 5, 5)), (r(2, 3, 4), r(3, 4, 5)), (r(2, 2, 3, 4), r(2, 2, 5, 5))):
        with pytest.raises(RuntimeError):
            torch.bmm(a, b) if a.dim() == 3 else torch.matmul(a, b)
        with pytest.raises(OperandMismatchError):
            bmm(a, b)
    with pytest.raises(OperandMismatchError, match="one device"):  # (torch would return a meta tensor)
        bmm(r(2, 3, 4), r(2, 4, 5, device="meta"))


# --- group_gemm: MoE blocks -------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"k": 1}, {"e": 1, "k": 1}, {"k": 4}, {"bias": True}, {"shared": True}],
                         ids=["top2", "top1", "one_expert", "top4_all", "bias", "shared"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_users_moe_block_matches_plain(kw, dtype):
    plain, tuned = _pair(lambda: M.UserMoE(**kw), dtype, train=True)
    for tokens in (1, 3):  # one token: most experts get none
        _same_grads(plain, tuned, torch.randn(1, tokens, 16).to(dtype))
    with torch.no_grad():
        x = torch.randn(1, 0, 16).to(dtype)  # no token at all
        assert _equal(tuned(x), plain(x))
        x = torch.randn(2, 3, 16).to(dtype)
        assert _equal(pickle.loads(pickle.dumps(tuned))(x), plain(x))
        assert _equal(torch.compile(tuned, backend="eager")(x), plain(x))


def _hf_block(dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = transformers.MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(cfg).to(dtype).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return block


@pytest.mark.parametrize("dtype, autocast", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16),
                                             (torch.bfloat16, torch.bfloat16)])
def test_swapped_experts_under_autocast_match_plain(dtype, autocast):
    # fp16 experts under bf16 autocast: the plain F.linear calls run in bf16, group_gemm ran fp16
    # (1e-2 apart); the swapped forward now hands a casting autocast to the model's own forward
    plain = _hf_block(dtype)
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert getattr(tuned.experts, "_tunedb_group_gemm", False)
    x = torch.randn(1, 5, 16, dtype=dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast):
        assert _equal(tuned(x), plain(x))
    with torch.no_grad():
        assert _equal(tuned(x), plain(x))
        assert _equal(tuned(x[:, :0]), plain(x[:, :0]))


def test_swapped_experts_run_on_meta_tensors_under_autocast():
    plain = _hf_block(torch.bfloat16)
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all").to("meta")
    x = torch.empty(1, 5, 16, dtype=torch.bfloat16, device="meta")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        out = tuned(x)
    assert out.shape == x.shape and out.is_meta


def test_the_fused_ops_vmap_rule_computes_torchs_form():
    from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax

    torch.manual_seed(0)
    x, w, b = (torch.randn(3, 4, 16), torch.randn(3, 33, 16) * 0.3, torch.randn(3, 33))

    def form(x_, w_, b_):
        return torch.log_softmax(torch.nn.functional.linear(x_, w_, b_), -1)

    for dims in ((0, None, None), (0, 0, None), (None, 0, 0), (1, 0, 0)):
        args = (x.movedim(0, 1) if dims[0] == 1 else x, w if dims[1] == 0 else w[0], b if dims[2] == 0 else b[0])
        got = torch.vmap(gemm_log_softmax, in_dims=dims)(*args)
        want = torch.vmap(form, in_dims=dims)(*args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # fp32: one GEMM vs torch's rule
