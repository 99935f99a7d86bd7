"""Session 42 audit: transformers encoder, encoder-decoder, vision and speech models (tiny configs,
random weights, no hub) under tunedb.optimize(model) and optimize(model, families="all"). On a
CPU every swapped module runs torch's own op, so outputs, losses and gradients are compared
bitwise with the plain model's, in eval and in train mode (dropout seeded alike).

Bug found and fixed (families/gemm/ops_autograd.py, _TunedGemm.forward):
- Where a gradient is wanted, a TunedLinear with a bias on a 3-D input returned a view (the torch
  arm's F.linear reshapes its 2-D addmm) out of an autograd.Function, and such a view may not be
  modified in place. Longformer's global attention (`q /= sqrt(d)`) and DeBERTa's disentangled
  attention (`pos_query_layer /= ...` on a permute of it) raised "Output 0 of _TunedGemm is a view
  and is being modified inplace" in a training step with families="all"; plain trains. The
  Function's output is now a plain (non-view) tensor, as aten's linear makes it.
"""
from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch

pytest.importorskip("transformers")

import tunedb  # noqa: E402
from audit_hf_others_s42 import MODELS, available, build, inputs  # noqa: E402

FAMILIES = (None, "all")


def _need(name: str) -> None:
    if not available(name):
        pytest.skip(f"transformers lacks {name}")


def _tensors(out) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a ModelOutput (nested outputs and tuples included), by name."""
    found = []
    items = out.items() if hasattr(out, "items") else enumerate(out)
    for key, value in items:
        if isinstance(value, torch.Tensor):
            found.append((str(key), value))
        elif isinstance(value, (tuple, list)) or hasattr(value, "items"):
            found += [(f"{key}.{k}", v) for k, v in _tensors(value)]
    return found


def _assert_same(a, b) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert [k for k, _ in ta] == [k for k, _ in tb]
    for (key, x), (_k, y) in zip(ta, tb):
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), f"{key}: max diff {(x.float() - y.float()).abs().max().item()}"


def _assert_same_grads(plain, tuned) -> None:
    gp, gt = dict(plain.named_parameters()), dict(tuned.named_parameters())
    assert gp.keys() == gt.keys()
    for key, p in gp.items():
        q = gt[key]
        assert (p.grad is None) == (q.grad is None), key
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), key


def _loss(out) -> torch.Tensor:
    if getattr(out, "loss", None) is not None:
        return out.loss
    return sum(t.float().square().mean() for _k, t in _tensors(out) if t.is_floating_point())


def _optimized(plain, families):
    return tunedb.optimize(copy.deepcopy(plain), families=families)


# near-twins of a model above left out, to keep this file fast (mbart, pegasus: bart's; deit: vit's;
# the layer-norm wav2vec2: the group-norm one's modules)
_TWINS = ("mbart", "pegasus", "deit", "wav2vec2-ctc-layernorm")


@pytest.mark.parametrize("name", [n for n in MODELS if n not in _TWINS])
def test_outputs_and_gradients_equal_plain(name):
    """Eval outputs, a seeded train-mode forward and its gradients, and state_dict keys: bitwise
    the plain model's, for the default optimize() and families="all"."""
    _need(name)
    plain = build(name)
    tuned = {fam: _optimized(plain, fam) for fam in FAMILIES}
    x = inputs(name)
    with torch.no_grad():
        want = plain(**x)
        for model in tuned.values():
            _assert_same(want, model(**x))
            assert model.state_dict().keys() == plain.state_dict().keys()
    plain.train()
    torch.manual_seed(1)
    want = plain(**x)
    _loss(want).backward()
    for model in tuned.values():
        model.train()
        torch.manual_seed(1)
        got = model(**x)
        _assert_same(want, got)
        _loss(got).backward()
        _assert_same_grads(plain, model)


BF16 = ["bert-seqcls", "deberta", "t5-gated", "mbart", "deit", "clip", "whisper", "wav2vec2-ctc-layernorm",
        "speech2text"]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", BF16)
def test_bf16_under_each_attention_implementation(name, attn):
    _need(name)
    if attn == "sdpa" and not MODELS[name][2]:
        pytest.skip(f"{name} has no sdpa attention")
    plain = build(name, attn, torch.bfloat16)
    x = inputs(name, torch.bfloat16)
    with torch.no_grad():
        want = plain(**x)
        for fam in FAMILIES:
            _assert_same(want, _optimized(plain, fam)(**x))


@pytest.mark.parametrize("name", ["bart", "marian", "t5", "whisper"])
def test_generate_gives_plain_tokens(name):
    _need(name)
    plain = build(name)
    x = {k: v for k, v in inputs(name).items() if k != "decoder_input_ids"}
    kw = dict(max_new_tokens=5, do_sample=False)
    with torch.no_grad():
        want = plain.generate(**x, **kw)
        beams = plain.generate(**x, num_beams=2, **kw)
        for fam in FAMILIES:
            tuned = _optimized(plain, fam)
            assert torch.equal(tuned.generate(**x, **kw), want)
        assert torch.equal(tuned.generate(**x, num_beams=2, **kw), beams)  # families="all"


LABELS = {
    "bert-seqcls": lambda: torch.tensor([0, 2]),
    "roberta-tokcls": lambda: torch.randint(0, 5, (2, 7), generator=torch.Generator().manual_seed(0)),
    "bert-mlm": lambda: torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(0)),
    "wav2vec2-ctc": lambda: torch.tensor([[1, 2, 3], [4, 5, 6]]),
    "hubert-ctc": lambda: torch.tensor([[1, 2, 3], [4, 5, 6]]),
    "bart": lambda: torch.tensor([[5, 6, 7, 2], [8, 9, 2, -100]]),
}


@pytest.mark.parametrize("name", list(LABELS))
def test_head_losses_and_gradients_equal_plain(name):
    """The losses users train with (classification, token classification, masked LM, CTC, seq2seq
    labels) and their gradients, in train mode with dropout."""
    _need(name)
    plain = build(name).train()
    x = {k: v for k, v in inputs(name).items() if k != "decoder_input_ids"}
    x["labels"] = LABELS[name]()
    torch.manual_seed(1)
    want = plain(**x)
    want.loss.backward()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    torch.manual_seed(1)
    got = tuned(**x)
    got.loss.backward()
    assert torch.equal(want.loss, got.loss)
    _assert_same_grads(plain, tuned)


@pytest.mark.parametrize("name", ["bert-mlm", "t5", "whisper", "wav2vec2-ctc"])
def test_save_pretrained_reload_deepcopy_and_pickle(name, tmp_path):
    _need(name)
    plain = build(name)
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    x = inputs(name)
    with torch.no_grad():
        want = plain(**x)
        if tuned.get_output_embeddings() is not None and plain.get_output_embeddings() is not None:
            # a tied LM head stays tied to the (shared) input embedding
            tied = plain.get_output_embeddings().weight is plain.get_input_embeddings().weight
            assert (tuned.get_output_embeddings().weight is tuned.get_input_embeddings().weight) == tied
        tuned.save_pretrained(tmp_path)
        again = type(plain).from_pretrained(tmp_path).eval()
        _assert_same(want, again(**x))
        assert again.state_dict().keys() == plain.state_dict().keys()
        _assert_same(want, copy.deepcopy(tuned)(**x))
        try:
            pickle.dumps(plain)
        except RuntimeError:  # weight_norm's parametrization (wav2vec2's positional conv): plain refuses too
            with pytest.raises(RuntimeError):
                pickle.dumps(tuned)
        else:
            _assert_same(want, pickle.loads(pickle.dumps(tuned))(**x))


def test_in_place_update_of_a_tuned_linear_output_under_grad():
    """Regression (Longformer, DeBERTa): scaling a Linear's output in place while training."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 6)
    tuned = tunedb.optimize(torch.nn.Sequential(copy.deepcopy(lin)), families="all")[0]
    assert type(tuned).__name__ == "TunedLinear"
    x = torch.randn(2, 3, 8)
    grads = []
    for module in (lin, tuned):
        y = module(x)
        y /= 2.0
        y.permute(1, 0, 2).mul_(3.0)
        y.square().sum().backward()
        grads.append((y.detach(), module.weight.grad, module.bias.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_tuning_report_is_text_after_these_models():
    plain = build("bert-seqcls")
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    with torch.no_grad():
        tuned(**inputs("bert-seqcls"))
    report = tunedb.tuning_report()
    assert isinstance(report, str) and "gemm" in report


def _manifest(tmp_path, field, values):
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps({field: v}) + "\n" for v in values))
    return str(path)


@pytest.mark.parametrize("workload,unit,field,values", [
    ("audit_hf_others_s42:census_vit", "tokens", "tokens", [8, 8]),
    ("audit_hf_others_s42:census_whisper", "frames", "duration", [0.5, 0.5]),
])
def test_census_of_a_model_on_meta(workload, unit, field, values, tmp_path):
    """`tunedb census module:callable` (meta tensors, as optimize() calls the ops) records the
    model's GEMMs."""
    from tunedb import pipeline

    shapes = pipeline.take_census(workload, max_batch=1, unit=unit, max_length=64, fused=True,
                                  manifest=_manifest(tmp_path, field, values))
    assert shapes.points and all(p.m >= 1 for p in shapes.points)


def test_census_of_a_model_reading_its_mask_says_to_use_the_cpu(tmp_path):
    """transformers' attention mask code reads values (.item()): on meta tensors the census
    fails with one CensusError that says how to take it (the CPU), not a traceback."""
    from tunedb import pipeline
    from tunedb.errors import CensusError

    with pytest.raises(CensusError, match="--device cpu"):
        pipeline.take_census("audit_hf_others_s42:census_bert", max_batch=1, unit="tokens", max_length=16,
                             manifest=_manifest(tmp_path, "tokens", [8]))
