"""The rnn family on the CPU: keys (from modules, meta tensors and call arguments), clear errors,
the arms and the validity predicate, both arms against the fp64/fp32 reference, the census on
meta tensors, and optimize()'s wrapper."""
from __future__ import annotations

import pytest
import torch

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError, SignatureError
from tunedb.families.rnn import FAMILY
from tunedb.families.rnn.census import optimize, record

SM90 = shipped_profile("sm90")


def test_registered_key_format_and_schema():
    assert families.get("rnn") is FAMILY
    sig = FAMILY.make_signature("lstm", "bf16", 320, 320, 2, 1, 0, 1, 16)
    assert sig.format() == "rnn|op=lstm|dt=bf16|I=320|H=320|L=2|bias=1|bidir=0|bf=1|B=16"
    assert FAMILY.schema.check(sig) is sig
    assert FAMILY.schema.size == "T"
    with pytest.raises(SignatureError, match="op='rnn_tanh'"):
        FAMILY.make_signature("rnn_tanh", "bf16", 8, 8)
    with pytest.raises(SignatureError, match="H=0"):
        FAMILY.make_signature("gru", "fp32", 8, 0)


def test_module_keys_on_meta_tensors():
    lstm = torch.nn.LSTM(80, 320, num_layers=2, batch_first=True, bidirectional=True).to("meta", torch.bfloat16)
    gru = torch.nn.GRU(64, 128, bias=False).to("meta")
    x = torch.empty(8, 10, 80, device="meta", dtype=torch.bfloat16)
    calls = record(lambda: lstm(x))
    assert dict(calls) == {(FAMILY.make_signature("lstm", "bf16", 80, 320, 2, 1, 1, 1, 8), 10): 1}
    calls = record(lambda: (gru(torch.empty(6, 4, 64, device="meta")), gru(torch.empty(6, 4, 64, device="meta"))))
    assert dict(calls) == {(FAMILY.make_signature("gru", "fp32", 64, 128, 1, 0, 0, 0, 4), 6): 2}
    # unbatched input and LSTM projections are not served
    assert not record(lambda: gru(torch.empty(6, 64, device="meta")))
    proj = torch.nn.LSTM(16, 32, proj_size=8).to("meta")
    assert not record(lambda: proj(torch.empty(5, 2, 16, device="meta")))


def test_signature_of_call_arguments_and_errors():
    sig = FAMILY.make_signature("lstm", "fp32", 12, 16, 2, 1, 1, 1, 3)
    args, _ = FAMILY.make_inputs(sig, 7, "cpu", 0)
    got = FAMILY.signature_of("lstm", *args, bidirectional=True, batch_first=True, bias=True)
    assert got == (sig, 7)
    with pytest.raises(SignatureError, match="weight tensors"):
        FAMILY.signature_of("lstm", *args[:-1], bidirectional=True, batch_first=True, bias=True)
    with pytest.raises(SignatureError, match="batch"):
        FAMILY.signature_of("lstm", args[0][:2], *args[1:], bidirectional=True, batch_first=True, bias=True)


def test_arms_and_predicate():
    sig = FAMILY.make_signature("gru", "bf16", 64, 64)
    space = [c.id for c in FAMILY.config_space("sm90")]
    assert space[0] == "nocudnn" and all(c.startswith("pl_") for c in space[1:]) and len(space) > 1
    assert [c.id for c in FAMILY.config_space("sm90", ["torch_native"])] == ["nocudnn"]
    for cid in space:
        assert FAMILY.parse_config(cid).id == cid
    assert FAMILY.sentinels(sig) == ("default", "torch")
    for cid in ("torch", "default", "nocudnn"):
        assert FAMILY.invalid_reason(FAMILY.parse_config(cid), sig, 100, SM90) is None
    with pytest.raises(ConfigError, match="fused"):
        FAMILY.parse_config("fused")
    bad = FAMILY.parse_config("nocudnn").__class__("persistent", "triton", ())
    assert "not an rnn arm" in FAMILY.invalid_reason(bad, sig, 100, SM90)
    # the persistent lane: LSTM in bf16/fp16 only, tiles not beyond the batch or the hidden size
    pl = FAMILY.parse_config("pl_bb16_bh64_bk64_w4")
    assert "LSTM" in FAMILY.invalid_reason(pl, sig, 100, SM90)
    lstm = FAMILY.make_signature("lstm", "bf16", 320, 320, 1, 1, 0, 1, 8)
    assert FAMILY.invalid_reason(pl, lstm, 100, SM90) is None
    assert "TF32" in FAMILY.invalid_reason(pl, FAMILY.make_signature("lstm", "fp32", 320, 320), 100, SM90)
    assert "BB=64" in FAMILY.invalid_reason(FAMILY.parse_config("pl_bb64_bh64_bk64_w8"), lstm, 100, SM90)
    tiny = FAMILY.make_signature("lstm", "bf16", 8, 16, 1, 1, 0, 1, 8)
    assert "H=16" in FAMILY.invalid_reason(FAMILY.parse_config("pl_bb16_bh128_bk64_w8"), tiny, 100, SM90)
    assert "registers" in FAMILY.invalid_reason(FAMILY.parse_config("pl_bb64_bh128_bk64_w4"),
                                                FAMILY.make_signature("lstm", "bf16", 320, 320, b=64), 100, SM90)
    with pytest.raises(ConfigError, match="BB=48"):
        FAMILY.parse_config("pl_bb48_bh64_bk64_w4")
    assert FAMILY.pick_rule().pick({"torch": 1.0, "nocudnn": 0.97}).winner == "torch"
    assert FAMILY.pick_rule().pick({"torch": 1.0, "nocudnn": 0.5}).winner == "nocudnn"
    flops, moved = FAMILY.work(sig, 100)
    assert flops == 2.0 * 100 * 1 * 3 * 64 * 128 and moved > 0


@pytest.mark.parametrize("op,bidir,bf,bias", [("lstm", 0, 1, 1), ("lstm", 1, 0, 1), ("gru", 1, 1, 0)])
def test_arms_against_reference_on_cpu(op, bidir, bf, bias):
    sig = FAMILY.make_signature(op, "fp32", 10, 12, 2, bias, bidir, bf, 3)
    args, _ = FAMILY.make_inputs(sig, 9, "cpu", 1)
    ref = FAMILY.reference(sig, *args)
    assert ref.dtype == torch.float64
    for cid in ("torch", "nocudnn"):
        out = torch.full(ref.shape, float("nan"))
        y = FAMILY.launch(FAMILY.parse_config(cid), sig, *args, out=out)
        assert y is out
        torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)


def test_optimize_wraps_and_keeps_outputs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    model.pred = torch.nn.LSTM(8, 16, batch_first=True)
    x = torch.randn(2, 5, 8)
    before = model.pred(x)
    optimize(model)
    assert type(model.pred).__name__ == "TunedLSTM"
    after = model.pred(x)  # CPU: the module itself
    torch.testing.assert_close(after[0], before[0])
    assert "pred.weight_ih_l0" in model.state_dict()  # the plain model's keys


def test_both_arms_through_the_protocol_on_the_cpu():
    from tunedb.measure import protocol
    from tunedb.measure.arms import problem_for
    from tunedb.measure.eager import EagerTimer

    sig = FAMILY.make_signature("lstm", "fp32", 8, 16, 1, 1, 0, 1, 2)
    problem = problem_for(FAMILY, sig, 12, ["torch", "nocudnn"])
    assert problem.policy == "none"
    got = {m.config_id: m for m in protocol.measure_problem(problem, timer=EagerTimer(calls=2), seed=0)}
    assert set(got) == {"torch", "nocudnn"} and all(m.status.ok for m in got.values())


_INTERPRET = r"""
import torch
from tunedb.families.rnn import FAMILY
# fp16 (the interpreter's tl.dot mishandles bf16): layers, directions, time-major, batch past BB
for (h, layers, bidir, bf, b, i) in ((24, 1, 0, 1, 3, 10), (40, 2, 1, 0, 5, 12), (16, 1, 0, 1, 17, 16)):
    sig = FAMILY.make_signature("lstm", "fp16", i, h, layers, 1, bidir, bf, b)
    args, _ = FAMILY.make_inputs(sig, 6, "cpu", 0)
    ref = FAMILY.reference(sig, *args)
    base = ((FAMILY.launch(FAMILY.parse_config("torch"), sig, *args).double() - ref).norm() / ref.norm()).item()
    for cid in ("pl_bb16_bh32_bk64_w4", "pl_bb16_bh16_bk16_w4"):
        out = torch.full(ref.shape, float("nan"), dtype=torch.float16)
        y = FAMILY.launch(FAMILY.parse_config(cid), sig, *args, out=out)
        assert not torch.isnan(y).any()
        err = ((y.double() - ref).norm() / ref.norm()).item()
        assert err <= 4 * base, (cid, h, layers, bidir, bf, b, err, base)
print("ok")
"""


@pytest.mark.slow
def test_persistent_kernel_under_the_interpreter():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _INTERPRET], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


_STATES = r"""
import torch
from tunedb.families.rnn import FAMILY
from tunedb.families.rnn.launch import persistent
# the wrapped module's persistent path returns (y, (h_n, c_n)) as nn.LSTM does
torch.manual_seed(0)
lstm = torch.nn.LSTM(12, 32, num_layers=2, bidirectional=True).to(torch.float16)
x = torch.randn(5, 3, 12, dtype=torch.float16)
h0, c0 = torch.randn(4, 3, 32, dtype=torch.float16) * 0.5, torch.randn(4, 3, 32, dtype=torch.float16) * 0.5
sig = FAMILY.make_signature("lstm", "fp16", 12, 32, 2, 1, 1, 0, 3)
y, (h, c) = persistent(FAMILY.parse_config("pl_bb16_bh32_bk32_w4"), sig, x, h0, c0, *lstm._flat_weights, states=True)
ry, (rh, rc) = lstm.float()(x.float(), (h0.float(), c0.float()))
for a, b in ((y, ry), (h, rh), (c, rc)):
    assert a.shape == b.shape and a.dtype == torch.float16
    torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=2e-2)
print("ok")
"""


@pytest.mark.slow
def test_persistent_states_match_nn_lstm_under_the_interpreter():
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", _STATES], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def test_an_attribute_written_on_the_wrapper_reaches_the_lstm():
    """`model.lstm.dropout = 0.0` after optimize(): the write stayed on the wrapper and the LSTM
    kept dropping out (train-mode outputs differed from the plain model's)."""
    model = optimize(torch.nn.Sequential(torch.nn.LSTM(4, 8, num_layers=2, dropout=0.5)))
    model[0].dropout = 0.0
    assert model[0].dropout == 0.0
    model.eval()
    assert not model[0].training
