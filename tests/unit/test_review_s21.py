"""Session 21's review on the CPU: models nobody gave us through the public API (each test fails
before its fix)."""
from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

import tunedb

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


def _conv_bn_act() -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv1d(4, 4, 3, groups=4), nn.BatchNorm1d(4), nn.SiLU()).eval()
    m[1].running_mean.uniform_()
    m[1].running_var.uniform_(0.5, 2.0)
    return m


def _same(model: nn.Module, x: torch.Tensor) -> None:
    ref = copy.deepcopy(model)
    got = tunedb.optimize(model, families="all")(x)
    torch.testing.assert_close(got, ref(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("where", [0, 1])
def test_conv_bn_act_is_not_fused_past_a_users_hook(where):
    # a forward hook that changes the conv's or the norm's output: fused, the
    # hooked module's own output was never produced and the hook's change was lost
    m = _conv_bn_act()
    m[where].register_forward_hook(lambda mod, args, out: out + 1.0)
    _same(m, torch.randn(2, 4, 10))


def test_conv2d_act_is_not_fused_past_a_hook_and_the_activations_hook_still_fires():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    m[0].register_forward_hook(lambda mod, args, out: out - 1.0)
    _same(m, torch.randn(2, 3, 8, 8))
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    calls = []
    m[1].register_forward_hook(lambda mod, args, out: calls.append(1))
    tunedb.optimize(m, families="all")(torch.randn(2, 3, 8, 8))
    assert calls == [1]


def test_a_batch_norm_held_in_two_places_is_not_absorbed():
    # the absorbed norm passed its input through at its other caller too
    class TwoUses(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = _conv_bn_act()
            self.norm = self.seq[1]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.seq(x))

    _same(TwoUses().eval(), torch.randn(2, 4, 10))


def test_a_conv_held_in_two_places_is_not_fused_with_an_activation():
    class TwoUses(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.seq = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1), nn.ReLU())
            self.conv = self.seq[0]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x) - self.seq(x)

    _same(TwoUses(), torch.randn(2, 3, 8, 8))


def test_a_folded_conv_in_eval_mode_deepcopies_and_backpropagates_twice():
    # the fold was cached with its autograd graph: deepcopy refused the non-leaf tensors, and the
    # second backward walked the graph the first had freed
    plain = _conv_bn_act()
    ref = copy.deepcopy(plain)
    m = tunedb.optimize(plain, families="all")
    x = torch.randn(2, 4, 10)
    m(x)
    copy.deepcopy(m)
    for _ in range(2):
        m.zero_grad()
        ref.zero_grad()
        m(x).sum().backward()
        ref(x).sum().backward()
        torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x))


class _Tagger(nn.Module):
    """A model whose own forward reads its LSTM's attributes and calls flatten_parameters()."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lstm.flatten_parameters()
        h0 = x.new_zeros(self.lstm.num_layers, x.shape[0], self.lstm.hidden_size)
        return self.fc(self.lstm(x, (h0, h0))[0])


def test_an_optimized_lstm_keeps_its_attributes_and_pickles(tmp_path):
    # TunedRNN had no hidden_size / flatten_parameters (AttributeError in the model's forward),
    # and was a class made inside a function, which torch.save could not name
    torch.manual_seed(0)
    plain = _Tagger()
    ref = copy.deepcopy(plain)
    model = tunedb.optimize(plain, families="all")
    assert type(model.lstm).__name__ == "TunedLSTM" and isinstance(model.lstm, nn.LSTM)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(model(x), ref(x))
    torch.save(model, tmp_path / "m.pt")
    again = torch.load(tmp_path / "m.pt", weights_only=False)
    torch.testing.assert_close(again(x), ref(x))


def test_a_hooked_lstm_is_left_as_it_is():
    model = nn.Sequential(nn.LSTM(8, 16))
    model[0].register_forward_hook(lambda mod, args, out: None)
    assert type(tunedb.optimize(model, families="all")[0]) is nn.LSTM


def test_prewarm_of_an_optimized_fp32_model_has_nothing_to_measure():
    # no family serves an fp32 GEMM, so its calls record no point; prewarm raised "run
    # tunedb.optimize(model) first" on a model that had been optimized (and on its deepcopy)
    model = tunedb.optimize(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)))
    x = torch.randn(2, 16)
    for m in (model, copy.deepcopy(model)):
        got = tunedb.prewarm(m, (x,), strict=True)
        assert got.points == () and got.uncovered == ()
    with pytest.raises(ValueError, match="optimize"):  # a model never optimized still hears it
        tunedb.prewarm(nn.Sequential(nn.Linear(16, 32)).half(), (x.half(),))


@pytest.mark.parametrize("kwargs, named", [
    ({"cache": 123}, "cache=123"), ({"top_k": "a"}, "top_k='a'"), ({"top_k": -1}, "top_k=-1"),
    ({"enabled": "yes"}, "enabled='yes'"), ({"publish": None}, "publish=None"),
    ({"working_set_bytes": -5}, "working_set_bytes=-5"),
])
def test_autotune_names_a_bad_argument_when_entered(kwargs, named):
    # they were taken as given: a bad top_k failed at the first shape measured (a comparison
    # with len() inside the model's forward, on a GPU), a truthy string enabled measuring
    with pytest.raises((TypeError, ValueError), match=named):
        tunedb.autotune(**kwargs)


def _ctc_head() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 29), nn.LogSoftmax(dim=-1)).to(torch.bfloat16)


def test_an_optimized_log_softmax_head_pickles(tmp_path):
    # the fused head was a class made inside a function, which torch.save could not name
    model = tunedb.optimize(_ctc_head(), families="all")
    assert type(model[2]).__name__ == "TunedLinearLogSoftmax"
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    torch.save(model, tmp_path / "m.pt")
    torch.testing.assert_close(torch.load(tmp_path / "m.pt", weights_only=False)(x), model(x))


@pytest.mark.parametrize("where", [2, 3])
def test_a_hooked_linear_or_log_softmax_is_not_fused_into_a_head(where):
    model = _ctc_head()
    model[where].register_forward_hook(lambda mod, args, out: out * 2.0)
    _same(model, torch.randn(3, 16, dtype=torch.bfloat16))


@pytest.mark.parametrize("spec", [":", ":make", ".rel:make", "broken_wl_s21:make"])
def test_tune_names_a_workload_it_cannot_load(spec, tmp_path, monkeypatch, capsys):
    # a user module failing at import, an empty or relative module name: a traceback (exit 1)
    # instead of the one-line error naming the workload
    from tunedb import cli

    (tmp_path / "broken_wl_s21.py").write_text("raise RuntimeError('import boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["tune", spec]) == 2
    err = capsys.readouterr().err
    assert f"workload {spec!r}" in err and "Traceback" not in err


@pytest.mark.parametrize("kwargs", [{"inplace": "no"}, {"approximate": "no"}, {"approximate": None}])
def test_optimize_names_a_flag_that_is_not_a_bool(kwargs):
    # a truthy "no" patched the caller's model in place (inplace="no"), or opted the whole
    # process in to approximating arms (approximate="no")
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    with pytest.raises(TypeError, match=f"{next(iter(kwargs))}="):
        tunedb.optimize(model, **kwargs)
    assert type(model[0]) is nn.Linear


def test_recommend_takes_numpy_and_torch_integers():
    # n and batch read off an array's shape or a numpy count were refused ("n=np.int64(16) must
    # be an int"); a float or a bool still is
    np = pytest.importorskip("numpy")
    want = tunedb.recommend("potrf", "fp32", 16, 64)
    assert tunedb.recommend("potrf", "fp32", np.int64(16), np.int32(64)) == want
    assert tunedb.recommend("potrf", "fp32", torch.tensor(16), 64) == want
    for bad in (16.0, True):
        with pytest.raises(ValueError, match="n="):
            tunedb.recommend("potrf", "fp32", bad, 64)


def test_a_saved_model_with_swapped_moe_experts_loads_and_serves(tmp_path):
    # the experts' forward was a bound method, which pickle names by the attribute
    # `tuned_forward` the module lacks: torch.save wrote a file torch.load could not read
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2)
    torch.manual_seed(0)
    plain = transformers.MixtralForCausalLM(cfg).eval().to(torch.bfloat16)
    ref = copy.deepcopy(plain)
    model = tunedb.optimize(plain, families="all")
    experts = model.model.layers[0].mlp.experts
    assert experts._tunedb_group_gemm
    torch.save(model, tmp_path / "m.pt")
    again = torch.load(tmp_path / "m.pt", weights_only=False)
    loaded = again.model.layers[0].mlp.experts
    assert loaded.forward.args[0] is loaded  # bound to the loaded module, not the saved one
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, ref(input_ids=ids).logits, atol=2e-2, rtol=2e-2)


def test_a_folded_conv_exports_under_no_grad_after_an_eager_call():
    # the fold's cache key read each tensor's data pointer, which torch.export's fake tensors
    # do not have (RuntimeError: Cannot access data pointer of Tensor)
    plain = _conv_bn_act()
    ref = copy.deepcopy(plain)
    model = tunedb.optimize(plain, families="all")
    x = torch.randn(2, 4, 10)
    with torch.no_grad():
        model(x)
        exported = torch.export.export(model, (x,))
        torch.testing.assert_close(exported.module()(x), ref(x))


class _ClosureHeld(nn.Module):
    """fc's raw output is also read through a lambda made in __init__."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.raw = lambda x: self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + self.raw(x)


class _CachedPropertyHeld(nn.Module):
    """fc's raw output is also read through a cached_property."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    @functools.cached_property
    def raw(self):
        return self.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) - self.raw(x)


@pytest.mark.parametrize("cls", [_ClosureHeld, _CachedPropertyHeld])
def test_a_linear_read_outside_the_methods_is_not_fused(cls):
    # fusion rule 2 counted the attribute's uses in methods and properties only: a closure made
    # in __init__ or a cached_property also calling self.fc got the fused gelu(fc(x))
    torch.manual_seed(0)
    ref = cls()
    torch.manual_seed(0)
    model = tunedb.optimize(cls())
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x), ref(x))
    assert model.fc.act == "none"


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.up = nn.Linear(8, 8)  # fc's twin, which no code here calls from outside the block
        self.act2 = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + self.act2(self.up(x))


def _raw_of(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block.fc(x)


class _Outer(nn.Module):
    """Reads the block's fc output from outside the block, as `how` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.block = _Block()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "method":  # an outer method calls it
            return self.block(x) + self.block.fc(x)
        if self.how == "helper":  # a module-level helper function does
            return self.block(x) + _raw_of(self.block, x)
        return self.block(x) + getattr(self.block, "fc")(x)  # a literal getattr


@pytest.mark.parametrize("how", ["method", "helper", "getattr"])
def test_a_linear_called_from_outside_its_module_is_not_fused(how):
    # fusion rule 2 read only the owner's class: `self.block.fc(x)` elsewhere got gelu(fc(x)); a
    # module-level helper or a literal getattr reaching it did too (the review, up to 1.65 off).
    # The block's twin Linear, called only by the block, still fuses.
    torch.manual_seed(0)
    ref = _Outer(how)
    torch.manual_seed(0)
    model = tunedb.optimize(_Outer(how))
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x), ref(x))
    assert model.block.fc.act == "none" and model.block.up.act == "gelu"
