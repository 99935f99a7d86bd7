"""The GPU checks the gemm_log_softmax tests share (test_gemm_log_softmax_{rows_vec,chunks}_gpu.py):
a config launched in a captured CUDA graph of back-to-back calls over three input sets, replayed on
fresh inputs, each output against the fp32 reference within 4x the torch arm's error."""
import torch

from tunedb import families

FAM = families.get("gemm_log_softmax")


def rel(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def torch_err(sig, args, ref):
    return rel(FAM.launch(FAM.parse_config("torch"), sig, *args), ref)


def replays_on_fresh_inputs(cfg, sig, m, n, what):
    """Capture three back-to-back calls of `cfg` (compiled and warmed first, outside the capture),
    then twice: copy fresh inputs in, NaN-poison the outputs, replay, check every output."""
    ins = [FAM.make_inputs(sig, m, "cuda", s)[0] for s in range(3)]
    outs = [torch.empty((m, n), dtype=torch.bfloat16, device="cuda") for _ in ins]
    for a, o in zip(ins, outs):
        FAM.launch(cfg, sig, *a, out=o)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a, o in zip(ins, outs):
            FAM.launch(cfg, sig, *a, out=o)
    for seed in (10, 20):
        for i, (a, o) in enumerate(zip(ins, outs)):
            fresh = FAM.make_inputs(sig, m, "cuda", seed + i)[0]
            for dst, src in zip(a, fresh):
                dst.copy_(src)
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for a, o in zip(ins, outs):
            ref = FAM.reference(sig, *a)
            assert not torch.isnan(o).any() and rel(o, ref) <= 4 * torch_err(sig, a, ref), (what, seed)
