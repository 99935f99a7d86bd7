"""A family's eager_fallback hook on runtime.dispatch's path (every family but GEMM's linear ops):
gemm_log_softmax's chunked_rows configs whose launches make an eager call host-bound serve torch
outside CUDA-graph capture and the tuned config inside it, as launch_table does for GEMM. No GPU:
meta tensors key the call, the family's launch is a recorder, capture is faked."""
from __future__ import annotations

import pytest
import torch

from tunedb import database, families
from tunedb.records import Entry, Region
from tunedb.runtime import dispatch, host_bound, selector

FAM = families.get("gemm_log_softmax")
OP = "gemm_log_softmax"


@pytest.fixture
def glsm(tiers_dirs, monkeypatch):
    ran: list[str] = []

    def launch(config, sig, *args, out=None):
        ran.append(config.id)
        return config.id

    monkeypatch.setattr(FAM, "launch", launch)  # bound by dispatch._launcher at bind time
    monkeypatch.setattr(host_bound, "_cuda", lambda: True)  # a CUDA build: eager calls exist
    dispatch.clear()
    yield ran
    dispatch.clear()


def _serve(cid: str, m: int) -> tuple:
    sig = FAM.make_signature(16000, 512, "bf16", 1)
    database.write_entries("user", FAM.name, "sm90", [Entry(sig, (Region(None, cid),))], [FAM.parse_config(cid)])
    selector.reload()
    meta = dict(device="meta", dtype=torch.bfloat16)
    return torch.empty(m, 512, **meta), torch.empty(16000, 512, **meta), torch.empty(16000, **meta)


def test_a_host_bound_chunked_config_serves_torch_eagerly_and_itself_under_capture(glsm, monkeypatch):
    cid = "lc_m256_st1_r1_c8192_w8"  # 32 chunks at M = 8192: 64 launches outrun torch's eager time
    args = _serve(cid, 8192)
    assert FAM.eager_fallback(FAM.make_signature(16000, 512, "bf16", 1), 8192, FAM.parse_config(cid),
                              selector.current_arch()[1]) == "torch"
    monkeypatch.setattr(host_bound, "_capturing", lambda: False)
    assert dispatch.call(FAM.name, OP, *args) == "torch"
    b = dispatch.bound(FAM.name, OP, *args)
    assert b.config.id == cid and b.eager == "torch"  # the report still names the tuned pick
    monkeypatch.setattr(host_bound, "_capturing", lambda: True)
    assert dispatch.call(FAM.name, OP, *args) == cid
    assert glsm == ["torch", cid]


def test_a_config_the_rule_does_not_flag_serves_eager_calls_too(glsm, monkeypatch):
    cid = "lc_m1024_st2_r1_c8192_w8"  # 8 chunks of 1024 on two streams: under torch's eager time
    args = _serve(cid, 8192)
    monkeypatch.setattr(host_bound, "_capturing", lambda: False)
    assert dispatch.call(FAM.name, OP, *args) == cid
    assert dispatch.bound(FAM.name, OP, *args).eager is None


def test_graph_only_passes_an_ops_keyword_arguments_through(monkeypatch):
    # dispatch.call(family, op, *args, **kwargs) hands the bound launcher the op's kwargs
    call = host_bound.graph_only(lambda *a, **k: ("tuned", a, k), lambda *a, **k: ("eager", a, k))
    monkeypatch.setattr(host_bound, "_capturing", lambda: False)
    assert call(1, out=2) == ("eager", (1,), {"out": 2})
    monkeypatch.setattr(host_bound, "_capturing", lambda: True)
    assert call(1, out=2) == ("tuned", (1,), {"out": 2})
