"""optimize() leaves a Linear as written where tunedb would serve torch for its key at every size."""
from __future__ import annotations

import torch
from torch import nn

from runtime_fakes import gemm  # noqa: F401  (fixture)
import tunedb
from tunedb import database, tuning_report
from tunedb.families.gemm import FAMILY
from tunedb.families.gemm.costmodel import ModelParams
from tunedb.families.gemm.model import GemmCostModel
from tunedb.families.gemm.patching import TunedLinear, optimize
from tunedb.records import Entry, Region, Signature
from tunedb.runtime import patching as runtime_patching
from tunedb.runtime import report, selector
from tunedb.runtime.fallback_everywhere import fallback_everywhere

TRITON = "b64x64x64_w4_s3_g8"
# a calibrated-looking model: bands with enough samples, measured near N=K=4096 only
BANDS = {"*|*|*": (0.05, 40), "triton_mma|*|*": (0.05, 40), "*+act|*|*": (0.05, 40)}
SUPPORT = {key: ((0.0, 12.0, 12.0), (4.0, 12.0, 12.0)) for key in BANDS}


def _write(tier: str, entries: dict[str, list[Region]], model: dict | None = None) -> None:
    cfgs = {r.config_id for regions in entries.values() for r in regions if r.config_id != "torch"}
    database.write_entries(tier, "gemm", "sm90", [Entry(Signature.parse(s), tuple(r)) for s, r in entries.items()],
                           [FAMILY.parse_config(c) for c in sorted(cfgs)], model=model)
    selector.reload()


class Two(nn.Module):
    def __init__(self, n_a: int, n_b: int, k: int = 32) -> None:
        super().__init__()
        self.a = nn.Linear(k, n_a, bias=False).to(torch.bfloat16)
        self.b = nn.Linear(k, n_b, bias=False).to(torch.bfloat16)

    def forward(self, x):
        return self.a(x).sum() + self.b(x).sum()


def test_torch_only_key_stays_a_linear_and_a_triton_region_is_swapped(tiers_dirs):
    _write("user", {"gemm|op=gemm|dt=bf16|N=64|K=32": [Region(16, "torch"), Region(None, "torch")],
                    "gemm|op=gemm|dt=bf16|N=96|K=32": [Region(16, "torch"), Region(256, TRITON)]})
    m = optimize(Two(64, 96))
    assert type(m.a) is nn.Linear  # torch at every size: the module's own call, untouched
    assert type(m.b) is TunedLinear  # Triton serves 17..256
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    assert torch.equal(m.a(x), torch.nn.functional.linear(x, m.a.weight))


def test_a_size_no_entry_covers_is_left_to_the_model_tier_and_autotune(tiers_dirs):
    """Torch up to M=16, then no entry: above it the model tier (or autotune) may answer, so the
    module is swapped; an unmeasured key is swapped too (autotune must see its calls)."""
    _write("system", {"gemm|op=gemm|dt=bf16|N=4096|K=4096": [Region(16, "torch")]},
           model=ModelParams(uncertainty=BANDS, support=SUPPORT).to_json())
    assert not fallback_everywhere("gemm", Signature.parse("gemm|op=gemm|dt=bf16|N=4096|K=4096"))
    assert not fallback_everywhere("gemm", Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32"))
    _write("system", {"gemm|op=gemm|dt=bf16|N=4096|K=4096": [Region(16, "torch"), Region(None, "torch")]})
    assert fallback_everywhere("gemm", Signature.parse("gemm|op=gemm|dt=bf16|N=4096|K=4096"))


def test_an_fp32_model_left_as_written_is_told_to_cast_not_to_measure(gemm, tiers_dirs):
    m = optimize(Two(64, 96).float())
    keys, why = report.left_as_written(m)
    assert len(keys) == 2 and "2 of them hold float32 weights" in why and "cast to fp16 or bf16" in why
    assert "because no table measured" not in why  # prewarm would find no point to measure


def test_a_model_no_table_covers_is_left_and_autotune_measures_it(gemm, tiers_dirs):
    """A model nobody measured: every key is the fallback's by a guess (no entry covers it), so
    its Linears stay the model's own (session 31: swapping them cost eight unseen models 1.05-1.14x
    plain eagerly, for the same cuBLAS calls). autotune() measures their calls through hooks
    while active (their output stays torch's), publishes, and re-runs optimize() on the model:
    a Linear whose winner is a config is swapped in, one whose winner is torch stays."""
    from runtime_fakes import FakeMeasurer

    from tunedb.runtime.fallback_everywhere import GUESSED, left_reason

    assert left_reason("gemm", Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32")) == GUESSED
    m = optimize(Two(64, 96))
    other = optimize(Two(48, 80))  # a second optimized model that never runs under autotune()
    assert type(m.a) is nn.Linear and type(m.b) is nn.Linear
    keys, why = report.left_as_written(m)
    assert len(keys) == 2 and "2 of them because no table measured their key" in why and "autotune()" in why
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    meas = FakeMeasurer(lambda sig, m_, ids: "torch" if "N=64|" in sig.format() else next(i for i in ids if i != "torch"))
    with tunedb.autotune(cache=None, measurer=meas, arch_family="sm90"):
        torch.testing.assert_close(m(x), Two.forward(m, x))  # torch's output inside the context
    assert {(sig.format(), size) for sig, size, *_ in meas.calls} == {
        ("gemm|op=gemm|dt=bf16|N=64|K=32", 3), ("gemm|op=gemm|dt=bf16|N=96|K=32", 3)}
    assert type(m.b) is TunedLinear  # its winner is a config: swapped in after publishing
    assert type(m.a) is nn.Linear  # torch won (measured at M=3; above it a guess): still left
    assert type(other.a) is nn.Linear and type(other.b) is nn.Linear  # never ran: untouched
    assert not m.a._forward_hooks and not m.b.weight.grad_fn  # the measuring hooks are gone
    copy_ = __import__("copy").deepcopy(other)  # a copy is found by its marks
    assert runtime_patching.swap_left(copy_) and type(copy_.a) is nn.Linear
    bare = optimize(nn.Linear(32, 40, bias=False).to(torch.bfloat16))
    assert type(bare) is nn.Linear and not runtime_patching.swap_left(bare)  # no parent: it stays, marked
    assert report.left_in(bare)


def test_a_guess_the_model_tier_would_serve_is_swapped(tiers_dirs, monkeypatch):
    """Where the cost model would serve a config at some probed size, the Linear is swapped (the
    model tier serves there at run time); where it declines every probe, the Linear is left."""
    from tunedb.families.gemm import signatures
    from tunedb.runtime import fallback_everywhere
    from tunedb.runtime.fallback_everywhere import GUESSED, left_reason

    monkeypatch.setenv("TUNEDB_MODEL_FALLBACK", "1")  # the fixture turns guesses off; back on
    selector.reload()
    asked = []

    class Model:
        def decide(self, sig, m, candidates):
            asked.append(m)
            return None if m < 700 else type("D", (), {"config": candidates[0]})()

    monkeypatch.setattr(selector, "family_model", lambda fam, profile: Model())
    monkeypatch.setattr(selector, "_compiled_set", lambda fam, arch, files: {TRITON: FAMILY.parse_config(TRITON)})
    sig = signatures.make_signature("gemm", "bf16", 96, 32)
    assert left_reason("gemm", sig) is None and max(asked) == 768  # the probe at 768 found the config
    assert type(optimize(Two(64, 96)).b) is TunedLinear
    monkeypatch.setattr(Model, "decide", lambda self, sig, m, candidates: None)
    assert left_reason("gemm", sig) == GUESSED
    assert fallback_everywhere.PROBES[:16] == tuple(range(1, 17)) and fallback_everywhere.PROBES[-1] == 65536


def test_a_measured_piece_is_asked_at_every_probe_not_only_its_top(tiers_dirs):
    """A region's config serves only near the sizes it was measured at, so a piece whose ends
    fall back to torch may still serve the config inside: the Linear must be swapped."""
    from tunedb.runtime import serving

    real = serving.unsupported
    sig_text = "gemm|op=gemm|dt=bf16|N=96|K=32"
    _write("user", {sig_text: [Region(None, TRITON)]})
    # as if TRITON's evidence were at large M only: unsupported below 100 (the piece's ends: 1, 2)
    serving.unsupported = lambda fam, entry, m, cid, native=False: "far" if m < 100 else None
    try:
        assert not fallback_everywhere("gemm", Signature.parse(sig_text))
        assert type(optimize(Two(64, 96)).b) is TunedLinear
    finally:
        serving.unsupported = real


def test_fused_pair_left_whole_and_fp32_weights_judged_under_both_dtypes(tiers_dirs):
    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 64)
            self.act = nn.SiLU()

        def forward(self, x):
            return self.act(self.fc(x))

    silu = "gemm|op=gemm_act|dt={}|N=64|K=32|act=silu|bias=1"
    _write("user", {silu.format("fp16"): [Region(None, "torch")], silu.format("bf16"): [Region(None, "torch")]})
    m = optimize(MLP())  # torch measured at every size under both dtypes
    assert type(m.fc) is nn.Linear and type(m.act) is nn.SiLU
    # an fp32 model may be cast after optimize(): a Triton region under either dtype swaps it
    _write("user", {silu.format("fp16"): [Region(None, TRITON)], silu.format("bf16"): [Region(None, "torch")]})
    m = optimize(MLP())
    assert type(m.fc) is TunedLinear and m.fc.act == "silu" and isinstance(m.act, nn.Identity)


def test_census_mode_and_a_rerun_after_a_new_tier_swap_them(tiers_dirs):
    _write("user", {"gemm|op=gemm|dt=bf16|N=64|K=32": [Region(None, "torch")],
                    "gemm|op=gemm|dt=bf16|N=96|K=32": [Region(None, "torch")]})
    m = runtime_patching.optimize(Two(64, 96), families="all")
    assert type(m.a) is TunedLinear and type(m.b) is TunedLinear  # the census sees every Linear
    assert not runtime_patching.patching_everything()
    m = optimize(Two(64, 96))
    assert type(m.a) is nn.Linear and type(m.b) is nn.Linear
    _write("user", {"gemm|op=gemm|dt=bf16|N=64|K=32": [Region(None, "torch")],
                    "gemm|op=gemm|dt=bf16|N=96|K=32": [Region(None, TRITON)]})  # a tune in process
    first = m.b
    optimize(m)  # re-run: the new tier's key is swapped, the rest stays
    assert type(m.a) is nn.Linear and type(m.b) is TunedLinear and m.b.weight is first.weight
    optimize(m)  # and again: the TunedLinear stays, and stays reported
    assert [rows for name, rows in report.layer_tiers() if name == "Two"][-1] == [
        (("gemm", torch.bfloat16, 96, 32, "none", False), None)]


def test_the_report_names_the_layers_left_as_written(tiers_dirs):
    _write("user", {"gemm|op=gemm|dt=bf16|N=64|K=32": [Region(None, "torch")],
                    "gemm|op=gemm|dt=bf16|N=96|K=32": [Region(None, TRITON)]})
    model = Two(64, 96)
    model.c = nn.Linear(32, 64, bias=False).to(torch.bfloat16)  # same key as a
    optimize(model)
    lines = report.model_lines()
    assert "gemm: 1 linear layer over 1 signature (Two): 0 user, 0 system, 0 cost model, 0 default, 1 not yet run on a GPU" in lines
    assert "gemm: 2 linear layers over 1 signature (Two) left as written (torch serves every size)" in lines
    assert "left as written (torch serves every size)" in tuning_report()
    keys, why = report.left_as_written(model)
    assert keys == [("gemm", torch.bfloat16, 64, 32, "none", False)] * 2 and why == "torch serves every size"


def test_a_bare_linear_torch_serves_is_returned_as_is(tiers_dirs):
    key = "gemm|op=gemm_act|dt={}|N=64|K=32|act=none|bias=1"
    _write("user", {key.format("fp16"): [Region(None, "torch")], key.format("bf16"): [Region(None, "torch")]})
    lin = nn.Linear(32, 64)
    assert optimize(lin) is lin
    assert "left as written" in report.model_lines()[-1]


def test_an_installed_ranker_is_never_second_guessed(tiers_dirs):
    _write("user", {"gemm|op=gemm|dt=bf16|N=64|K=32": [Region(16, "torch")]})  # a ranker answers above 16
    selector.set_ranker("gemm", lambda sig, m, cands: None)
    try:
        assert type(optimize(Two(64, 96)).a) is TunedLinear
    finally:
        selector.set_ranker("gemm", None)


def test_prewarm_sees_an_unmeasured_model_and_serves_its_winners(gemm, tiers_dirs, monkeypatch):
    """A model nobody measured: optimize() leaves its Linears (no entry covers them, and the cost
    model declines); prewarm records their calls, measures them, publishes, and re-runs
    optimize(): the fused pair serves its Triton winner; out's winner is torch, measured at M=4
    only, so above it a guess answers and out stays left (GUESSED)."""
    import tunedb
    from runtime_fakes import FakeMeasurer

    monkeypatch.setenv("TUNEDB_MODEL_FALLBACK", "1")  # the fixture turns guesses off; back on
    selector.reload()

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(32, 64).to(torch.bfloat16)
            self.act = nn.SiLU()
            self.out = nn.Linear(64, 32, bias=False).to(torch.bfloat16)

        def forward(self, x):
            return self.out(self.act(self.fc(x)))

    m = optimize(MLP())
    assert type(m.fc) is nn.Linear and type(m.out) is nn.Linear and type(m.act) is nn.SiLU
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    winner = lambda sig, m_, ids: "torch" if sig.op == "gemm" else next(i for i in ids if i != "torch")  # noqa: E731
    res = tunedb.prewarm(m, (x,), measurer=FakeMeasurer(winner), arch_family="sm90")
    seen = {(p.signature.format(), p.m) for p in res.points}
    assert seen == {("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=silu|bias=1", 4), ("gemm|op=gemm|dt=bf16|N=32|K=64", 4)}
    assert type(m.fc) is TunedLinear and m.fc.act == "silu" and isinstance(m.act, nn.Identity)
    assert type(m.out) is nn.Linear
