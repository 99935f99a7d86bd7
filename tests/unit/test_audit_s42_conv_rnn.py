"""Session 42 audit of the conv and rnn families as optimize() serves them on models nobody
tested (families=["conv", "rnn"], or "all": without a measured table of theirs the default
optimize() leaves both as written). On the CPU a swapped module must compute exactly what the
plain one does: the same torch op runs, so outputs and gradients are compared bitwise.

Bugs found and fixed (families/conv/ops.py):
- torch.func.vmap over an optimize()d conv ran tunedb::conv1d / conv2d, which has no vmap rule,
  once per vmapped slice (V batch-1 convolutions): other low bits than plain's batched F.conv
  (1e-7) and V calls. Under a functorch transform the entry points now run torch's conv.
- A served (CUDA fp16/bf16) call whose operands do not fit (x's channels vs the weight, an input
  shorter than the kernel, x and weight of two dtypes) raised the key's SignatureError (a
  ValueError) where the plain module raises torch's RuntimeError; it now runs torch's conv,
  which raises its own error.
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import tunedb
from audit_conv_rnn_models_s42 import ConvStemRnn
from tunedb.families.conv.patching import TunedConv1d, TunedConv2d
from tunedb.families.rnn.module import TunedGRU, TunedLSTM

FAMILIES = ["conv", "rnn"]


def _pair(make, dtype=torch.float32, train=False, families=FAMILIES):
    torch.manual_seed(0)
    plain = make().to(dtype).train(train)
    tuned = tunedb.optimize(copy.deepcopy(plain), families=families)
    return plain, tuned


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, PackedSequence):
        return [out.data, out.batch_sizes, out.sorted_indices, out.unsorted_indices]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    assert out is None, type(out)
    return []


def _assert_same(a, b):
    ta, tb = _tensors(a), _tensors(b)
    assert len(ta) == len(tb)
    for p, q in zip(ta, tb):
        if p is None or q is None:
            assert p is None and q is None
            continue
        assert p.shape == q.shape and p.dtype == q.dtype
        assert torch.equal(p, q)
        if p.numel() > 1:
            assert p.stride() == q.stride()


def _run(model, args):
    """model(*args) with the same RNG (dropout), or the exception it raises."""
    torch.manual_seed(1)
    try:
        return model(*args), None
    except Exception as exc:  # noqa: BLE001 -- compared with the plain model's below
        return None, exc


def _same_call(plain, tuned, args, train=False):
    def clone(a):
        if isinstance(a, PackedSequence):  # a namedtuple: kept whole
            return a._replace(data=a.data.detach().clone())
        if isinstance(a, torch.Tensor):
            return a.detach().clone().requires_grad_(train and a.is_floating_point())
        if isinstance(a, tuple):
            return tuple(clone(t) for t in a)
        return a
    pa, ta = clone(args), clone(args)
    (ya, ea), (yb, eb) = _run(plain, pa), _run(tuned, ta)
    if ea is not None or eb is not None:
        assert type(ea) is type(eb) and str(ea) == str(eb), (ea, eb)
        return False
    _assert_same(ya, yb)
    if train:
        loss = lambda y: sum(t.float().square().sum() for t in _tensors(y) if t is not None and t.is_floating_point())  # noqa: E731
        loss(ya).backward()
        loss(yb).backward()
        for (name, p), (_, q) in zip(plain.named_parameters(), tuned.named_parameters()):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                assert torch.equal(p.grad, q.grad), name
        for a, b in zip(_tensors(pa), _tensors(ta)):
            if a is not None and (a.grad is not None or b.grad is not None):
                assert torch.equal(a.grad, b.grad)
        plain.zero_grad(set_to_none=True)
        tuned.zero_grad(set_to_none=True)
    return True


r = torch.randn
_CL = dict(memory_format=torch.channels_last)

CONVS = {
    "conv1d dilation stride": (lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2), [(r(2, 4, 11),), (r(4, 11),), (r(0, 4, 11),)]),
    "conv1d stride > kernel": (lambda: nn.Conv1d(4, 6, 2, stride=3, bias=False), [(r(2, 4, 11),)]),
    "conv1d depthwise": (lambda: nn.Conv1d(4, 4, 5, padding=2, groups=4), [(r(2, 4, 11),), (r(4, 11),)]),
    "conv1d grouped": (lambda: nn.Conv1d(4, 8, 3, groups=2), [(r(2, 4, 11),)]),
    "conv1d non-contiguous": (lambda: nn.Conv1d(4, 6, 3, padding=1), [(r(2, 11, 4).transpose(1, 2),)]),
    "conv2d dilation stride": (lambda: nn.Conv2d(3, 5, 3, stride=(1, 2), dilation=(2, 1), padding=(1, 0)),
                               [(r(2, 3, 9, 9),), (r(3, 9, 9),), (r(0, 3, 9, 9),)]),
    "conv2d channels_last": (lambda: nn.Conv2d(3, 5, 3, padding=1), [(r(2, 3, 9, 9).contiguous(**_CL),)]),
    "conv2d depthwise no bias": (lambda: nn.Conv2d(4, 4, 3, groups=4, bias=False), [(r(2, 4, 9, 9),)]),
    "conv2d stride > kernel": (lambda: nn.Conv2d(3, 5, 2, stride=3), [(r(2, 3, 9, 9),), (r(2, 3, 9, 9)[..., ::2],)]),
    "conv2d + relu, conv2d + silu": (lambda: nn.Sequential(nn.Conv2d(3, 5, 3, stride=2), nn.ReLU(), nn.Conv2d(5, 5, 1), nn.SiLU()),
                                     [(r(2, 3, 9, 9),), (r(3, 9, 9),), (r(2, 3, 9, 9).contiguous(**_CL),), (r(0, 3, 9, 9),)]),
    "conv1d + bn + silu": (lambda: nn.Sequential(nn.Conv1d(4, 4, 3, padding=1, groups=4), nn.BatchNorm1d(4), nn.SiLU()),
                           [(r(2, 4, 11),), (r(1, 4, 11),)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", list(CONVS))
def test_swapped_convolutions_compute_what_plain_computes_bitwise(case, train, dtype):
    make, calls = CONVS[case]
    plain, tuned = _pair(make, dtype, train)
    assert any(type(m) in (TunedConv1d, TunedConv2d) for m in tuned.modules())
    for args in calls:
        assert _same_call(plain, tuned, tuple(a.to(dtype) for a in args), train)


@pytest.mark.parametrize("make", [
    lambda: nn.Conv1d(4, 6, 4, padding="same", dilation=2),
    lambda: nn.Conv2d(3, 5, 3, padding="valid"),
    lambda: nn.Conv1d(4, 6, 3, padding=1, padding_mode="reflect"),
    lambda: nn.Conv2d(3, 5, 3, padding=1, padding_mode="replicate"),
    lambda: nn.Conv2d(3, 5, 3, padding=2, padding_mode="circular"),
    lambda: nn.ConvTranspose2d(3, 5, 3),
    lambda: nn.Conv3d(3, 2, 1),
    lambda: nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3)),
    lambda: nn.utils.parametrizations.spectral_norm(nn.Conv2d(3, 5, 3)),
    lambda: nn.RNN(4, 6),
    lambda: nn.LSTMCell(4, 6),
    lambda: nn.GRUCell(4, 6),
], ids=["same", "valid", "reflect", "replicate", "circular", "transpose", "conv3d", "weight_norm",
        "spectral_norm", "rnn_tanh", "lstmcell", "grucell"])
def test_modules_no_kernel_serves_keep_their_class_and_output(make):
    plain, tuned = _pair(make)
    assert type(tuned) is type(plain)
    shape = {nn.Conv1d: (2, 4, 11), nn.Conv3d: (2, 3, 4, 4, 4), nn.RNN: (5, 3, 4), nn.LSTMCell: (3, 4),
             nn.GRUCell: (3, 4)}
    x = r(*next((s for cls, s in shape.items() if isinstance(plain, cls)), (2, 3, 9, 9)))
    assert _same_call(plain, tuned, (x,))


def _pack(bf, sorted_=True):
    x = r(3, 5, 4) if bf else r(5, 3, 4)
    lengths = torch.tensor([5, 3, 2] if sorted_ else [2, 5, 3])
    return pack_padded_sequence(x, lengths, batch_first=bf, enforce_sorted=sorted_)


RNNS = {
    "lstm": (lambda: nn.LSTM(4, 6), [(r(5, 3, 4),), (r(5, 4),), (r(5, 3, 4), (r(1, 3, 6), r(1, 3, 6))),
                                     (r(5, 4), (r(1, 6), r(1, 6))), (r(0, 3, 4),)]),
    "lstm batch_first bidirectional 2 layers dropout": (
        lambda: nn.LSTM(4, 6, num_layers=2, batch_first=True, bidirectional=True, dropout=0.3),
        [(r(3, 5, 4),), (r(3, 5, 4), (r(4, 3, 6), r(4, 3, 6))), (r(5, 4),), (_pack(True),)]),
    "lstm proj_size": (lambda: nn.LSTM(4, 6, num_layers=2, proj_size=3),
                       [(r(5, 3, 4),), (r(5, 3, 4), (r(2, 3, 3), r(2, 3, 6))), (_pack(False),)]),
    "gru 2 layers dropout": (lambda: nn.GRU(4, 6, num_layers=2, dropout=0.5),
                             [(r(5, 3, 4),), (r(5, 3, 4), r(2, 3, 6)), (r(5, 4),), (_pack(False),), (_pack(False, False),)]),
    "gru batch_first bidirectional no bias": (lambda: nn.GRU(4, 6, batch_first=True, bidirectional=True, bias=False),
                                              [(r(3, 5, 4),), (r(3, 5, 4), r(2, 3, 6)), (_pack(True),)]),
}


def _to(args, dtype):
    out = []
    for a in args:
        if isinstance(a, PackedSequence):
            out.append(a._replace(data=a.data.to(dtype)))
        elif isinstance(a, tuple):
            out.append(tuple(t.to(dtype) for t in a))
        else:
            out.append(a.to(dtype))
    return tuple(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("case", list(RNNS))
def test_swapped_recurrent_layers_compute_what_plain_computes_bitwise(case, train, dtype):
    make, calls = RNNS[case]
    plain, tuned = _pair(make, dtype, train)
    assert type(tuned) in (TunedLSTM, TunedGRU) and isinstance(tuned, type(plain))
    computed = 0
    for args in calls:  # an empty sequence raises, in both alike (_same_call compares the errors)
        computed += _same_call(plain, tuned, _to(args, dtype), train)
    assert computed >= len(calls) - 1


BAD = [
    (lambda: nn.Conv2d(3, 5, 3), (r(2, 4, 9, 9),)),  # channels
    (lambda: nn.Conv2d(3, 5, 3), (r(2, 3, 2, 2),)),  # shorter than the kernel
    (lambda: nn.Conv2d(3, 5, 3), (r(3, 9),)),  # rank
    (lambda: nn.Conv2d(3, 5, 3), (r(2, 3, 9, 9).to(torch.bfloat16),)),  # dtype
    (lambda: nn.Conv2d(3, 5, 3), (torch.ones(2, 3, 9, 9, dtype=torch.long),)),
    (lambda: nn.Conv1d(4, 8, 3, groups=2), (r(2, 3, 9),)),
    (lambda: nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU()), (r(2, 4, 9, 9),)),
    (lambda: nn.Sequential(nn.Conv1d(4, 4, 3, groups=4), nn.BatchNorm1d(4), nn.SiLU()).eval(), (r(2, 3, 9),)),
    (lambda: nn.LSTM(4, 6), (r(5, 3, 3),)),
    (lambda: nn.LSTM(4, 6), (r(5, 3, 4), (r(1, 2, 6), r(1, 2, 6)))),
    (lambda: nn.LSTM(4, 6), (r(5, 3, 4), r(1, 3, 6))),
    (lambda: nn.GRU(4, 6), (r(5, 3, 4), r(2, 3, 6))),
    (lambda: nn.GRU(4, 6), (r(5, 3, 4).double(),)),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_inputs_raise_what_the_plain_module_raises(i):
    make, args = BAD[i]
    plain, tuned = _pair(make)
    assert not _same_call(plain, tuned, args)  # both raised, the same type and message


def test_a_served_call_with_operands_that_do_not_fit_raises_torchs_error(monkeypatch):
    """The CUDA fp16/bf16 path keys the call first; a key error (a ValueError) was raised where the
    plain conv raises its RuntimeError. No GPU here: is_cuda is faked so that the served path runs
    (its selection then resolves the torch arm, which computes on the CPU)."""
    from tunedb.families.conv import ops

    w = r(5, 3, 3, 3).to(torch.bfloat16)
    calls = [(r(2, 4, 8, 8).to(torch.bfloat16), w), (r(2, 3, 2, 2).to(torch.bfloat16), w),
             (r(2, 3, 8, 8).half(), w)]
    expected = []
    for x, weight in calls:
        with pytest.raises(RuntimeError) as plain:
            torch.nn.functional.conv2d(x, weight)
        expected.append(str(plain.value))
    ok = r(2, 3, 8, 8).to(torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    for (x, weight), message in zip(calls, expected):
        with pytest.raises(RuntimeError) as tuned:
            ops.conv2d(x, weight)
        assert str(tuned.value) == message
    assert torch.equal(ops.conv2d(ok, w), torch.nn.functional.conv2d(ok, w))  # the served path ran


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.Conv2d(3, 5, 3), (2, 3, 8, 8)),
    (lambda: nn.Conv1d(4, 6, 3, stride=2), (2, 4, 11)),
    (lambda: nn.Sequential(nn.Conv2d(3, 5, 3), nn.ReLU(), nn.Conv2d(5, 2, 1)), (2, 3, 8, 8)),
], ids=["conv2d", "conv1d", "conv2d+relu"])
def test_vmap_over_an_optimized_conv_is_plains_batched_conv(make, shape):
    plain, tuned = _pair(make)
    assert any(type(m) in (TunedConv1d, TunedConv2d) for m in tuned.modules())
    x = r(*shape)
    for model_args in ((lambda m: torch.func.vmap(m)(x)),  # unbatched per slice
                       (lambda m: torch.func.vmap(lambda xi: m(xi.unsqueeze(0)))(x)),
                       (lambda m: torch.func.vmap(m, in_dims=1)(x.unsqueeze(1).expand(-1, 3, *shape[1:]).contiguous()))):
        _assert_same(model_args(plain), model_args(tuned))


def test_per_sample_gradients_through_an_optimized_conv_match_plain():
    plain, tuned = _pair(lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(0), nn.Linear(4 * 36, 1)),
                         families=["conv"])
    x = r(4, 3, 8, 8)

    def per_sample(model):
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, xi):
            return torch.func.functional_call(model, p, (xi,)).square().sum()
        return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)

    a, b = per_sample(plain), per_sample(tuned)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _model_pair():
    torch.manual_seed(0)
    plain = ConvStemRnn().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    kinds = {type(m).__name__ for m in tuned.modules()}
    assert {"TunedConv2d", "FusedActivation", "TunedConv1d", "AbsorbedBatchNorm1d", "TunedLSTM", "TunedGRU"} <= kinds
    return plain, tuned


def test_a_model_of_every_swapped_module_trains_and_infers_as_plain():
    plain, tuned = _model_pair()
    x = r(2, 1, 33, 11)
    with torch.no_grad():
        _assert_same(plain(x), tuned(x))
    plain.train(), tuned.train()
    assert _same_call(plain, tuned, (x,), train=True)


def test_state_dict_deepcopy_pickle_and_torch_save_round_trip():
    plain, tuned = _model_pair()
    x = r(2, 1, 33, 11)
    assert list(tuned.state_dict()) == list(plain.state_dict())
    fresh = copy.deepcopy(plain)
    fresh.load_state_dict(tuned.state_dict())
    buf = io.BytesIO()
    torch.save(tuned, buf)
    buf.seek(0)
    copies = [copy.deepcopy(tuned), pickle.loads(pickle.dumps(tuned)), torch.load(buf, weights_only=False)]
    with torch.no_grad():
        want = plain(x)
        _assert_same(fresh(x), want)
        for c in copies:
            assert type(c.lstm) is TunedLSTM and type(c.dw[0]) is TunedConv1d
            _assert_same(c(x), want)


def test_jit_trace_and_torch_compile_run_as_plain():
    plain, tuned = _model_pair()
    x = r(2, 1, 33, 11)
    with torch.no_grad():
        want = plain(x)
        traced = torch.jit.trace(tuned, (x,), check_trace=False)
        _assert_same(traced(x), want)
        torch._dynamo.reset()
        compiled = torch.compile(tuned, backend="eager")
        _assert_same(compiled(x), want)
    torch._dynamo.reset()


def test_hooks_on_a_conv_and_an_lstm_fire_as_on_plain():
    plain, tuned = _model_pair()
    x = r(2, 1, 33, 11)
    seen = {id(plain): [], id(tuned): []}
    for model in (plain, tuned):
        for m in (model.stem[0], model.stem[1], model.dw[1], model.lstm):
            m.register_forward_hook(lambda mod, args, out, log=seen[id(model)]: log.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        _assert_same(plain(x), tuned(x))
    assert len(seen[id(plain)]) == len(seen[id(tuned)]) == 4
    for a, b in zip(seen[id(plain)], seen[id(tuned)]):
        assert torch.equal(a, b)


def test_tuning_report_after_conv_and_rnn_calls():
    plain, tuned = _model_pair()
    with torch.no_grad():
        tuned(r(2, 1, 33, 11))
    report = tunedb.tuning_report()
    assert isinstance(report, str) and report
