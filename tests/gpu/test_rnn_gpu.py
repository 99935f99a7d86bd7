"""The rnn family on the GPU: every arm (cuDNN, cuDNN off, the Triton persistent kernel where
valid) for LSTM and GRU, bf16/fp16/fp32,
uni- and bidirectional, against the fp32 (fp64) reference; each arm inside a captured CUDA graph
on fresh inputs; the wrapped module through the selector. About 20 s on an H200."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402

pytestmark = pytest.mark.gpu

FAM = families.get("rnn")
SM90 = shipped_profile("sm90")
PERSISTENT = ("pl_bb16_bh64_bk64_w4", "pl_bb16_bh128_bk64_w8", "pl_bb64_bh64_bk64_w8")
CASES = [("lstm", "bf16", 80, 320, 1, 0, 1, 16), ("lstm", "fp16", 320, 320, 2, 1, 1, 4),
         ("lstm", "fp32", 256, 512, 1, 0, 0, 1), ("gru", "bf16", 128, 256, 2, 1, 1, 8),
         ("gru", "fp32", 64, 1024, 1, 0, 1, 64)]


def rel(y, ref):
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("op,dt,i,h,layers,bidir,bf,b", CASES)
def test_both_arms_against_reference(op, dt, i, h, layers, bidir, bf, b):
    sig = FAM.make_signature(op, dt, i, h, layers, 1, bidir, bf, b)
    args, _ = FAM.make_inputs(sig, 50, "cuda", 0)
    ref = FAM.reference(sig, *args)
    errs = {}
    pl = [c for c in PERSISTENT if FAM.invalid_reason(FAM.parse_config(c), sig, 50, SM90) is None]
    for cid in ("torch", "nocudnn", *pl):
        out = torch.full(ref.shape, float("nan"), dtype=args[0].dtype, device="cuda")
        FAM.launch(FAM.parse_config(cid), sig, *args, out=out)
        assert not torch.isnan(out).any(), cid
        errs[cid] = rel(out, ref)
    # cuDNN runs fp32 RNNs in TF32 under torch's default allow_tf32=True; the native path's GEMMs do not
    bound = {"fp32": 5e-3, "fp16": 2e-2, "bf16": 5e-2}[dt]
    assert errs["torch"] < bound, errs
    assert all(e < max(bound, 4 * errs["torch"]) for e in errs.values()), errs


@pytest.mark.parametrize("cid", ["torch", "nocudnn", "pl_bb16_bh64_bk64_w4"])
def test_captured_graph_replays_fresh_inputs(cid):
    sig = FAM.make_signature("lstm", "bf16", 320, 320, 1, 1, 0, 1, 8)
    args, _ = FAM.make_inputs(sig, 100, "cuda", 1)
    cfg = FAM.parse_config(cid)
    out = torch.empty(8, 100, 320, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        FAM.launch(cfg, sig, *args, out=out)  # warm-up (cuDNN's plans) off the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        FAM.launch(cfg, sig, *args, out=out)
    args[0].copy_(torch.randn_like(args[0]))
    g.replay()
    torch.cuda.synchronize()
    assert rel(out, FAM.reference(sig, *args)) < 3e-2


def test_wrapped_module_matches():
    from tunedb.families.rnn.census import optimize

    lstm = torch.nn.LSTM(80, 320, batch_first=True).cuda()
    x = torch.randn(4, 30, 80, device="cuda")
    y0, (h0, c0) = lstm(x)
    tuned = optimize(lstm)
    y1, (h1, c1) = tuned(x)
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(c1, c0)


def test_persistent_states_match_nn_lstm():
    from tunedb.families.rnn.launch import persistent

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(128, 256, num_layers=2, bidirectional=True, batch_first=True).cuda().to(torch.bfloat16)
    x = torch.randn(8, 100, 128, device="cuda", dtype=torch.bfloat16)
    sig = FAM.make_signature("lstm", "bf16", 128, 256, 2, 1, 1, 1, 8)
    zeros = torch.zeros(4, 8, 256, device="cuda", dtype=torch.bfloat16)
    y, (h, c) = persistent(FAM.parse_config("pl_bb16_bh64_bk64_w4"), sig, x, zeros, zeros, *lstm._flat_weights, states=True)
    ry, (rh, rc) = lstm.float()(x.float())
    for a, b in ((y, ry), (h, rh), (c, rc)):
        assert a.shape == b.shape
        assert rel(a, b) < 3e-2


def test_bf16_weights_reach_cudnn_as_one_buffer():
    """bf16 weights (which nn's flatten_parameters() skips) reach cuDNN flat: no per-call
    compaction (its UserWarning is an error here), the same outputs as cuDNN's own copy."""
    import warnings

    from tunedb.families.rnn import weights

    sig = FAM.make_signature("lstm", "bf16", 64, 320, 2, 1, 1, 1, 4)
    args, _ = FAM.make_inputs(sig, 30, "cuda", 3)
    x, h0, c0, *ws = args
    assert weights.is_flat(ws)  # make_inputs' module, flattened by weights.flatten_module
    loose = [w.clone() for w in ws]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = torch._VF.lstm(x, (h0, c0), loose, True, 2, 0.0, False, True, True)[0]  # cuDNN compacts
    cfg = FAM.parse_config("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for given in (ws, loose, loose):  # the second loose call takes the cached copy
            assert torch.equal(FAM.launch(cfg, sig, x, h0, c0, *given), own)
        lstm = torch.nn.LSTM(64, 320, batch_first=True).cuda().to(torch.bfloat16)
        xb = torch.randn(4, 30, 64, device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = lstm(xb)[0]
    from tunedb.families.rnn.census import optimize

    tuned = optimize(lstm)
    tuned._flatten_once()  # what TunedLSTM.forward does before a cuDNN arm (whichever arm serves this key)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(lstm(xb)[0], plain)
    assert weights.is_flat(list(lstm.parameters()))
