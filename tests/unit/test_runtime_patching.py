"""optimize(): which Linears become TunedLinear, which activations fuse, and outputs unchanged."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime_fakes import gemm  # noqa: F401  (fixture)
from fusion_models_s40 import InitsWithModules, ReachesIntoItsSequential, WalkedBlock, WalksABlocksChildren
from tunedb.runtime import launch_table, report
from tunedb.families.gemm.fusion_plan import activation_kind
from tunedb.families.gemm.patching import TunedLinear, optimize

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


# This file is the source of its models, and optimize() refuses to fuse an activation (or a
# Linear) whose attribute name the model's source files read off another module as a value; so
# the tests read a TunedLinear's `act` as `layer.__dict__["act"]` and a model's activation child
# through `_modules`, which are not such reads.


class WhisperLikeLayer(nn.Module):
    """The feed-forward half of HF's WhisperEncoderLayer, written as HF writes it."""

    def __init__(self, d=32, ffn=64):
        super().__init__()
        self.final_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)
        self.activation_fn = nn.GELU()
        self.activation_dropout = 0.0

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        hidden_states = self.fc2(hidden_states)
        return residual + hidden_states


class LlamaLikeMLP(nn.Module):
    """HF's LlamaMLP."""

    def __init__(self, d=32, inter=48):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class ConformerLikeFeedForward(nn.Module):
    """torchaudio's _FeedForwardModule."""

    def __init__(self, d=32, hidden=64):
        super().__init__()
        self.sequential = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, hidden, bias=True), nn.SiLU(),
                                        nn.Dropout(0.0), nn.Linear(hidden, d, bias=True), nn.Dropout(0.0))

    def forward(self, x):
        return self.sequential(x)


class ReusesOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.fc(x)
        return self.act(h) + h  # fc's output is used twice: not fusable


class ActTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x)) + self.act(x)  # blanking act would change the second use


class StatementStyle(nn.Module):
    """x = self.fc1(x); x = self.act(x): the style of NeMo's and many other feed-forwards."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        return self.fc2(x)


class KeepsPreActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.act = nn.SiLU()

    def forward(self, x):
        h = self.fc(x)
        y = self.act(h)  # h stays alive under another name
        return y * h


class NotAdjacent(StatementStyle):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        x = self.fc1(x)
        x = self.drop(x)
        x = self.act(x)
        return self.fc2(x)


class WeightReadElsewhere(StatementStyle):
    @property
    def width(self):
        return self.fc1.out_features


def _check_same(model, x, **kw):
    ref = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        want = model(x)
        tuned = optimize(model, **kw)
        got = tuned(x)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(ref, tuned.parameters()))
    return tuned


def _tuned(model):
    return {name: (m.__dict__["act"], m.bias is not None) for name, m in model.named_modules() if isinstance(m, TunedLinear)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whisper_like_layer_fuses_fc1_and_gelu(dtype):
    model = nn.Sequential(WhisperLikeLayer(), WhisperLikeLayer()).to(dtype)
    tuned = _check_same(model, torch.randn(2, 5, 32, dtype=dtype))
    assert _tuned(tuned) == {"0.fc1": ("gelu", True), "0.fc2": ("none", True),
                             "1.fc1": ("gelu", True), "1.fc2": ("none", True)}
    assert isinstance(tuned[0]._modules["activation_fn"], nn.Identity)


def test_llama_like_mlp_fuses_silu_into_gate_proj_only():
    tuned = _check_same(LlamaLikeMLP(), torch.randn(3, 32))
    assert _tuned(tuned) == {"gate_proj": ("silu", False), "up_proj": ("none", False),
                             "down_proj": ("none", False)}


def test_conformer_like_feed_forward_fuses_through_the_sequential():
    tuned = _check_same(ConformerLikeFeedForward(), torch.randn(4, 7, 32))
    assert _tuned(tuned) == {"sequential.1": ("silu", True), "sequential.4": ("none", True)}
    assert isinstance(tuned._modules["sequential"][2], nn.Identity)


class IndexesItsSequential(nn.Module):
    """Reads a Sequential's Linear on its own: its pre-activation output is wanted."""

    def __init__(self, d=32):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))

    def forward(self, x):
        return self.mlp(x) + self.mlp[0](x)


class WalksItsSequential(nn.Module):
    """Runs a Sequential's children one by one and keeps every intermediate output."""

    def __init__(self, d=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.SiLU())

    def forward(self, x):
        feats = []
        for layer in self.body:
            x = layer(x)
            feats.append(x)
        return torch.cat(feats, -1)


def test_a_modules_walk_in_init_and_an_empty_slot_leave_fusion_alone():
    tuned = _check_same(InitsWithModules(), torch.randn(3, 32))
    assert _tuned(tuned) == {"mlp.fc": ("gelu", True)}


@pytest.mark.parametrize("how", ["children", "get_submodule", "_modules"])
def test_no_fusion_in_a_sequential_whose_children_are_reached_by_a_method(how):
    tuned = _check_same(ReachesIntoItsSequential(how=how), torch.randn(3, 32))
    assert all(act == "none" for act, _ in _tuned(tuned).values()), _tuned(tuned)
    assert not any(isinstance(m, nn.Identity) for m in tuned.head)
    assert type(tuned.head[3]) is nn.LogSoftmax  # the log-softmax head stays as written too


def test_no_fusion_in_a_block_whose_holder_walks_its_children():
    tuned = _check_same(WalksABlocksChildren(), torch.randn(3, 32))
    assert _tuned(tuned) == {"block.fc": ("none", True)}
    assert isinstance(tuned.block.act, nn.GELU)
    tuned = _check_same(WalkedBlock(), torch.randn(3, 32))  # the same block called whole: fused
    assert _tuned(tuned) == {"fc": ("gelu", True)}


@pytest.mark.parametrize("module,seq", [(IndexesItsSequential, "mlp"), (WalksItsSequential, "body")])
def test_no_fusion_in_a_sequential_whose_children_run_one_by_one(module, seq):
    tuned = _check_same(module(), torch.randn(3, 32))
    assert all(act == "none" for act, _ in _tuned(tuned).values()), _tuned(tuned)
    assert not any(isinstance(m, nn.Identity) for m in tuned._modules[seq])


@pytest.mark.parametrize("module", [ReusesOutput, ActTwice])
def test_no_fusion_when_the_output_or_activation_is_used_elsewhere(module):
    tuned = _check_same(module(), torch.randn(3, 32))
    assert _tuned(tuned) == {"fc": ("none", True)}
    assert not isinstance(tuned._modules["act"], nn.Identity)


def test_statement_style_fuses_and_its_unsafe_variants_do_not():
    tuned = _check_same(StatementStyle(), torch.randn(3, 32))
    assert _tuned(tuned) == {"fc1": ("relu", True), "fc2": ("none", True)}
    for module, linear in ((KeepsPreActivation, "fc"), (NotAdjacent, "fc1"), (WeightReadElsewhere, "fc1")):
        tuned = _check_same(module(), torch.randn(3, 32))
        assert _tuned(tuned)[linear] == ("none", True), module.__name__
        assert not isinstance(tuned._modules["act"], nn.Identity)


def test_shared_linear_is_swapped_once_and_never_fused():
    shared = nn.Linear(32, 32)
    model = nn.Sequential(nn.Sequential(shared, nn.ReLU()), nn.Sequential(shared, nn.GELU()))
    tuned = _check_same(model, torch.randn(3, 32))
    assert tuned[0][0] is tuned[1][0] and tuned[0][0].__dict__["act"] == "none"
    assert isinstance(tuned[0][1], nn.ReLU)


def test_hooked_modules_and_sequential_subclasses_are_left_alone():
    class MySeq(nn.Sequential):
        def forward(self, x):
            return super().forward(x) * 2

    hooked = nn.Linear(32, 32)
    fired = []
    hooked.register_forward_hook(lambda *a: fired.append(1))
    model = nn.Sequential(hooked, nn.ReLU(), MySeq(nn.Linear(32, 32), nn.GELU()))
    tuned = _check_same(model, torch.randn(2, 32))
    assert tuned[0] is hooked and isinstance(tuned[1], nn.ReLU) and len(fired) == 2
    assert _tuned(tuned) == {"2.0": ("none", True)}


def test_activation_kinds():
    assert activation_kind(nn.GELU()) == "gelu"
    assert activation_kind(nn.GELU(approximate="tanh")) == "gelu_tanh"
    assert activation_kind(nn.ReLU(inplace=True)) == "relu"
    assert activation_kind(nn.SiLU()) == "silu"
    assert activation_kind(nn.Tanh()) is None


def test_inplace_false_copies_and_state_dict_keys_are_kept():
    model = ConformerLikeFeedForward()
    keys = list(model.state_dict())
    copy = optimize(model, inplace=False)
    assert copy is not model and not _tuned(model)
    assert list(copy.state_dict()) == keys
    copy.load_state_dict(model.state_dict())
    bare = optimize(nn.Linear(8, 4))
    assert isinstance(bare, TunedLinear)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        optimize(lambda x: x)


def test_tuning_report_counts_layers_per_tier(gemm):
    model = optimize(nn.Sequential(LlamaLikeMLP(), ConformerLikeFeedForward()).to(torch.bfloat16))
    lines = report.model_lines()
    assert any(line.startswith("gemm: 5 linear layers over 5 signatures (Sequential)")
               and line.endswith("5 not yet run on a GPU") for line in lines)
    for layer in [m for m in model.modules() if isinstance(m, TunedLinear)][:3]:
        x = torch.randn(6, layer.in_features, dtype=torch.bfloat16)
        op = "gemm" if layer.bias is None and layer.__dict__["act"] == "none" else "gemm_act"
        launch_table.launcher(op, x, layer.weight, layer.bias, layer.__dict__["act"], 6)
    line = [l for l in report.model_lines() if "(Sequential)" in l][-1]
    assert line.endswith(": 0 user, 0 system, 0 cost model, 3 default, 2 not yet run on a GPU")
    assert "(Sequential)" in report.tuning_report()


def test_real_hugging_face_whisper_and_llama_when_installed():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    wcfg = transformers.WhisperConfig(d_model=32, encoder_attention_heads=4, encoder_ffn_dim=64,
                                      encoder_layers=2, num_mel_bins=8, max_source_positions=16)
    enc = WhisperEncoder(wcfg).eval()
    feats = torch.randn(1, 8, 32)
    with torch.no_grad():
        want = enc(feats).last_hidden_state
        optimize(enc)
        got = enc(feats).last_hidden_state
    assert torch.equal(got, want)
    fused = {n: m.__dict__["act"] for n, m in enc.named_modules() if isinstance(m, TunedLinear) and m.__dict__["act"] != "none"}
    assert fused == {"layers.0.fc1": "gelu", "layers.1.fc1": "gelu"}
    lcfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4)
    mlp = LlamaMLP(lcfg)
    tuned = _check_same(mlp, torch.randn(2, 3, 32))
    assert tuned.gate_proj.__dict__["act"] == "silu"


def test_approximate_opt_in_is_process_wide_and_starts_an_epoch(tiers_dirs):
    from tunedb import settings
    from tunedb.runtime import selector
    with settings.override(APPROXIMATE=None):
        epoch = selector.epoch()
        optimize(WhisperLikeLayer())
        assert not settings.approximate_allowed() and selector.epoch() == epoch
        tuned = optimize(WhisperLikeLayer(), approximate=True)
        assert settings.approximate_allowed() and selector.epoch() > epoch
        assert tuned.fc1.approximate and tuned.fc1.__dict__["act"] == "gelu"  # the op stays exact GELU
