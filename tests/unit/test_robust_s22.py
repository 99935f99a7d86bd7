"""Session 22's robustness pass of the default path on models nobody measured (CPU): what a
plain model does (TorchScript, tracing, checkpoints, argument errors) an optimized one does."""
from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import tunedb
from tunedb.errors import RegistryError
from tunedb.families.bmm import serving as bmm_serving
from tunedb.runtime import patching


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _optimized(plain: nn.Module) -> nn.Module:
    # families="all": every Linear swapped (none left as written), so TunedLinear is what runs
    return tunedb.optimize(copy.deepcopy(plain), families="all")


def test_an_optimized_model_scripts_and_the_script_calls_the_tuned_op():
    torch.manual_seed(0)
    plain = MLP().eval()
    model = _optimized(plain)
    assert [type(m).__name__ for m in (model.fc1, model.fc2)] == ["TunedLinear"] * 2
    scripted = torch.jit.script(model)  # failed: TunedLinear.forward is not TorchScript
    assert "tunedb::gemm_act" in str(scripted.inlined_graph)
    assert type(model.fc1).__name__ == "TunedLinear"  # scripting left the eager model as it was
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        want = plain(x)
        torch.testing.assert_close(scripted(x), want)
        torch.testing.assert_close(loaded(x), want)
        torch.testing.assert_close(model(x), want)


@pytest.mark.parametrize("grad", [True, False])
def test_an_optimized_model_traces_with_the_check_on_and_records_the_tuned_op(grad):
    # torch.jit.trace re-runs the model under no_grad to check the trace: the first run (grad
    # on, weights requiring grad) went through the dispatcher, the check's through F.linear,
    # and every trace of an optimized model failed "Graphs differed across invocations"
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    model = _optimized(plain)
    x = torch.randn(5, 16)
    with torch.set_grad_enabled(grad):
        traced = torch.jit.trace(model, (x,))
    # the unfused Linear: the op itself (a Triton launch would be invisible to the trace)
    assert "tunedb::gemm_act" in str(traced.inlined_graph)
    y = torch.randn(7, 16)
    with torch.no_grad():
        torch.testing.assert_close(traced(y), plain(y))


def test_without_cuda_the_bmm_product_mode_is_not_installed_and_the_model_scripts(monkeypatch):
    # sm90 (the arch planned for without a GPU) ships a bmm table: optimize() hooked every
    # model's forward with a mode that serves CUDA products only, and the hooks made
    # torch.jit.script fail ("Hook '_exit' ... expected the input argument to be typed as a
    # Tuple") and torch.jit.trace's check fail on a model with nothing swapped
    monkeypatch.setattr(bmm_serving, "has_table", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.manual_seed(0)
    plain = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    model = tunedb.optimize(copy.deepcopy(plain))
    assert not model._forward_hooks and not model._forward_pre_hooks
    x = torch.randn(2, 5, 16)
    scripted = torch.jit.script(model)
    traced = torch.jit.trace(model, (x, x, x))
    with torch.no_grad():
        want = plain(x, x, x)[0]
        torch.testing.assert_close(scripted(x, x, x)[0], want)
        torch.testing.assert_close(traced(x, x, x)[0], want)


def test_the_product_mode_is_still_installed_where_cuda_runs(monkeypatch):
    monkeypatch.setattr(bmm_serving, "has_table", lambda: True)
    monkeypatch.setattr(bmm_serving, "can_serve", lambda: True)
    from tunedb.families.bmm import product_source

    monkeypatch.setattr(product_source, "makes_products", lambda model: True)  # (its own test: test_bmm_product_source)
    model = tunedb.optimize(nn.Sequential(nn.Linear(4, 4)))
    assert getattr(model, "_tunedb_bmm_serving", False)


@pytest.mark.parametrize("bad", [3, [3], b"gemm", {"gemm": True}])
def test_families_of_the_wrong_type_names_the_value_and_what_is_allowed(bad):
    with pytest.raises(RegistryError) as err:
        tunedb.optimize(nn.Linear(4, 4), families=bad)
    assert repr(bad) in str(err.value) and '"all"' in str(err.value) and "gemm" in str(err.value)
    assert patching.patching_families(iter(["gemm"])) == ("gemm",)  # any iterable of names


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.LSTM(16, 8, num_layers=2, batch_first=True, bidirectional=True, proj_size=4)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x)[0])


def test_a_swapped_rnn_keeps_the_plain_models_names_keys_and_class():
    # the TunedRNN wrapper (before session 35) renamed parameters under `rnn.` (an optimizer's
    # param groups or a name filter saw other names) and was no nn.LSTM; its state_dict needed hooks
    torch.manual_seed(0)
    plain = Tagger().eval()
    model = _optimized(Tagger()).eval()
    assert type(model.enc).__name__ == "TunedLSTM" and isinstance(model.enc, nn.LSTM)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert list(model.state_dict()) == list(plain.state_dict())
    model.load_state_dict(plain.state_dict())  # strict
    x = torch.randn(3, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x))
    fresh = Tagger().eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), plain(x))
    assert repr(model.enc).startswith("TunedLSTM(16, 8")  # nn's extra_repr, the sizes


def test_a_subclass_of_lstm_is_left_as_written():
    class Mine(nn.LSTM):
        def forward(self, x, hx=None):
            return super().forward(x * 2, hx)

    model = _optimized(nn.Sequential(Mine(4, 8)))
    assert type(model[0]) is Mine
