"""TunedLinear under a compiler's trace (linear_forms.traced): the fused pair's state is read once per
trace (fused_pair.intact_kind, a constant of the graph) instead of as 15-20 guards checked at every
compiled call; surgery after the compile must still retrace and give the plain model's answer."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from tunedb.families.gemm import fused_pair


def MLP():  # a block fusion rule 2 fuses (its source file reads no `fc` of other objects)
    from fusion_models_s40 import WalkedBlock

    return WalkedBlock(16)


def _guard_lines(model, x, backend: str = "eager") -> list[str]:
    """Dynamo's guard log of the compiled forward, line by line."""
    import logging

    torch._dynamo.reset()
    lines: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger("torch._dynamo.guards")
    handler = Grab()
    torch._logging.set_logs(guards=True)
    log.addHandler(handler)
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend)(x)
    finally:
        log.removeHandler(handler)
        torch._logging.set_logs()
    return "\n".join(lines).splitlines()


def _guards(model, x) -> int:
    """Guards of the compiled forward, counted from Dynamo's guard log."""
    return sum(line.count("+- ") - line.count("+- GuardManager") for line in _guard_lines(model, x))


def _fused(model) -> bool:
    return model.fc.__dict__.get("act") == "gelu"


def _plain_and_tuned():
    """A plain block, its optimized copy (fused) and an input, Dynamo's caches emptied."""
    torch.manual_seed(0)
    plain = MLP().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert _fused(tuned)
    torch._dynamo.reset()
    return plain, tuned, torch.randn(3, 16)


def test_a_fused_pair_adds_few_guards_to_a_compiled_forward():
    plain = MLP().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert _fused(tuned)
    x = torch.randn(3, 16)
    extra = _guards(tuned, x) - _guards(plain, x)
    # traced, intact() read weakrefs, both slots and every hook dict on both sides of the pair
    assert extra <= 33, extra  # 41 before session 49 (26 then; 31 with session 50's version check and caller rule;
    # session 53's read of the activation's settings: +3, its trace-time caller check: +1; session 55's
    # may_group() before the sibling test: +1 here, -2 a sibling member in a compile without graphs)


def _swap_every_gelu(model):
    for _, m in list(model.named_modules()):
        for name, c in list(m.named_children()):
            if isinstance(c, nn.GELU):
                setattr(m, name, nn.Tanh())


@pytest.mark.parametrize("surgery", ["act", "linear", "hook", "walk"])
def test_surgery_after_a_compile_gives_the_plain_compiled_models_answer(surgery):
    """A swapped slot retraces (Dynamo guards both slots' types through the block's forward) and
    the new trace reads the pair again. A hook added after the compile is compiled code's business
    (Dynamo does not guard module hooks by default): the tuned model does what the plain one does."""
    plain, tuned, x = _plain_and_tuned()
    compiled_plain, compiled = torch.compile(plain, backend="eager"), torch.compile(tuned, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), compiled_plain(x))
        if surgery == "act":
            plain.act, tuned.act = nn.ReLU(), nn.ReLU()
        elif surgery == "linear":
            fresh = nn.Linear(16, 16)
            plain.fc, tuned.fc = fresh, copy.deepcopy(fresh)
        elif surgery == "walk":  # every nn.GELU swapped, as found by named_modules (in the slot's child)
            _swap_every_gelu(plain)
            _swap_every_gelu(tuned)
        else:
            tuned.act.register_forward_hook(lambda m, i, o: o * 2)
            plain.act.register_forward_hook(lambda m, i, o: o * 2)
        assert torch.equal(compiled(x), compiled_plain(x)), surgery
        if surgery != "hook":
            assert torch.equal(compiled(x), plain(x))


def test_intact_kind_is_a_trace_constant_and_the_kinds_answer_eagerly():
    tuned = tunedb.optimize(MLP().eval(), families="all")
    pair = tuned.fc.__dict__["_tunedb_fused"]
    assert fused_pair.intact_kind._dynamo_marked_constant is True
    assert tuned.act.__dict__["_tunedb_kind"] == pair.kind == "fusion_models_s40.WalkedBlock|fc|act"  # the slot's own copy
    assert fused_pair.intact_kind(pair.kind, 0) is pair.intact() is True
    tuned.act = nn.ReLU()
    assert fused_pair.intact_kind(pair.kind, 0) is pair.intact() is False
    assert fused_pair.intact_kind("no.such.Block|fc|act", 0) is False


def _lambda_guards(model, x) -> list[str]:
    """The object-aliasing guards of the compiled forward (`a is b`, a Python lambda each at every call)."""
    return [ln for ln in _guard_lines(model, x) if "LAMBDA_GUARD" in ln and "L['" in ln]


def test_a_fused_pair_adds_no_aliasing_guard():
    """Each side reads only what it holds itself (the Linear its pair, the slot its own copy of the
    pair's key): a pair read from both sides, or a weakref to a module the trace also reached
    through the parent, was an `a is b` guard in Python at every compiled call (five a pair on
    torch 2.11, session 50)."""
    tuned = tunedb.optimize(MLP().eval(), families="all")
    assert _fused(tuned)
    tuned.fc.__dict__.pop("_act_module")  # its CPU-only form reads the activation module the slot holds too
    guards = _lambda_guards(tuned, torch.randn(3, 16))
    assert not [g for g in guards if "_tunedb" in g or "._blank" in g or "._linear" in g], guards


def test_a_new_child_of_the_same_type_in_the_slot_retraces():
    """A walk setting another nn.GELU (tanh form) into the fused slot bumps the epoch, which both
    sides' compiled code guards, so the next call retraces and applies the new module."""
    plain, tuned, x = _plain_and_tuned()
    compiled = torch.compile(tuned, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), plain(x))
        epoch = fused_pair._EPOCH[0]
        tuned.act.activation = nn.GELU(approximate="tanh")
        plain.act = nn.GELU(approximate="tanh")
        assert fused_pair._EPOCH[0] == epoch + 1
        assert torch.equal(compiled(x), plain(x))


def test_a_child_set_through_modules_after_a_compile_retraces():
    """No registration hook runs for `slot._modules["activation"] = m`: the slot's trace reads its
    child, so a child of another type fails that guard."""
    plain, tuned, x = _plain_and_tuned()
    compiled = torch.compile(tuned, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), plain(x))
        tuned.act._modules["activation"] = nn.Tanh()
        plain.act = nn.Tanh()
        assert torch.equal(tuned(x), plain(x))
        assert torch.equal(compiled(x), plain(x))


def test_blocks_compiled_one_by_one_share_one_compiled_frame():
    """Regional compilation (each repeated block compiled alone): the trace constant is the pair's
    kind, the same in every block, so the first block's compiled code serves the others; a per-pair
    identity or key was a guard that differed in every block (a recompile each, eager past 8)."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    plain = nn.Sequential(*[MLP() for _ in range(10)]).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert all(_fused(b) for b in tuned)
    torch._dynamo.reset()
    counters.clear()
    for block in tuned:
        block.compile(backend="eager")
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert torch.equal(tuned(x), plain(x))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "pickle protocol 1"])
def test_a_copied_model_holds_one_pair_of_its_kind(how):
    import io
    import pickle

    torch.manual_seed(0)
    plain = MLP().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    if how == "deepcopy":
        twin = copy.deepcopy(tuned)
    elif how == "pickle":
        buf = io.BytesIO()
        torch.save(tuned, buf)
        buf.seek(0)
        twin = torch.load(buf, weights_only=False)
    else:  # object.__new__ and __setstate__ (copyreg._reconstructor): no __new__ of the class runs
        twin = pickle.loads(pickle.dumps(tuned, protocol=1))
    pair = twin.fc.__dict__["_tunedb_fused"]
    assert pair is twin.act.__dict__["_tunedb_fused"]  # deepcopy made two pairs before session 51
    assert twin.act.__dict__["_tunedb_kind"] == pair.kind == tuned.fc.__dict__["_tunedb_fused"].kind
    assert fused_pair.intact_kind(pair.kind, 0)
    x = torch.randn(3, 16)
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(twin, backend="eager")(x), plain(x))
    twin.act = nn.ReLU()  # the copy's surgery: its kind unfuses in compiled code (all or none), eagerly only the copy
    assert not fused_pair.intact_kind(pair.kind, 0)
    assert tuned.fc.__dict__["_tunedb_fused"].intact()
    plain.act = nn.ReLU()
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.equal(torch.compile(twin, backend="eager")(x), plain(x))


@pytest.mark.parametrize("mode,graphs", [(None, False), ("reduce-overhead", True)])
def test_a_trace_knows_whether_its_inductor_compile_records_graphs(mode, graphs):
    """siblings_compile._backend_graphs read at trace time (a constant of the graph): a member's
    trace reads its group only where the compiled forward may run in CUDA graphs."""
    from tunedb.families.gemm import siblings_compile

    def probe():  # run at trace time, as _may_group runs it
        return siblings_compile._backend_graphs()

    probe._dynamo_marked_constant = True

    def f(x):
        return x + (2 if probe() else 1)

    assert probe() is None  # outside a trace: unknown
    torch._dynamo.reset()
    got = torch.compile(f, mode=mode)(torch.zeros(3))
    assert torch.equal(got, torch.full((3,), 2.0 if graphs else 1.0))
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, backend="eager")(torch.zeros(3)), torch.ones(3))  # not Inductor: unknown


def test_a_dropped_models_broken_pair_does_not_unfuse_its_kind():
    """A model cut by surgery and dropped (its modules a cycle the collector has not reached): the
    kind's constant collects before it counts a broken pair."""
    import gc

    old = tunedb.optimize(MLP().eval(), families="all")
    old.act = nn.ReLU()  # broken
    old.__dict__["loop"] = [old]  # a cycle: alive after del until the collector runs
    gc.disable()
    try:
        del old
        fresh = tunedb.optimize(MLP().eval(), families="all")
        assert fused_pair.intact_kind(fresh.fc.__dict__["_tunedb_fused"].kind, 0)
    finally:
        gc.enable()


def test_a_compile_without_graphs_reads_no_sibling_group():
    # session 55: the membership test alone guarded each member's group tuple (its type and length),
    # two guards a member checked at every compiled call, in a compile whose graph never keeps the group
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    tuned = tunedb.optimize(LlamaModel(cfg).eval(), inplace=False)
    assert any("_siblings" in m.__dict__ for m in tuned.modules())
    try:
        guards = "\n".join(_guard_lines(tuned, torch.randint(0, 128, (1, 3)), backend="inductor"))
    finally:
        torch._dynamo.reset()
    assert "_modules['layers']" in guards  # the guard log was read (its wording of the rest moves with torch)
    assert "['_siblings']" not in guards
