"""On the GPU: a fused Linear + activation pair whose fused key the torch arm serves runs eagerly
as the plain model does from its second call (F.linear in the Linear, the model's activation
module in its slot: the same two kernels with less host time), while a CUDA-graph capture still
gets the fused call; every output is the plain model's bits."""
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from tunedb import database  # noqa: E402
from tunedb.families.gemm import fused_pair  # noqa: E402
from tunedb.records import Entry, Region, Signature  # noqa: E402
from tunedb.runtime import launch_table, selector  # noqa: E402

pytestmark = pytest.mark.gpu

N, K = 2048, 1024


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(K, N, bias=False)
        self.act = nn.SiLU()
        self.seen: list = []

    def forward(self, x):
        h = self.fc(x)
        # what the Linear decided for this call (taken by the slot next): True = fused inside it
        pair = self.act.__dict__.get("_tunedb_fused")
        self.seen.append(None if pair is None else getattr(fused_pair._DECIDED, "d", {}).get(id(pair)))
        return self.act(h)


@pytest.mark.parametrize("pick", ["torch", None])
def test_a_fused_pair_served_by_torch_runs_unfused_eagerly_and_fused_in_a_graph(tiers_dirs, monkeypatch, pick):
    import tunedb

    monkeypatch.setenv("TUNEDB_LEAVE_UNMEASURED", "0")  # swap and fuse the Linear no table names

    sig = Signature.parse(f"gemm|op=gemm_act|dt=bf16|N={N}|K={K}|act=silu|bias=0")
    if pick:
        database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(None, pick),))], [])
    selector.reload()
    plain = Mlp().to("cuda", torch.bfloat16)
    model = tunedb.optimize(Mlp().to("cuda", torch.bfloat16))
    model.load_state_dict(plain.state_dict())
    assert type(model.act) is fused_pair.FusedActivation and model.fc.act == "silu"
    x = torch.randn(4, K, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = plain(x)
        outs = [model(x) for _ in range(3)]
        bound = launch_table.known(("gemm_act", "silu", x.shape, x.dtype, model.fc.weight.shape, x.dtype, None))
        assert bound is not None
        torch_served = bound.config.id == "torch" or bound.eager == "torch"
        assert torch_served or pick is None
        # the first call ran the fused key (the torch arm inside the Linear); later ones, where
        # the torch arm serves, the plain model's two calls
        assert model.seen == ([True, False, False] if torch_served else [True, True, True])
        assert all(torch.equal(o, want) for o in outs)
        calls = bound.calls
        model(x)
        assert bound.calls == calls + 1  # still counted for tuning_report()
        model.seen.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = model(x)
        graph.replay()
        torch.cuda.synchronize()
        assert model.seen == [True]  # a capture gets the fused call, memo or not
        ref = torch.nn.functional.silu(x.float() @ model.fc.weight.float().T)
        assert ((captured.float() - ref).norm() / ref.norm()).item() < 1e-2
        # an unfused-by-surgery model keeps working: the slot's activation is the plain one
        model.act = nn.SiLU()
        assert torch.equal(model(x), want)
