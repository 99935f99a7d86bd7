"""Sibling projections in one launch (families/gemm/siblings.py, sibling_source.py,
kernels_siblings.py): which calls the source rule groups, what the run time hands each member
(never another tensor's output, never a stale one), and the kernel under the interpreter."""
from __future__ import annotations

import copy
import pickle
import sys

import pytest
import torch
from torch import nn

import interpret_child
import tunedb
from tunedb import settings
from tunedb.families.gemm import kernels_siblings, patching, siblings
from tunedb.families.gemm.sibling_source import sibling_calls

from sibling_models import (Aliased, Attn, Block, CalledTwice, Conditional, Cross, InPlaceBetween, OneExpr, Rebound,
                            ShapeRead)


def test_the_source_rule_groups_only_unconditional_calls_on_one_unrebound_name():
    assert sibling_calls(Attn) == (("q_proj", "k_proj", "v_proj"),)
    assert sibling_calls(Cross) == (("k_proj", "v_proj"),)  # q runs on another name (h, not kv)
    assert sibling_calls(Rebound) == ()  # h is rebound between the calls
    assert sibling_calls(Conditional) == ()  # b or c may not run
    assert sibling_calls(CalledTwice) == ()  # a is called elsewhere too
    assert sibling_calls(Block) == ()  # a loop between the calls
    assert set(map(frozenset, sibling_calls(OneExpr))) == {frozenset({"gate", "up"})}
    assert sibling_calls(InPlaceBetween) == ()  # h changed in place between the calls
    assert sibling_calls(Aliased) == ()  # h aliased between them
    assert sibling_calls(ShapeRead) == (("a", "b"),)  # reading h.shape changes nothing


class _Fake:
    """kernels_siblings.site_for on the CPU: a launch site computing F.linear per member (the
    kernel's argument order: x, three weights, three outputs, three biases), counting launches."""

    def __init__(self) -> None:
        self.launches = 0

    def site_for(self, ns, k, has_bias, acts, interpret=False, tiles=None, m=1):
        self.rows, self.tiles = m, tiles

        def site(grid, x, *ptrs):
            self.launches += 1
            for i, a in enumerate(acts):
                y = torch.nn.functional.linear(x.view(m, k), ptrs[i], ptrs[6 + i] if has_bias else None)
                ptrs[3 + i].copy_({"none": y, "silu": torch.nn.functional.silu(y)}[a].view(-1))
        return site, (1,)


def _group(bias: bool = False, dtype=torch.float16):
    torch.manual_seed(0)
    attn = Attn(bias=bias).to(dtype).requires_grad_(False)  # inference weights (or calls under no_grad)
    members = [patching.TunedLinear(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")]
    g = siblings.SiblingGroup(members)
    g._arch_ok = True
    return g, members


def _written_group():
    """A group of members all left as written (no table names them), up to 16 rows, and a 4-row x."""
    g, members = _group()
    for m in members:
        m.__dict__["_as_written"] = True
    g.refresh()
    g.max_rows = 16
    return g, torch.randn(4, 16, dtype=torch.float16)


@pytest.fixture
def fake(monkeypatch):
    f = _Fake()
    monkeypatch.setattr(kernels_siblings, "site_for", f.site_for)
    monkeypatch.setattr(siblings, "_capturing", lambda: True)  # as in a CUDA-graph capture (the eager rule apart)
    return f


def test_outside_a_capture_a_group_launches_only_at_one_row_with_a_served_member(fake, monkeypatch):
    """The eager rule: the host sets the pace there, and one Triton launch costs more than the
    cuBLAS calls of members left as written (or of more rows) it would replace."""
    monkeypatch.setattr(siblings, "_capturing", lambda: False)
    g, members = _group()
    g.max_rows = 16
    one, four = torch.randn(1, 16, dtype=torch.float16), torch.randn(4, 16, dtype=torch.float16)
    assert not g.eager_one_row()  # a few KB of weights: eagerly its launch costs more host time than it saves
    monkeypatch.setattr(siblings, "EAGER_MIN_BYTES", 0)
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "0")  # the stream-time bound off too
    g.refresh()
    assert g.eager_one_row()
    assert g.call(0, four) is None and fake.launches == 1  # more rows eagerly: alone (one priming launch)
    assert g.call(0, four) is None and g.call(1, torch.randn(4, 16, dtype=torch.float16)) is None
    assert fake.launches == 1 and g.launches == 0  # primed once per row count; no group output served
    assert g.call(0, one) is not None and fake.launches == 2  # one row, served members: one launch
    assert g.may_take(one) and not g.may_take(four)
    members[0].__dict__["_as_written"] = True
    g.refresh()  # what optimize() calls where a mark changes
    assert g.may_take(one)  # one member served still makes the launch worth it
    for m in members:
        m.__dict__["_as_written"] = True
    g.refresh()
    assert g.call(0, torch.randn(1, 16, dtype=torch.float16)) is None and fake.launches == 2  # one row: primed
    assert not g.may_take(one)
    monkeypatch.setattr(siblings, "_capturing", lambda: True)  # in a capture the launch is free of host cost
    assert g.may_take(one) and g.may_take(four) and not g.may_take(torch.randn(17, 16, dtype=torch.float16))


def test_the_capture_question_skips_the_driver_on_a_default_stream(fake, monkeypatch):
    """A device running on its default stream cannot be capturing (torch refuses a capture there),
    so the eager rule does not ask the driver then; on any other stream it does, and a capture
    there takes the group as before."""
    asked = []
    monkeypatch.setattr(siblings, "_capturing", lambda: asked.append(1) or True)
    streams = {}
    monkeypatch.setattr(siblings, "_RAW_STREAM", lambda index: streams.setdefault("raw", 0))
    g, four = _written_group()
    assert not g.may_take(four) and asked == []  # default stream: no capture, no driver query
    streams["raw"] = 0x7F00  # a side stream: the driver is asked, and says capturing
    assert g.may_take(four) and asked == [1]
    monkeypatch.setattr(siblings, "_RAW_STREAM", None)  # a build without the raw-stream getter: always asked
    assert g.may_take(four) and asked == [1, 1]


def test_a_declined_eager_size_on_a_default_stream_becomes_quiet_until_a_refresh(fake, monkeypatch):
    """The members' forward skips may_take for a (numel, dtype) its group declined again after
    priming on a default stream (nothing is captured there); a side stream never makes a size
    quiet, and refresh() (a member's mark changed) forgets them."""
    monkeypatch.setattr(siblings, "_capturing", lambda: False)
    streams = {"raw": 0}
    monkeypatch.setattr(siblings, "_RAW_STREAM", lambda index: streams["raw"])
    g, four = _written_group()
    assert not g.may_take(four) and g.quiet == set() and fake.launches == 1  # primed, not yet quiet
    assert not g.may_take(four) and g.quiet == {(64, torch.float16)}
    streams["raw"] = 0x7F00  # a side stream not capturing: declined, but never quiet
    assert not g.may_take(torch.randn(2, 16, dtype=torch.float16))
    assert not g.may_take(torch.randn(2, 16, dtype=torch.float16))
    assert g.quiet == {(64, torch.float16)}
    streams["raw"] = 0
    assert not g.may_take(torch.randn(17, 16, dtype=torch.float16)) and g.quiet == {(64, torch.float16)}
    g.refresh()
    assert g.quiet == set()


@pytest.mark.parametrize("bias", [False, True])
def test_one_launch_serves_each_sibling_once_for_the_same_tensor(fake, bias):
    g, members = _group(bias)
    x = torch.randn(1, 1, 16, dtype=torch.float16)
    ys = [g.call(i, x) for i in range(3)]
    assert fake.launches == 1
    for m, y in zip(members, ys):
        assert y.shape == (1, 1, m.out_features) and y.is_contiguous()
        torch.testing.assert_close(y, torch.nn.functional.linear(x, m.weight, m.bias))
    assert g.call(1, x) is not None and fake.launches == 2  # called again: a new launch, not a stale output
    assert g._state[2][1] is None


def test_another_tensor_or_a_modified_one_never_gets_a_kept_output(fake):
    g, _ = _group()
    x = torch.randn(1, 16, dtype=torch.float16)
    g.call(0, x)
    other = x.clone()
    assert g.call(1, other) is not None and fake.launches == 2  # another tensor: its own launch
    g.call(0, x)
    x.add_(1.0)  # modified in place after the launch
    y = g.call(1, x)
    assert fake.launches == 4
    torch.testing.assert_close(y, torch.nn.functional.linear(x, g.members[1].weight))


@pytest.mark.parametrize("change", ["write weight", "write bias", "replace weight"])
def test_a_sibling_whose_weight_changed_since_the_launch_runs_alone(fake, change):
    """The kept output was computed from the weight the launch read: after an in-place write
    (load_state_dict, .data edits) or a new Parameter, the sibling computes its own."""
    g, members = _group(bias=True)
    x = torch.randn(1, 16, dtype=torch.float16)
    g.call(0, x)
    m = members[1]
    with torch.no_grad():
        if change == "write weight":
            m.weight.mul_(2.0)
        elif change == "write bias":
            m.bias.add_(1.0)
        else:
            m.weight = nn.Parameter(m.weight.detach() * 3.0)
    assert g.call(1, x) is None  # not the kept output: the member runs alone
    assert g.call(2, x) is not None and fake.launches == 1  # the untouched sibling still takes its own


def test_calls_the_kernel_cannot_take_run_alone(fake):
    g, members = _group()
    assert g.call(0, torch.randn(2, 16, dtype=torch.float16)) is None  # two rows
    assert g.call(0, torch.randn(1, 16, dtype=torch.float32)) is None  # fp32
    assert g.call(0, torch.randn(16, 2, dtype=torch.float16).t()[:1]) is None  # not contiguous
    members[2].weight = nn.Parameter(members[2].weight.detach().float())  # one weight of another dtype
    assert g.call(0, torch.randn(1, 16, dtype=torch.float16)) is None
    assert fake.launches == 0
    g2, _ = _group()
    g2._arch_ok = False  # no shipped profile for this GPU
    assert g2.call(0, torch.randn(1, 16, dtype=torch.float16)) is None


def test_a_group_pickles_and_copies_without_its_kept_outputs(fake):
    g, _ = _group()
    x = torch.randn(1, 16, dtype=torch.float16)
    g.call(0, x)
    for again in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert again._state is None and len(again.members) == 3
        assert again.call(1, x) is not None  # a new launch there, not the original's output


def test_optimize_groups_served_siblings_and_leaves_outputs_unchanged(monkeypatch):
    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))  # swap every Linear
    model = nn.Sequential(Attn())
    ref = copy.deepcopy(model)
    tunedb.optimize(model)
    attn = model[0]
    got = [attn.q_proj.__dict__.get("_siblings"), attn.k_proj.__dict__.get("_siblings"),
           attn.v_proj.__dict__.get("_siblings")]
    assert all(s is not None for s in got) and len({id(s[0]) for s in got}) == 1 and [s[1] for s in got] == [0, 1, 2]
    assert "_siblings" not in attn.o_proj.__dict__
    x = torch.randn(1, 16)
    torch.testing.assert_close(model(x), ref(x))  # CPU: every member runs alone
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    again = copy.deepcopy(model)
    s = again[0].k_proj.__dict__["_siblings"]
    assert s[0].members[1] is again[0].k_proj  # the copy's group holds the copy's members


def test_no_group_when_turned_off_shared_or_read_from_outside(monkeypatch):
    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))
    with settings.override(SIBLINGS="0"):
        m = tunedb.optimize(nn.Sequential(Attn()))
    assert "_siblings" not in m[0].q_proj.__dict__
    shared = Attn()
    model = nn.Sequential(shared)
    model.extra = shared.k_proj  # k_proj held in two places
    tunedb.optimize(model)
    assert "_siblings" not in model[0].q_proj.__dict__


def _interpreted() -> list:
    torch.manual_seed(0)
    failures = []
    acts = {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
            "gelu": torch.nn.functional.gelu, "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    # (K, N's, bias, dtype, activations, rows, tile): one row (the FMA slabs) and 2-16 rows (the
    # tensor-core path, each of tile()'s slab heights: rows past M masked), odd N and K; fp16 (the
    # interpreter's bf16 dot is wrong)
    for k, ns, bias, dt, names, m, t in (
            (64, (40, 16, 16), False, torch.float16, ("none", "silu", "relu"), 1, None),
            (300, (33, 17), True, torch.float16, ("gelu", "none"), 1, None),
            (8, (5, 7, 9), True, torch.float16, ("none", "none", "gelu_tanh"), 1, None),
            (512, (48, 48), False, torch.float16, ("silu", "none"), 1, None),
            (72, (40, 16, 24), True, torch.float16, ("none", "silu", "none"), 2, None),
            (300, (33, 17), False, torch.float16, ("gelu", "relu"), 5, None),
            (8, (5, 7, 9), True, torch.float16, ("none", "none", "gelu_tanh"), 16, None),
            (40, (2000, 700, 9), True, torch.float16, ("none", "silu", "none"), 3, None),  # 64-row slabs
            (24, (5000, 1500), False, torch.float16, ("gelu", "none"), 16, None),  # 128-row slabs
            (300, (33, 130), False, torch.float16, ("gelu", "relu"), 7, (64, 64, 4, 2)),
            # K split into runs reduced in the kernel: uneven runs (5 K tiles in 3), a bias and an
            # activation applied once after the sum, three members' blocks in one workspace
            (300, (33, 130), False, torch.float16, ("gelu", "relu"), 7, (64, 64, 4, 2, 3)),
            (72, (40, 16, 24), True, torch.float16, ("none", "silu", "none"), 2, (32, 16, 2, 2, 4)),
            (40, (200, 70, 9), True, torch.float16, ("silu", "none", "gelu"), 16, (64, 16, 4, 2, 3))):
        x = torch.randn(m, k, dtype=dt) if m > 1 else torch.randn(k, dtype=dt)
        ws = [torch.randn(n, k, dtype=dt) for n in ns]
        bs = [torch.randn(n, dtype=dt) for n in ns] if bias else [None] * len(ns)
        outs = [torch.full((*x.shape[:-1], n), float("nan"), dtype=dt) for n in ns]
        kernels_siblings.launch(x, ws, bs, outs, list(names), interpret=True, tiles=t)
        for w, b, o, a in zip(ws, bs, outs, names):
            ref = acts[a](x.double() @ w.double().t() + (b.double() if b is not None else 0))
            err = (o.double() - ref).abs().max().item()
            bound = 4 * (ref.to(dt).double() - ref).abs().max().item() + 1e-3 * ref.abs().max().item()
            if not err <= bound:
                failures.append(f"M={m} K={k} N={w.shape[0]} bias={bias} act={a} tile={t}: {err:.3g} > {bound:.3g}")
    # one workspace over launches: the counters are left zero, and the split sum has one order
    # (the same inputs give the same bits, a new input its own result)
    k, ns, m, t = 96, (48, 20), 5, (16, 16, 2, 2, 3)
    ws = [torch.randn(n, k, dtype=torch.float16) for n in ns]
    sizes = kernels_siblings.workspace_sizes(ns, k, m, t)
    work = (torch.zeros(sizes[0]), torch.zeros(sizes[1], dtype=torch.int32))
    runs = []
    for x in (torch.randn(m, k, dtype=torch.float16),) * 2 + (torch.randn(m, k, dtype=torch.float16),):
        outs = [torch.empty(m, n, dtype=torch.float16) for n in ns]
        kernels_siblings.launch(x, ws, [None, None], outs, interpret=True, tiles=t, workspace=work)
        runs.append(outs)
        if work[1].any():
            failures.append(f"counters left {work[1].tolist()}")
        for w, o in zip(ws, outs):
            ref = x.double() @ w.double().t()
            if not (o.double() - ref).abs().max().item() <= 4e-3 * ref.abs().max().item():
                failures.append(f"reused workspace: wrong output for N={w.shape[0]}")
    if not all(torch.equal(a, b) for a, b in zip(runs[0], runs[1])):
        failures.append("split-K sibling outputs differ bitwise between two runs on the same inputs")
    return failures


def test_the_kernel_under_the_interpreter():
    assert interpret_child.failures(__file__) == []


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    interpret_child.report(_interpreted())


def test_a_member_with_a_fused_activation_gets_it_in_the_group(fake):
    torch.manual_seed(0)
    gate, up = nn.Linear(16, 32).half().requires_grad_(False), nn.Linear(16, 32).half().requires_grad_(False)
    members = [patching.TunedLinear(gate, "silu"), patching.TunedLinear(up)]
    g = siblings.SiblingGroup(members)
    g._arch_ok = True
    x = torch.randn(1, 16, dtype=torch.float16)
    y0, y1 = g.call(0, x), g.call(1, x)
    torch.testing.assert_close(y0, torch.nn.functional.silu(gate(x)))
    torch.testing.assert_close(y1, up(x))


def test_siblings_left_as_written_join_their_group_and_run_as_nn_linear_otherwise():
    # no table names these keys: optimize() leaves the Linears as written, except siblings, which
    # become TunedLinears marked _as_written (F.linear for every call the group does not take)
    model = nn.Sequential(Attn(d=24, kv=8))
    ref = copy.deepcopy(model)
    tunedb.optimize(model)
    attn = model[0]
    assert type(attn.o_proj) is nn.Linear  # no sibling: left as written
    for name in ("q_proj", "k_proj", "v_proj"):
        m = getattr(attn, name)
        assert type(m) is patching.TunedLinear and m.__dict__.get("_as_written") and "_siblings" in m.__dict__
    x = torch.randn(1, 24)
    assert torch.equal(model(x), ref(x))  # CPU: nn.Linear's own computation
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(model.state_dict()) == list(ref.state_dict())


def test_siblings_left_as_written_stay_visible_and_serve_once_a_tier_does(monkeypatch):
    """They keep the left-as-written mark (prewarm and autotune() measure them; the report lists
    them) and, once a tier serves their key, optimize() run again (swap_left) serves them tuned."""
    from tunedb.runtime import report

    model = nn.Sequential(Attn(d=24, kv=8))
    tunedb.optimize(model)
    attn = model[0]
    assert {n for n, m in attn.named_children() if report.LEFT_MARK in m.__dict__} == {"q_proj", "k_proj", "v_proj",
                                                                                       "o_proj"}
    group = attn.q_proj.__dict__["_siblings"][0]
    assert group.as_written()  # asked at every eager call, and kept
    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))  # a tier serves them now
    tunedb.optimize(model)
    assert not group.as_written()  # optimize() told the group: it launches eagerly at one row again
    for name in ("q_proj", "k_proj", "v_proj"):
        m = getattr(attn, name)
        assert "_as_written" not in m.__dict__ and report.LEFT_MARK not in m.__dict__ and "_siblings" in m.__dict__
    assert type(attn.o_proj) is patching.TunedLinear


def test_inference_tensors_group_without_a_version_counter(fake):
    g, members = _group()
    with torch.inference_mode():
        x = torch.randn(1, 16, dtype=torch.float16)
        ys = [g.call(i, x) for i in range(3)]
        assert fake.launches == 1
        for m, y in zip(members, ys):
            torch.testing.assert_close(y, torch.nn.functional.linear(x, m.weight))


def test_a_sibling_whose_weight_wants_a_gradient_keeps_it(fake):
    g, members = _group()
    members[1].weight.requires_grad_(True)  # k trained, q and v frozen
    x = torch.randn(1, 16, dtype=torch.float16)
    assert g.call(0, x) is None and fake.launches == 0  # grad enabled: every member alone
    with torch.no_grad():
        assert g.call(0, x) is not None and fake.launches == 1


def test_the_report_names_the_groups_and_counts_their_launches(fake):
    g, _ = _group()
    g.names = ("q_proj", "k_proj", "v_proj")
    x = torch.randn(1, 16, dtype=torch.float16)
    [g.call(i, x) for i in range(3)]
    lines = [ln for ln in siblings.report_lines() if "q_proj+k_proj+v_proj" in ln]
    assert lines and "run as one launch" in lines[0]
    assert any(line.startswith("siblings:") for line in tunedb.tuning_report().splitlines())


def test_a_few_deep_rows_run_alone(fake):
    torch.manual_seed(0)
    lins = [nn.Linear(4096, 64, bias=False).half().requires_grad_(False) for _ in range(3)]
    g = siblings.SiblingGroup([patching.TunedLinear(m) for m in lins])
    g._arch_ok = True
    assert g.call(0, torch.randn(1, 4096, dtype=torch.float16)) is None and fake.launches == 0
    # 384 rows: alone at one row (fewer than 512), grouped at 2-16 rows (measured down to 768)
    lins = [nn.Linear(4096, 128, bias=False).half().requires_grad_(False) for _ in range(3)]
    g = siblings.SiblingGroup([patching.TunedLinear(m) for m in lins], max_rows=16)
    g._arch_ok = True
    assert g.call(0, torch.randn(1, 4096, dtype=torch.float16)) is None and fake.launches == 0
    assert g.call(0, torch.randn(16, 4096, dtype=torch.float16)) is not None and fake.launches == 1


def test_more_rows_group_only_below_the_byte_cap(fake, monkeypatch):
    """At 2-16 rows a group whose weights pass MMA_MAX_BYTES runs each member alone (cuBLAS streams
    large weights faster); one row groups whatever the size."""
    g, members = _group()
    g.max_rows = 16
    nbytes = sum(m.weight.numel() for m in members) * 2
    monkeypatch.setattr(siblings, "MMA_MAX_BYTES", nbytes - 1)
    assert g.call(0, torch.randn(4, 16, dtype=torch.float16)) is None and fake.launches == 0
    assert g.call(0, torch.randn(1, 16, dtype=torch.float16)) is not None and fake.launches == 1
    monkeypatch.setattr(siblings, "MMA_MAX_BYTES", nbytes)
    assert g.call(0, torch.randn(4, 16, dtype=torch.float16)) is not None and fake.launches == 2


def test_more_rows_group_only_up_to_the_setting_read_at_optimize(fake, monkeypatch):
    """TUNEDB_SIBLING_ROWS (default 16): a group takes calls of up to that many rows; its outputs
    keep the caller's leading shape; past it, or with the default, each member runs alone."""
    g, members = _group(bias=True)
    x = torch.randn(2, 3, 16, dtype=torch.float16)  # six rows
    assert g.call(0, x) is None and fake.launches == 0  # a group made with one row
    g.max_rows = 16
    ys = [g.call(i, x) for i in range(3)]
    assert fake.launches == 1 and fake.rows == 6
    for m, y in zip(members, ys):
        assert y.shape == (2, 3, m.out_features) and y.is_contiguous()
        torch.testing.assert_close(y, torch.nn.functional.linear(x, m.weight, m.bias))
    assert g.call(0, torch.randn(17, 16, dtype=torch.float16)) is None  # past the kernel's 16
    monkeypatch.setenv("TUNEDB_SIBLING_ROWS", "8")
    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))
    model = tunedb.optimize(nn.Sequential(Attn()))
    assert model[0].q_proj.__dict__["_siblings"][0].max_rows == 8
    monkeypatch.setenv("TUNEDB_SIBLING_ROWS", "17")
    with pytest.raises(tunedb.errors.SettingsError, match="TUNEDB_SIBLING_ROWS='17'"):
        tunedb.optimize(nn.Sequential(Attn()))


def test_the_split_rule_fills_the_sms_only_where_the_slabs_do_not():
    """kernels_siblings.split_for: a group of at most half as many slabs as SMs splits K up to one
    program an SM, each run four K tiles at least, eight runs at most; groups of more slabs stay
    whole (splitting Llama-3-8B's 96 q/k/v slabs lost 36%, session 42); tile() asks it only when
    given the SM count and at 2-16 rows."""
    split_for = kernels_siblings.split_for
    assert split_for(96, 4096, 128, 132) == 1  # Llama-3-8B q/k/v, 64-row slabs: whole
    assert split_for(72, 3584, 128, 132) == 1  # Qwen2-7B q/k/v
    assert split_for(67, 7168, 256, 132) == 1  # more slabs than half the SMs
    assert split_for(66, 7168, 256, 132) == 2  # DeepSeek-V3 q_a/kv_a, 32-row slabs: 132 programs
    assert split_for(40, 8192, 256, 132) == 3  # Llama-3-70B q/k/v over 8 GPUs
    assert split_for(72, 768, 256, 132) == 1  # three K tiles: no run of four
    assert split_for(24, 4096, 256, 132) == 4  # 16 K tiles: four runs of four, not the 5 that fit
    assert split_for(2, 1 << 20, 128, 132) == 8  # at most eight
    assert kernels_siblings.tile(4096, 16, 6144, sms=132) == (64, 128, 4, 5, 1)
    assert kernels_siblings.tile(4096, 16, 768, sms=132) == (32, 256, 2, 4, 4)  # Llama-3-8B q/k/v over 8 GPUs
    assert kernels_siblings.tile(4096, 16, 6144)[-1] == 1  # no SM count: not split
    assert kernels_siblings.tile(4096, 1, 6144, sms=132)[-1] == 1  # one row: the FMA slabs, never split
    assert kernels_siblings.workspace_sizes((4096, 1024, 1024), 4096, 16, (64, 128, 4, 5, 3)) == (96 * 3 * 16 * 64, 96)
    assert kernels_siblings.workspace_sizes((4096, 1024, 1024), 4096, 16) == (1, 1)
    with pytest.raises(ValueError, match="split 3 at M=1"):
        kernels_siblings.workspace_sizes((64,), 4096, 1, (16, 256, 4, 5, 3))


def test_split_auto_is_read_at_optimize_and_reaches_the_launch(fake, monkeypatch):
    """TUNEDB_SIBLING_SPLIT=auto (the default): the groups optimize() makes split K by the GPU's SM
    count (the launch gets a split tile and a workspace of its size); '1' never splits; any other
    value is refused naming it."""
    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))
    monkeypatch.setenv("TUNEDB_SIBLING_SPLIT", "1")
    model = tunedb.optimize(nn.Sequential(Attn()))
    assert model[0].q_proj.__dict__["_siblings"][0].split is False
    monkeypatch.delenv("TUNEDB_SIBLING_SPLIT")
    model = tunedb.optimize(nn.Sequential(Attn(d=2048, kv=256)).half().requires_grad_(False))
    g = model[0].q_proj.__dict__["_siblings"][0]
    assert g.split is True and copy.deepcopy(g).split is True
    g._arch_ok = True
    # a GPU of 264 SMs: 80 slabs of 32 rows are fewer than half of them
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"multi_processor_count": 264}))
    x = torch.randn(4, 2048, dtype=torch.float16)
    y = g.call(0, x)
    assert fake.launches == 1 and fake.tiles == (32, 256, 2, 4, 2)  # 8 K tiles: two runs of four
    torch.testing.assert_close(y, torch.nn.functional.linear(x, g.members[0].weight))
    (_site, _grid, sizes), = g._sites.values()
    assert sizes == (80 * 2 * 16 * 32, 80) and g._work == {}  # made inside the capture: that graph's only
    monkeypatch.setattr(siblings, "_capturing", lambda: False)
    assert not g.may_take(torch.randn(5, 2048, dtype=torch.float16)) and fake.launches == 2  # primed eagerly
    (ws, counters), = g._work.values()  # kept, zeroed, shared by the row counts
    assert (ws.numel(), counters.numel()) == sizes and not ws.any() and not counters.any()
    monkeypatch.setenv("TUNEDB_SIBLING_SPLIT", "2")
    with pytest.raises(tunedb.errors.SettingsError, match="TUNEDB_SIBLING_SPLIT='2'"):
        tunedb.optimize(nn.Sequential(Attn()))


def test_a_tensor_parallel_shard_splits_k_by_default(fake, monkeypatch):
    """A shard's q/k/v (512 + 128 + 128 rows at K = 4096: 24 slabs of 32 rows on 132 SMs) gets the
    split tile with no setting at all, at 2-16 rows; one row stays on the unsplit FMA slabs."""
    monkeypatch.delenv("TUNEDB_SIBLING_SPLIT", raising=False)
    model = tunedb.optimize(nn.Sequential(Attn(d=4096, kv=128, q=512)).half().requires_grad_(False))
    g = model[0].q_proj.__dict__["_siblings"][0]
    assert g.split is True
    g._arch_ok = True
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"multi_processor_count": 132}))
    x = torch.randn(4, 4096, dtype=torch.float16)
    y = g.call(0, x)
    assert fake.tiles == (32, 256, 2, 4, 4)  # four runs of four K tiles: 96 programs
    torch.testing.assert_close(y, torch.nn.functional.linear(x, g.members[0].weight))
    g.call(0, torch.randn(1, 4096, dtype=torch.float16))
    assert fake.tiles[-1] == 1


def test_an_eager_warm_up_primes_what_a_capture_will_launch(fake, monkeypatch):
    """The eager rule leaves the group's launch to the capture; the first eager call of each row
    count launches once anyway (outputs dropped) so that the capture finds the kernel loaded and
    the workspace made: CUDA may refuse a module load inside a capture, and an allocation there
    adds fill kernels to every replay. A launch that fails turns the group off, with a warning,
    before any capture."""
    monkeypatch.setattr(siblings, "_capturing", lambda: False)
    g, members = _group()
    g.max_rows = 16
    for m in members:
        m.__dict__["_as_written"] = True  # a model no table names: every member left as written
    x = torch.randn(3, 16, dtype=torch.float16)
    assert not g.may_take(x) and fake.launches == 1 and len(g._sites) == 1
    assert not g.may_take(torch.randn(3, 16, dtype=torch.float16)) and fake.launches == 1
    monkeypatch.setattr(siblings, "_capturing", lambda: True)  # the capture: the site made eagerly serves
    made = dict(g._sites)
    assert g.may_take(x) and g.call(0, x) is not None and fake.launches == 2 and g._sites == made

    def broken(*a, **kw):
        raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(kernels_siblings, "site_for", broken)
    monkeypatch.setattr(siblings, "_capturing", lambda: False)
    with pytest.warns(tunedb.errors.TunedbWarning, match="members run alone"):
        assert not g.may_take(torch.randn(5, 16, dtype=torch.float16))
    monkeypatch.setattr(siblings, "_capturing", lambda: True)
    assert g.call(0, torch.randn(5, 16, dtype=torch.float16)) is None  # off: each member alone


def test_eagerly_a_group_launches_only_if_its_weights_stream_for_the_eager_kernel_bound(fake, monkeypatch):
    """eager_one_row's second bound (session 45): the weights must take TUNEDB_EAGER_KERNEL_US to
    stream at the arch profile's DRAM bandwidth, the line under which a GEMM's eager calls go to
    torch; a slower memory (or a larger group) passes it, '0' turns it off."""
    import dataclasses

    from tunedb.arch import shipped_profile
    from tunedb.runtime import selector

    monkeypatch.setattr(siblings, "EAGER_MIN_BYTES", 0)
    profile = shipped_profile("sm90")
    g, _members = _group()  # 3 x 16 x 16 fp16 weights: 1.5 KB
    for bw, takes in ((profile.dram_bw_gbs, False), (1e-3, True)):  # 64 us of 4.2 TB/s; of 1 MB/s: 64 bytes
        monkeypatch.setattr(selector, "current_arch", lambda bw=bw: ("sm90", dataclasses.replace(profile, dram_bw_gbs=bw)))
        g.refresh()
        assert g.eager_one_row() is takes
    monkeypatch.setattr(selector, "current_arch", lambda: ("sm90", profile))
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "0")
    g.refresh()
    assert g.eager_one_row()
