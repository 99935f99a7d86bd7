"""`tunedb tune` of a MoE model nobody gave us: the fused census (of tunedb.optimize(model), on
meta tensors) keys the swapped experts' group_gemm calls as the run time does, in the family's own
dtype. Before session 28 the op recorded nothing, and the census's generic `half` dtype (which
group_gemm does not key) would have hidden them anyway: "a GPU would measure nothing here"."""
import pytest

from tunedb import families, pipeline

transformers = pytest.importorskip("transformers")

MODULE = '''
import torch, transformers
def make(device="cpu"):
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=128)
    with torch.device(device):
        model = transformers.MixtralForCausalLM(cfg).to(torch.bfloat16)
    return model, lambda b, n: (torch.zeros(b, n, dtype=torch.long, device=device),)
'''


def test_a_fused_census_of_a_moe_model_keys_its_experts(tmp_path, monkeypatch):
    (tmp_path / "moe_s28.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    shapes = pipeline.take_census("moe_s28:make", unit="tokens", max_length=64, max_batch=2, fused=True)
    fam = families.get("group_gemm")
    sigs = {p.signature for p in shapes.points if p.signature.family == "group_gemm"}
    assert {s.format() for s in sigs} == {
        "group_gemm|op=group_gemm|dt=bf16|E=4|N=192|K=64|top_k=2|x=token",  # gate_up: x per token
        "group_gemm|op=group_gemm|dt=bf16|E=4|N=64|K=96|top_k=2|x=slot"}  # down: x per slot
    assert all(families.serves(fam, s) for s in sigs)
    # two layers: each experts module calls both keys once a forward
    by_sig = {}
    for p in shapes.points:
        by_sig.setdefault(p.signature.family, set()).add(p.m)
    assert by_sig["group_gemm"] and all(m >= 1 for m in by_sig["group_gemm"])
    # the expert GEMMs are not counted again as aten GEMMs of the gemm family
    assert not any(p.signature.family == "gemm" and p.signature.get("N") == 192 for p in shapes.points)


def test_an_aten_level_census_of_a_moe_model_says_its_experts_are_missing(tmp_path, monkeypatch, capsys):
    """Without --fused no expert GEMM is keyed (transformers' expert blocks issue no aten call a
    family keys): the census says so in its meta and its summary, instead of reporting "0 points
    of ops no family tunes" (session 33's model audit)."""
    from tunedb import cli

    (tmp_path / "moe_s33.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    shapes = pipeline.take_census("moe_s33:make", unit="tokens", max_length=64, max_batch=2, fused=False)
    assert not any(p.signature.family == "group_gemm" for p in shapes.points)
    assert dict(shapes.meta)["experts_not_recorded"].startswith("2 (model.layers.0.mlp.experts")
    out = tmp_path / "c.json"
    assert cli.main(["census", "moe_s33:make", "--unit", "tokens", "--max-length", "64", "--max-batch-size", "2",
                     "--out", str(out)]) == 0
    assert "mixture-of-experts block(s) are not in this census" in capsys.readouterr().out
