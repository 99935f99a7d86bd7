"""A dynamic token count through the op families whose keys read it, on the GPU with Inductor:
torch.compile(dynamic=True) of a call of bmm, group_gemm and scaled_mm_int8 on CUDA tensors
traces one graph for every M and matches the eager op at each (the fp64 reference for bmm).
Expected run time on the H200: about 60 s (Inductor compiles)."""
import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from tunedb.families.bmm.ops import bmm  # noqa: E402
from tunedb.families.group_gemm.ops import group_gemm  # noqa: E402
from tunedb.families.scaled_mm.ops import scaled_mm_int8  # noqa: E402

pytestmark = pytest.mark.gpu


def _cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    b = torch.randn(8, 64, 96, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g) / 8
    wi8 = torch.randint(-8, 8, (96, 128), device="cuda", dtype=torch.int8, generator=g)
    sw = torch.rand(1, 96, device="cuda", generator=g) / 64
    return {
        "bmm": (lambda a: bmm(a, b),
                lambda m: (torch.randn(8, m, 64, device="cuda", dtype=torch.bfloat16, generator=g),),
                lambda a: (a.double() @ b.double())),
        "group_gemm": (lambda x, ids: group_gemm(x, w, ids),
                       lambda m: (torch.randn(m, 64, device="cuda", dtype=torch.bfloat16, generator=g),
                                  torch.randint(0, 4, (m, 2), device="cuda", generator=g)),
                       lambda x, ids: torch.einsum("mk,mjnk->mjn", x.double(), w.double()[ids])),
        "scaled_mm_int8": (lambda x, sx: scaled_mm_int8(x, wi8, sx, sw, torch.bfloat16),
                           lambda m: (torch.randint(-8, 8, (m, 128), device="cuda", dtype=torch.int8, generator=g),
                                      torch.rand(m, 1, device="cuda", generator=g) / 64),
                           lambda x, sx: (x.double() @ wi8.double().T) * sx.double() * sw.double()),
    }


@pytest.mark.parametrize("name", ["bmm", "group_gemm", "scaled_mm_int8"])
def test_a_dynamic_inductor_compile_serves_every_token_count_from_one_graph(name):
    fn, args, reference = _cases()[name]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    with torch.no_grad():
        for m in (5, 17, 64, 300):
            a = args(m)
            got = compiled(*a)
            torch.testing.assert_close(got, fn(*a), atol=2e-2, rtol=2e-2)
            ref = reference(*a)
            torch.testing.assert_close(got.double(), ref, atol=3e-2 * ref.abs().max().item(), rtol=2e-2)
    assert counter.frame_count == 1, f"{name}: {counter.frame_count} graphs for 4 token counts"
