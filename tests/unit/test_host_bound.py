"""Eager calls of host-bound shapes (runtime/host_bound.py, the GEMM family's eager_fallback hook):
a split-K config serves captured calls and the fallback serves eager ones where cuBLAS's kernel is
shorter than the config's launches cost the host."""
from __future__ import annotations

import dataclasses

import pytest

from tunedb import families, settings
from tunedb.arch import shipped_profile
from tunedb.families.gemm.model import eager_fallback
from tunedb.records import Config, Signature
from tunedb.runtime import host_bound

PROFILE = shipped_profile("sm90")
GEMM = families.get("gemm")
SPLITK = GEMM.parse_config("sk8_b16x64x128_w4_s4")
TILE = GEMM.parse_config("b64x64x64_w4_s3_g8")


def sig(n: int, k: int, op: str = "gemm", **extra) -> Signature:
    return Signature.make("gemm", op, "bf16", N=n, K=k, **extra)


def test_split_k_on_a_microsecond_gemm_serves_torch_eagerly():
    # Llama-3-8B's k/v projection at decode: cuBLAS runs it in a few us, under two launches' host time
    assert eager_fallback(sig(1024, 4096), 1, SPLITK, PROFILE) == "torch"
    # a single-launch tile too: its Triton launch costs the host more than cuBLAS's, and its GPU
    # saving buys nothing where the step is host-bound (session 43)
    assert eager_fallback(sig(1024, 4096), 1, TILE, PROFILE) == "torch"
    # ... but not a GEMM longer than TUNEDB_EAGER_KERNEL_US
    assert eager_fallback(sig(14336, 4096), 2048, TILE, PROFILE) is None
    # a fused activation too: its one Triton launch cost an HF decoder's eager step more than
    # torch's GEMM and elementwise kernels (session 57's bisect) ...
    act = sig(14336, 4096, "gemm_act", act="silu", bias=0)
    assert eager_fallback(act, 1, TILE, PROFILE) == "torch"
    assert eager_fallback(sig(1024, 4096, "gemm_act", act="silu", bias=0), 1, SPLITK, PROFILE) == "torch"
    # ... while a long one (a prefill's) serves eagerly, fused
    assert eager_fallback(act, 2048, TILE, PROFILE) is None
    # a GEMM far longer than two launches runs GPU-bound even eagerly: the config serves
    assert eager_fallback(sig(14336, 4096), 2048, SPLITK, PROFILE) is None
    assert eager_fallback(sig(1024, 4096), 1, Config.sentinel("torch"), PROFILE) is None


def test_a_decode_gemm_under_the_eager_kernel_bound_is_torch_eagerly_whatever_one_launch_costs(monkeypatch):
    """An eager decode step is host-bound as a whole: Llama-3-8B's up projection at 16 rows (a
    117 MB weight, tens of microseconds of kernel, longer than a launch) still goes to torch eagerly
    under TUNEDB_EAGER_KERNEL_US (default 64); '0' leaves only the launch-count rule."""
    monkeypatch.delenv("TUNEDB_EAGER_KERNEL_US", raising=False)
    assert settings.eager_kernel_us() == 64
    assert eager_fallback(sig(14336, 4096), 16, TILE, PROFILE) == "torch"
    assert eager_fallback(sig(4096, 14336), 1, TILE, PROFILE) == "torch"
    assert eager_fallback(sig(14336, 4096), 2048, TILE, PROFILE) is None  # a prefill GEMM: GPU-bound
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "0")
    assert eager_fallback(sig(14336, 4096), 16, TILE, PROFILE) is None
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "1e3")
    with pytest.raises(Exception, match="TUNEDB_EAGER_KERNEL_US='1e3' is not a whole number"):
        settings.eager_kernel_us()


def test_a_slower_host_moves_the_line(monkeypatch):
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "0")  # the launch-count rule alone
    slow = dataclasses.replace(PROFILE, launch_us_eager=1000.0)
    fast = dataclasses.replace(PROFILE, launch_us_eager=0.01)
    assert eager_fallback(sig(14336, 4096), 16, SPLITK, slow) == "torch"
    assert eager_fallback(sig(1024, 4096), 1, SPLITK, fast) is None


def test_graph_only_serves_the_tuned_launcher_while_capturing(monkeypatch):
    calls = []
    call = host_bound.graph_only(lambda *a: calls.append(("tuned", a)), lambda *a: calls.append(("eager", a)))
    monkeypatch.setattr(host_bound, "_capturing", lambda: False)
    call(1, 2)
    monkeypatch.setattr(host_bound, "_capturing", lambda: True)
    call(3)
    assert calls == [("eager", (1, 2)), ("tuned", (3,))]


def test_the_rule_judges_only_selector_tiers_and_obeys_its_setting(monkeypatch):
    monkeypatch.setattr(host_bound, "_cuda", lambda: True)
    s = sig(1024, 4096)
    assert host_bound.eager_fallback(GEMM, s, 1, SPLITK, "system") == "torch"
    assert host_bound.eager_fallback(GEMM, s, 1, SPLITK, "autotune") is None  # an override pins
    assert host_bound.eager_fallback(GEMM, s, 1, Config.sentinel("torch"), "system") is None
    with settings.override(EAGER_FALLBACK="0"):
        assert host_bound.eager_fallback(GEMM, s, 1, SPLITK, "system") is None
    monkeypatch.setattr(host_bound, "_cuda", lambda: False)  # no CUDA: no graphs, nothing to split
    assert host_bound.eager_fallback(GEMM, s, 1, SPLITK, "system") is None


def test_the_setting_refuses_a_bad_value():
    with settings.override(EAGER_FALLBACK="yes"):
        with pytest.raises(Exception, match="TUNEDB_EAGER_FALLBACK='yes'"):
            settings.eager_fallback_enabled()


def test_graph_only_primes_the_tuned_launcher_once_and_reads_the_stream_handle_first(monkeypatch):
    """With prime, the first eager call also runs the tuned launcher (a capture after an eager
    warm-up then loads and allocates nothing); on a default stream torch's capture query is
    never asked; a side stream asks it, and a capture there gets the tuned launcher."""
    calls, asked, on_default = [], [], [True]
    monkeypatch.setattr(host_bound, "_cuda", lambda: True)
    monkeypatch.setattr(host_bound, "_default_stream_check", lambda: (lambda: on_default[0]))
    monkeypatch.setattr(host_bound, "_capturing", lambda: asked.append(1) or not on_default[0])
    call = host_bound.graph_only(lambda *a: calls.append(("tuned", a)) or "t",
                                 lambda *a: calls.append(("eager", a)) or "e", prime=True)
    assert call(1) == "e" and call(2) == "e"
    assert calls == [("tuned", (1,)), ("eager", (1,)), ("eager", (2,))] and asked == []
    on_default[0] = False  # a side stream, capturing
    assert call(3) == "t" and asked == [1] and calls[-1] == ("tuned", (3,))
    unprimed = host_bound.graph_only(lambda *a: calls.append(("tuned", a)), lambda *a: calls.append(("eager", a)))
    on_default[0] = True
    unprimed(4)
    assert calls[-1] == ("eager", (4,)) and calls[-2] == ("tuned", (3,))  # no prime without it
