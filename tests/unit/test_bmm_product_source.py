"""optimize() installs the bmm family's ProductMode hooks only on a model whose code can make a
product the mode serves (families/bmm/product_source.py): the hooks cost a backed-off eager
forward 10-30 us on the H200's host, and an SDPA model makes no product for them."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tunedb.families.bmm import product_source, serving  # noqa: E402


# a model file of its own (this one holds products: EagerAttention below)
SDPA_SOURCE = """
from torch import nn


class SdpaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    @property
    def width(self):
        return 8

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return nn.functional.scaled_dot_product_attention(q, k, v)
"""


@pytest.fixture
def SdpaBlock(tmp_path, monkeypatch):
    import importlib.util
    import sys

    path = tmp_path / "sdpa_model.py"
    path.write_text(SDPA_SOURCE)
    spec = importlib.util.spec_from_file_location("sdpa_model", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sdpa_model", module)  # imported as a user's model file is
    spec.loader.exec_module(module)
    return module.SdpaBlock


class EagerAttention(nn.Module):
    def forward(self, q, k):
        return (q @ k.transpose(-1, -2)).softmax(-1)


@pytest.fixture
def tables_and_cuda(monkeypatch):
    monkeypatch.setattr(serving, "has_table", lambda: True)
    monkeypatch.setattr(serving, "can_serve", lambda: True)


def test_a_model_without_products_gets_no_hooks(tables_and_cuda, SdpaBlock):
    model = serving.optimize(nn.Sequential(SdpaBlock(), nn.LayerNorm(8)))
    assert not model._forward_pre_hooks and not getattr(model, "_tunedb_bmm_serving", False)


def test_a_model_that_can_make_products_gets_the_hooks(tables_and_cuda):
    model = serving.optimize(nn.Sequential(nn.Linear(8, 8), EagerAttention()))
    assert model._tunedb_bmm_serving and model._forward_pre_hooks


@pytest.mark.parametrize("make", [lambda: nn.MultiheadAttention(8, 2), lambda: nn.TransformerEncoderLayer(8, 2)],
                         ids=["nn.MultiheadAttention", "nn.TransformerEncoderLayer"])
def test_torch_nn_attention_gets_no_hooks(tables_and_cuda, make):
    # their products run inside F.multi_head_attention_forward, a torch function the mode sees
    # whole and does not enter: the mode never serves them
    model = serving.optimize(make())
    assert not getattr(model, "_tunedb_bmm_serving", False)


def test_a_model_holding_torch_attention_gets_no_hooks_even_with_products(tables_and_cuda):
    # any TorchFunctionMode turns nn.MultiheadAttention's and nn.TransformerEncoderLayer's native
    # fast path off (has_torch_function is true under a mode), in CUDA graphs too
    from torch.overrides import has_torch_function

    x = torch.randn(2)
    with serving.product_mode():
        assert has_torch_function((x,))  # why: the fast paths check exactly this
    for attention in (nn.MultiheadAttention(8, 2, batch_first=True), nn.TransformerEncoderLayer(8, 2)):
        model = serving.optimize(nn.ModuleList([EagerAttention(), attention]))
        assert not getattr(model, "_tunedb_bmm_serving", False) and not model._forward_pre_hooks
    assert serving.optimize(nn.ModuleList([EagerAttention()]))._tunedb_bmm_serving


def _load(tmp_path, monkeypatch, name, source):
    import importlib.util
    import sys

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_a_product_in_an_imported_user_module_counts(tmp_path, monkeypatch):
    _load(tmp_path, monkeypatch, "attn_helpers", "def scores(q, k):\n    return q @ k.transpose(-1, -2)\n")
    model_module = _load(tmp_path, monkeypatch, "helper_model", (
        "from torch import nn\nfrom attn_helpers import scores\n\n\nclass Block(nn.Module):\n"
        "    def forward(self, x):\n        return scores(x, x)\n"))
    product_source._file_has_products.cache_clear()
    assert product_source.makes_products(nn.Sequential(model_module.Block()))


def test_a_replaced_forward_or_a_users_hook_counts(SdpaBlock):
    block = SdpaBlock()
    assert not product_source.makes_products(nn.Sequential(block))
    hooked = SdpaBlock()
    hooked.register_forward_hook(lambda mod, args, out: None)
    assert product_source.makes_products(nn.Sequential(hooked))
    replaced = SdpaBlock()
    replaced.forward = lambda x: x
    assert product_source.makes_products(nn.Sequential(replaced))


def test_a_class_whose_source_cannot_be_read_counts_as_making_products():
    scope = {"nn": nn}
    exec("class Hidden(nn.Module):\n    def forward(self, x):\n        return x\n", scope)
    assert product_source.makes_products(nn.Sequential(scope["Hidden"]()))


@pytest.mark.parametrize("code,want", [
    ("y = torch.matmul(a, b)", True), ("y = a.bmm(b)", True), ("a @= b", True), ("from torch import matmul", True),
    ("y = torch.einsum('ij,jk', a, b)", False), ("@property\ndef f(self): return 1", False),
])
def test_what_counts_as_a_product_in_a_file(tmp_path, code, want):
    path = tmp_path / "m.py"
    path.write_text(code + "\n")
    product_source._file_has_products.cache_clear()
    assert product_source._file_has_products(str(path)) is want


def test_tunedbs_own_hooks_do_not_count_as_a_users(SdpaBlock):
    model = serving.install(nn.Sequential(SdpaBlock()))
    assert model._forward_pre_hooks and not product_source.makes_products(model)


def test_a_product_torch_serves_is_not_reshaped_again(monkeypatch):
    # a head-split operand's reshape is a copy: once the call's decision is torch, the mode hands
    # the product back untouched (session 31: einsum attention was 1.09x slower in CUDA graphs)
    from tunedb.families.bmm import ops

    folds = []
    real = serving._folded
    monkeypatch.setattr(serving, "eligible", lambda a, b: True)
    monkeypatch.setattr(serving, "_folded", lambda a, b: folds.append(1) or real(a, b))
    from types import SimpleNamespace

    monkeypatch.setattr(ops, "bound_for", lambda a3, b3: SimpleNamespace(signature="bmm|..."))
    monkeypatch.setattr(ops, "serves_torch", lambda bound: True)
    monkeypatch.setattr(serving, "may_become_tile", lambda signature: False)
    serving._decisions.clear()
    a = torch.randn(2, 3, 5, 4)
    v = torch.randn(2, 5, 3, 4).transpose(1, 2)  # (2, 3, 5, 4), batch dims that do not merge
    assert serving.serve(a.transpose(-1, -2), v) is None and folds == [1]
    assert serving.serve(a.transpose(-1, -2), v) is None and folds == [1]  # decided: no fold
    assert serving.serve(a.transpose(-1, -2), v.contiguous()) is None and folds == [1, 1]  # other strides: another call
    serving._decisions.clear()
