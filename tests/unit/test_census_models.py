"""The census of small models as a new user writes them, on meta tensors (the default device):
what it records must be what the model runs on a GPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tunedb.census.recorder import record


class SdpaBlock(nn.Module):
    """Attention as transformers writes it by default (attn_implementation="sdpa")."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class MatmulBlock(SdpaBlock):
    """Eager attention written out as matmuls (what the bmm family serves)."""

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def _recorded(block: nn.Module, dtype: torch.dtype) -> dict[tuple[str, str], int]:
    model = block.to(device="meta", dtype=dtype)
    x = torch.randn(2, 24, 64, dtype=dtype, device="meta")
    calls = record(lambda: model(x))
    out: dict[tuple[str, str], int] = {}
    for (sig, _m), n in calls.items():
        out[(sig.op, sig.dt)] = out.get((sig.op, sig.dt), 0) + n
    return out


def test_sdpa_on_meta_records_no_products():
    # on meta, SDPA runs torch's math path: two bmm per call, upcast to fp32 for half inputs; a
    # GPU runs one fused kernel there, so those fp32 bmm keys (one per sequence length in a
    # transformers model's census) were products no GPU run makes
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        got = _recorded(SdpaBlock(), dtype)
        want_dt = "fp32" if dtype == torch.float32 else "half"
        assert got == {("gemm", want_dt): 2}, (dtype, got)


def test_attention_written_as_matmuls_still_records_its_products():
    got = _recorded(MatmulBlock(), torch.bfloat16)
    assert got == {("gemm", "half"): 2, ("bmm", "half"): 2}


class Tagger(nn.Module):
    """A conv front end, a two-layer bidirectional LSTM, a GRU and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(16, 32, 3, padding=1)
        self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(64, 24, batch_first=True)
        self.head = nn.Linear(24, 10)

    def forward(self, x):
        h, _ = self.lstm(self.conv(x.transpose(1, 2)).transpose(1, 2))
        h, state = self.gru(h)
        return self.head(h), state


def test_recurrent_layers_record_no_gemm_per_time_step():
    # on meta (and CPU) torch runs an LSTM as one addmm per step and layer; a GPU runs cuDNN, and
    # the rnn family keys the module itself: those per-step products are no linear layer's
    model = Tagger().to(device="meta", dtype=torch.bfloat16)
    x = torch.randn(2, 12, 16, dtype=torch.bfloat16, device="meta")
    calls = record(lambda: model(x))
    gemms = {(sig.get("N"), sig.get("K"), m): n for (sig, m), n in calls.items() if sig.family == "gemm"}
    assert gemms == {(10, 24, 24): 1}  # the head alone, at M = batch x length


def _shapes(out) -> list[tuple[int, ...]]:
    y, state = out
    return [tuple(y.shape)] + [tuple(t.shape) for t in (state if isinstance(state, tuple) else (state,))]


def test_recurrent_layers_on_meta_keep_their_output_shapes():
    # the census runs one time step on meta and widens the output: the shapes must be the real ones
    for rnn in (nn.LSTM(8, 16, 2, batch_first=True, bidirectional=True, proj_size=4),
                nn.GRU(8, 16), nn.RNN(8, 16, nonlinearity="relu", batch_first=True)):
        rnn = rnn.to("meta")
        for x in (torch.randn(3, 7, 8, device="meta"), torch.randn(7, 8, device="meta")):
            got = []
            record(lambda: got.append(rnn(x)))
            assert _shapes(got[0]) == _shapes(rnn(x))


def test_a_long_recurrent_census_probe_does_no_work_per_time_step():
    # the meta decomposition ran every step: a census of this model at the synthetic token
    # lengths (up to 8192) took minutes; the work must not grow with the length
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    model = Tagger().to(device="meta", dtype=torch.bfloat16)

    def ops_at(length: int) -> int:
        x = torch.randn(8, length, 16, dtype=torch.bfloat16, device="meta")
        with Count() as count:
            out = []
            record(lambda: out.append(model(x)))
        assert tuple(out[0][0].shape) == (8, length, 10)
        return count.ops

    assert ops_at(4096) == ops_at(16)


ROUTER = """
import torch


class Router(torch.nn.Module):
    '''A forward whose control flow reads the data (a router, an early exit).'''

    def __init__(self):
        super().__init__()
        self.small = torch.nn.Linear(16, 32)
        self.large = torch.nn.Linear(16, 32, bias=False)
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = self.small(x) if x.mean() > 0 else self.large(x)
        return self.out(h)


def make(device):
    with torch.device(device):
        model = Router().to(torch.bfloat16)
    return model, lambda batch, length: (torch.randn(batch, length, 16, dtype=torch.bfloat16, device=device),)
"""


def test_a_data_dependent_forward_on_meta_is_told_to_take_the_census_on_the_cpu(tmp_path, capsys, monkeypatch):
    from tunedb import settings
    from tunedb.cli import main

    (tmp_path / "router_workload.py").write_text(ROUTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    manifest = tmp_path / "prompts.jsonl"
    manifest.write_text('{"tokens": 8}\n{"tokens": 20}\n')
    flags = ["--unit", "tokens", "--max-length", "32", "--max-batch-size", "2", "--manifest", str(manifest)]
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        assert main(["tune", "router_workload:make", *flags]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert "meta tensors" in err and "`tunedb census router_workload:make --device cpu --fused --out" in err
        assert "`tunedb tune router_workload:make --device cpu` with the same flags" in err
        # and the remedies it names work: the census on the CPU, and tune's own census there (no
        # GPU here: it prints the plan, saying nothing was measured)
        out = tmp_path / "census.json"
        assert main(["census", "router_workload:make", "--device", "cpu", "--fused", *flags, "--out", str(out)]) == 0
        capsys.readouterr()
        assert main(["tune", "router_workload:make", "--device", "cpu", *flags]) == 0
        printed = " ".join(capsys.readouterr().out.split())
        assert "nothing was measured" in printed
    assert out.exists()
