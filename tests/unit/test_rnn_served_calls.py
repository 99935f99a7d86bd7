"""TunedRNN on calls the persistent kernel must not take: a training step (the kernel has no
backward: the module's weights got no gradient, with torch's 'silently incorrect' warning),
inter-layer dropout in training mode (the kernel applies none), autocast, and a bad hx (the
kernel read it unchecked). The CUDA call path is taken on the CPU here (SERVED_DEVICE), the
selector answers a persistent config, and the kernel is stood in for by the module's result
without history."""
from __future__ import annotations

import pytest
import torch

from tunedb.families.rnn import census, configs
from tunedb.runtime import launch_table

PL = configs.persistent(16, 32, 32, 4)


@pytest.fixture
def persistent_served(monkeypatch):
    monkeypatch.setattr(census, "SERVED_DEVICE", "cpu")
    monkeypatch.setattr(launch_table, "resolve", lambda family, sig, m: (PL,))
    calls = []

    def kernel(config, sig, x, h0, c0, *weights, states=False):
        calls.append(sig.format())
        rnn = torch.nn.LSTM(sig.get("I"), sig.get("H"), sig.get("L"), batch_first=True)
        with torch.no_grad():
            for p, w in zip(rnn._flat_weights, weights):
                p.copy_(w)
            y, (h, c) = rnn(x, (h0, c0))
        return y, (h, c)

    from tunedb.families.rnn import launch
    monkeypatch.setattr(launch, "persistent", kernel)
    return calls


def _model(**kw):
    torch.manual_seed(0)
    return torch.nn.LSTM(8, 16, batch_first=True, **kw)


def test_a_training_step_gets_the_modules_gradient(persistent_served):
    plain = _model()
    tuned = census.optimize(_model())
    x = torch.randn(2, 5, 8)
    plain(x)[0].square().sum().backward()
    tuned(x)[0].square().sum().backward()
    assert persistent_served == []  # a gradient is wanted: the module serves, not the kernel
    for (name, p), q in zip(plain.named_parameters(), tuned.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad)


def test_inference_takes_the_kernel(persistent_served):
    tuned = census.optimize(_model())
    with torch.no_grad():
        tuned(torch.randn(2, 5, 8))
    assert len(persistent_served) == 1


def test_training_dropout_between_layers_is_the_modules(persistent_served):
    tuned = census.optimize(_model(num_layers=2, dropout=0.5))
    with torch.no_grad():
        tuned.train()(torch.randn(2, 5, 8))
        assert persistent_served == []
        tuned.eval()(torch.randn(2, 5, 8))
    assert len(persistent_served) == 1


def test_a_bad_hx_is_torchs_error_not_a_kernel_read(persistent_served):
    tuned = census.optimize(_model())
    h = torch.zeros(1, 3, 16)  # batch 3 for an input of batch 2
    with torch.no_grad(), pytest.raises(RuntimeError, match="Expected hidden"):
        tuned(torch.randn(2, 5, 8), (h, h))
    with torch.no_grad(), pytest.raises((RuntimeError, ValueError), match="dtype|type"):
        tuned(torch.randn(2, 5, 8, dtype=torch.bfloat16))
    assert persistent_served == []


def test_autocast_is_the_modules(persistent_served):
    try:  # torch's own bf16 LSTM on this CPU: oneDNN has no bf16 LSTM primitive on some CPUs
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            _model()(torch.randn(2, 5, 8))
    except RuntimeError as exc:
        if "primitive" not in str(exc):
            raise
        pytest.skip(f"torch's bf16 LSTM does not run on this CPU ({str(exc)[:80]})")
    tuned = census.optimize(_model())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        tuned(torch.randn(2, 5, 8))
    assert persistent_served == []
