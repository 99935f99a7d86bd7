"""The eager shortcut of a Triton-served linalg key (triton_launcher.prepare, which ops.run keeps
per key) launches what the general path (launch.launch) launches: under the Triton interpreter,
the same result bit for bit for each argument form (dot/gemv/gemm, trsv, potrf, posv with and
without a workspace), and None for what it does not take (a strided input, an invalid config).
On a CPU tensor get_device() is -1, so the child makes the "current device" -1 too."""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

CASES = [("gemv", "warp_p8_w1", 8, "fp32", 37), ("dot", "thread_p32_w1", 5, "fp64", 33),
         ("gemm", "block_w1", 4, "fp32", 9), ("trsv", "thread_p32_w1", 6, "fp32", 35),
         ("potrf", "reg_p32_w1", 8, "fp64", 40), ("posv", "reg_p32_w1", 7, "fp32", 33),
         ("posv", "thread_p32_w1", 4, "fp64", 33)]


def _child() -> None:
    import torch

    from tunedb.families.linalg import launch, problems, triton_launcher
    from tunedb.families.linalg.signatures import make_signature

    torch._C._cuda_getDevice = lambda: -1  # the CPU tensors' "device"
    failures = []
    for op, cid, n, dt, batch in CASES:
        args, _ = problems.make_inputs(make_signature(op, dt, n), batch, "cpu", 0)
        args = tuple(t.contiguous() for t in args)  # trsv's L comes column-major: the general path's
        call = triton_launcher.prepare(op, cid, n, batch, dt)
        if call is None:
            failures.append(f"{op} {cid}: no prepared launch")
            continue
        got, want = call(tuple(args)), launch.launch(op, cid, *args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            if not torch.equal(g, w):
                failures.append(f"{op} {cid} n={n} {dt}: differs from launch.launch")
        strided = (args[0].mT.contiguous().mT, *args[1:]) if args[0].dim() == 3 else (args[0][:, ::1].t().contiguous().t(), *args[1:])
        if not strided[0].is_contiguous() and call(tuple(strided)) is not None:
            failures.append(f"{op} {cid}: took a strided input")
    if triton_launcher.prepare("posv", "reg_p32_w1", 17, 64, "fp32") is not None:  # spills: invalid
        failures.append("an invalid config was prepared")
    if triton_launcher.prepare("gemv", "cuda_p8_w1", 8, 64, "fp32") is not None:
        failures.append("a CUDA-tier id was prepared as a Triton one")
    interpret_child.report(failures)


@pytest.mark.slow
def test_the_prepared_triton_launch_gives_the_general_paths_result():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


if __name__ == "__main__":
    _child()
