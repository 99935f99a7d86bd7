"""A TunedLinear's memo of its eager torch sizes (families/gemm/eager_sizes.py): keyed per weight
and launch-table generation, never keeping a weight alive, never carried by a copy or a pickle,
and never consulted off CUDA."""
from __future__ import annotations

import copy
import pickle

import torch
from torch import nn

from tunedb.families.gemm.eager_sizes import EagerSizes, note
from tunedb.families.gemm.patching import TunedLinear
from tunedb.runtime import launch_table


class FakeBound:
    def __init__(self) -> None:
        self.counter = type("Count", (), {"calls": 0})()


def test_a_new_generation_or_another_weight_starts_a_fresh_memo():
    d: dict = {}
    w, w2, b = torch.zeros(4, 8), torch.zeros(4, 8), FakeBound()
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    note(d, x, w, None, b, 5)
    memo = d["_eager_sizes"]
    assert memo.bounds == {(x.shape, torch.bfloat16, True): b} and memo.generation == 5 and memo.weight == id(w)
    note(d, torch.zeros(1, 8), w, None, b, 5)  # the same generation and weight: one memo, two sizes
    assert d["_eager_sizes"] is memo and len(memo.bounds) == 2
    note(d, x, w2, None, b, 5)
    assert d["_eager_sizes"] is not memo and d["_eager_sizes"].weight == id(w2)
    note(d, x, w2, None, b, 6)
    assert d["_eager_sizes"].generation == 6 and len(d["_eager_sizes"].bounds) == 1


def test_a_memo_keeps_no_weight_alive():
    import gc
    import weakref

    d: dict = {}
    w = torch.nn.Parameter(torch.zeros(4, 8))
    gone = weakref.ref(w)
    note(d, torch.zeros(1, 8), w, None, FakeBound(), 1)
    del w
    gc.collect()
    assert gone() is None  # a weight replaced after optimize() is freed, memo or not


def test_clearing_the_table_and_recording_each_start_a_generation():
    before = launch_table.generation[0]
    launch_table.clear()
    assert launch_table.generation[0] == before + 1
    with launch_table.recording():
        assert launch_table.generation[0] == before + 2


def test_copies_and_pickles_of_a_layer_carry_no_memo_entries():
    lin = TunedLinear(nn.Linear(8, 4, bias=False))
    note(lin.__dict__, torch.zeros(1, 8), lin.weight, None, FakeBound(), launch_table.generation[0])
    for other in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
        memo = other.__dict__["_eager_sizes"]
        assert isinstance(memo, EagerSizes) and memo.bounds == {} and memo.weight == 0
        x = torch.randn(3, 8)
        assert torch.equal(other(x), nn.functional.linear(x, other.weight))


def test_a_cpu_call_of_a_remembered_size_is_not_answered_by_the_memo_nor_counted():
    lin = TunedLinear(nn.Linear(8, 4))
    bound = FakeBound()
    x = torch.randn(2, 8)
    note(lin.__dict__, x, lin.weight, lin.bias, bound, launch_table.generation[0])
    assert torch.equal(lin(x), nn.functional.linear(x, lin.weight, lin.bias))
    assert bound.counter.calls == 0  # the CPU path (the torch arm), not the CUDA memo


def test_a_compiled_layer_with_a_memo_is_not_recompiled_by_reloads():
    # an eager warm-up leaves a memo; torch.compile afterwards must not guard on its fields, or
    # every reload (a new generation) would recompile the frame until Dynamo's limit
    from torch._dynamo.testing import CompileCounter

    lin, x = TunedLinear(nn.Linear(8, 4)), torch.randn(2, 8)
    note(lin.__dict__, x, lin.weight, lin.bias, FakeBound(), launch_table.generation[0])
    counter = CompileCounter()
    compiled = torch.compile(lin, backend=counter)
    for _ in range(4):
        torch.testing.assert_close(compiled(x), nn.functional.linear(x, lin.weight, lin.bias))
        launch_table.clear()
    assert counter.frame_count == 1
