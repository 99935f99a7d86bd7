"""rnn/weights.py on the CPU: cuDNN's flat weight buffer for loose weights (a cached copy per
tensors and versions) and for modules in place (bf16 included, which nn's flatten_parameters()
skips). cuDNN itself is faked: `_cudnn_rnn_flatten_weight` by a stand-in that packs the tensors
into one buffer in place, as the aten op does; tests/gpu/test_rnn_gpu.py runs the real one."""
from __future__ import annotations

import pytest
import torch

from tunedb.families.rnn import FAMILY, weights
from tunedb.families.rnn.census import optimize
from tunedb.families.rnn.launch import run


@pytest.fixture
def fake_cudnn(monkeypatch):
    calls = []

    def flatten(ws, stride0, input_size, mode, hidden, proj, layers, batch_first, bidir):
        calls.append((len(ws), stride0, input_size, mode, hidden, layers, batch_first, bidir))
        buf = torch.empty(sum(w.numel() for w in ws), dtype=ws[0].dtype)
        at = 0
        for w in ws:
            buf[at:at + w.numel()].copy_(w.reshape(-1))
            w.set_(buf.untyped_storage(), at, w.size())
            at += w.numel()
        return buf

    monkeypatch.setattr(torch, "_cudnn_rnn_flatten_weight", flatten)
    monkeypatch.setattr(weights, "cudnn_applies", lambda ws: len(ws) > 0)
    monkeypatch.setattr(weights, "capturing", lambda: False)
    weights._COPIES.clear()
    yield calls
    weights._COPIES.clear()


def loose(sig, seed=0):
    """x, h0, c0 and separate weight tensors (what a bf16 module hands cuDNN)."""
    args, _ = FAMILY.make_inputs(sig, 7, "cpu", seed)
    x, h0, c0, *ws = args
    ws = [w.clone() for w in ws]
    assert not weights.is_flat(ws)
    return x, h0, c0, ws


def test_loose_weights_flattened_once_per_version_and_results_identical(fake_cudnn):
    sig = FAMILY.make_signature("lstm", "bf16", 12, 16, 2, 1, 1, 1, 3)
    x, h0, c0, ws = loose(sig)
    flat = weights.cudnn_weights(sig, ws)
    assert weights.is_flat(flat) and all(torch.equal(a, b) for a, b in zip(flat, ws))
    assert fake_cudnn == [(16, 4, 12, 2, 16, 2, True, True)]  # 2 layers x 2 directions x 4; stride0, I, LSTM mode, H, L, bf, bidir
    assert weights.cudnn_weights(sig, ws) is flat and len(fake_cudnn) == 1  # cached
    torch.testing.assert_close(run(sig, x, h0, c0, *ws), torch._VF.lstm(x, (h0, c0), ws, True, 2, 0.0, False, True,
                                                                         True)[0], rtol=0, atol=0)
    with torch.no_grad():
        ws[3].add_(1.0)  # an in-place update (an optimizer step): a new version, a new copy
    again = weights.cudnn_weights(sig, ws)
    assert again is not flat and len(fake_cudnn) == 2 and torch.equal(again[3], ws[3])


def test_flat_or_uncaptured_or_non_cudnn_weights_pass_as_given(fake_cudnn, monkeypatch):
    sig = FAMILY.make_signature("gru", "bf16", 8, 8, 1, 0, 0, 0, 2)
    _x, _h0, _c0, ws = loose(FAMILY.make_signature("lstm", "bf16", 8, 8, 1, 0, 0, 0, 2))
    ws = ws[:2]
    ws[0] = ws[0][: 3 * 8].clone()
    ws[1] = ws[1][: 3 * 8].clone()
    flat = weights.cudnn_weights(sig, ws)
    assert fake_cudnn[0][:4] == (2, 2, 8, 3)  # no biases: 2 tensors a layer; GRU mode
    assert weights.cudnn_weights(sig, flat) == flat and len(fake_cudnn) == 1  # one buffer already
    monkeypatch.setattr(weights, "capturing", lambda: True)
    other = [w.clone() for w in ws]
    assert weights.cudnn_weights(sig, other) == other  # never allocate inside a capture
    monkeypatch.setattr(weights, "cudnn_applies", lambda ws: False)
    monkeypatch.setattr(weights, "capturing", lambda: False)
    assert weights.cudnn_weights(sig, other) == other and len(fake_cudnn) == 1


def test_cudnn_applies_only_to_cuda_weights_with_cudnn_on():
    ws = [torch.zeros(4, 2, dtype=torch.bfloat16)]
    assert not weights.cudnn_applies(ws)  # CPU tensors (and no cuDNN here)
    assert not weights.cudnn_applies([])


def test_bf16_module_flattened_in_place_once(fake_cudnn):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 10, num_layers=2, batch_first=True).to(torch.bfloat16)
    lstm.flatten_parameters()  # nn's own: a no-op for bf16 (and off CUDA)
    assert not weights.is_flat(lstm._flat_weights)
    x = torch.randn(2, 5, 6, dtype=torch.bfloat16)
    before = lstm(x)[0]
    state = {k: v.clone() for k, v in lstm.state_dict().items()}
    assert weights.flatten_module(lstm)
    assert weights.is_flat(lstm._flat_weights) and weights.is_flat(list(lstm.parameters()))
    assert all(torch.equal(v, lstm.state_dict()[k]) for k, v in state.items())
    torch.testing.assert_close(lstm(x)[0], before, rtol=0, atol=0)
    assert weights.flatten_module(lstm) and len(fake_cudnn) == 1  # already one buffer


def test_tuned_module_flattens_once_and_after_a_move(fake_cudnn):
    gru = torch.nn.GRU(4, 8).to(torch.bfloat16)
    tuned = optimize(gru)
    tuned._flatten_once()
    tuned._flatten_once()
    assert len(fake_cudnn) == 1 and weights.is_flat(gru._flat_weights)
    gru.to(torch.float16)  # new parameter tensors: flattened again
    tuned._flatten_once()
    assert len(fake_cudnn) == 2 and weights.is_flat(gru._flat_weights)


def test_a_refused_flatten_warns_once_and_runs_the_loose_weights(fake_cudnn, monkeypatch):
    def refuse(*args):
        fake_cudnn.append(args[1:])
        raise RuntimeError("CUDNN_STATUS_BAD_PARAM")

    monkeypatch.setattr(torch, "_cudnn_rnn_flatten_weight", refuse)
    sig = FAMILY.make_signature("lstm", "bf16", 6, 8, 1, 1, 0, 1, 2)
    _x, _h0, _c0, ws = loose(sig)
    with pytest.warns(RuntimeWarning, match="refused to flatten"):
        assert weights.cudnn_weights(sig, ws) == ws
    assert weights.cudnn_weights(sig, ws) == ws and len(fake_cudnn) == 1  # not retried per call
    lstm = torch.nn.LSTM(6, 8).to(torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="refused to flatten"):
        assert weights.flatten_module(lstm) is False
