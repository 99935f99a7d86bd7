"""Each preset, censused on meta tensors, against shapes computed by hand from its published config."""
import importlib.util
from collections import Counter

import pytest
import torch

from tunedb.census.modes import Key
from tunedb.census.presets import workload
from tunedb.census.probe import probe
from tunedb.errors import CensusError
from tunedb.records import Signature

META = torch.device("meta")


def gemms(calls):
    """{(N, K, M): calls} of the op=gemm records."""
    out = Counter()
    for (sig, m), n in calls.items():
        if sig.op == "gemm":
            assert sig.dt == "half"
            out[(sig.get("N"), sig.get("K"), m)] += n
    return out


def built(name, impl="mirror"):
    return workload(name).build(META, impl)


@pytest.mark.parametrize("batch", [1, 3])
def test_whisper_base(batch):
    # d_model 512, 6 layers, ffn 2048: q/k/v/out are 512x512 (N x K), fc1 2048x512, fc2 512x2048,
    # over 1500 positions (3000 frames after the stride-2 conv).
    m = 1500 * batch
    assert gemms(probe(built("whisper-base"), Key(batch, 3000, True))) == {
        (512, 512, m): 4 * 6, (2048, 512, m): 6, (512, 2048, m): 6}


def test_whisper_large_v3():
    m = 1500 * 2
    assert gemms(probe(built("whisper-large-v3"), Key(2, 3000, True))) == {
        (1280, 1280, m): 4 * 32, (5120, 1280, m): 32, (1280, 5120, m): 32}


def test_whisper_window_is_exact():
    with pytest.raises(CensusError, match="exactly 3000"):
        probe(built("whisper-base"), Key(1, 3008, True))


@pytest.mark.parametrize("frames", [200, 1001])
def test_conformer(frames):
    # Front end: two stride-2 3x3 convs over 80 mel bins -> 19 bins x 512 channels = K 9728.
    # 16 layers: packed in-projection 1536x512, out_proj 512x512, two half-step FFNs 2048x512 and
    # 512x2048. Pointwise Conv1d are convolutions, not GEMM-family calls.
    t = ((frames - 1) // 2 - 1) // 2
    m = 2 * t
    assert gemms(probe(built("conformer"), Key(2, frames, True))) == {
        (512, 9728, m): 1, (1536, 512, m): 16, (512, 512, m): 16, (2048, 512, m): 32, (512, 2048, m): 32}


def llama_expected(m_body, m_head):
    # transformers' LlamaForCausalLM: separate q (4096x4096), k and v (1024x4096: 8 KV heads of
    # 128), o (4096x4096), gate/up (14336x4096), down (4096x14336); LM head 128256x4096.
    return {(4096, 4096, m_body): 2 * 32, (1024, 4096, m_body): 2 * 32, (14336, 4096, m_body): 2 * 32,
            (4096, 14336, m_body): 32, (128256, 4096, m_head): 1}


def test_llama_3_8b_prefill_and_decode():
    b = built("llama-3-8b")
    # Prefill of 2 x 7 tokens: the LM head runs on the last position of each sequence (as generate()).
    assert gemms(probe(b, Key(2, 7, False))) == llama_expected(14, 2)
    assert gemms(probe(b, Key(4, 0, True))) == llama_expected(4, 4)


def test_llama_3_2_3b_prefill_and_decode_with_its_tied_head():
    # hidden 3072, 28 layers, 24 heads / 8 KV heads of 128: q and o 3072x3072, k and v 1024x3072,
    # gate/up 8192x3072, down 3072x8192; the LM head (128256x3072) is the embedding's weight
    b = built("llama-3.2-3b")
    head = b.model.lm_head if hasattr(b.model, "lm_head") else b.model.model.lm_head
    assert head.weight is b.model.embed_tokens.weight
    for key, m_body, m_head in ((Key(2, 7, False), 14, 2), (Key(4, 0, True), 4, 4)):
        assert gemms(probe(b, key)) == {(3072, 3072, m_body): 2 * 28, (1024, 3072, m_body): 2 * 28,
                                        (8192, 3072, m_body): 2 * 28, (3072, 8192, m_body): 28,
                                        (128256, 3072, m_head): 1}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
@pytest.mark.parametrize("name,key", [("whisper-base", Key(2, 3000, True)), ("llama-3-8b", Key(2, 5, False)),
                                      ("llama-3-8b", Key(3, 0, True)), ("llama-3.2-3b", Key(2, 0, True))])
def test_transformers_and_mirror_record_the_same_gemms(name, key):
    hf = built(name, "hf")
    assert hf.impl == "hf"
    assert gemms(probe(hf, key)) == gemms(probe(built(name, "mirror"), key))


@pytest.mark.skipif(importlib.util.find_spec("torchaudio") is None, reason="torchaudio not installed")
def test_torchaudio_and_mirror_conformer_record_the_same_gemms():
    ta = built("conformer", "torchaudio")
    assert ta.impl == "torchaudio"
    key = Key(2, 400, True)
    assert gemms(probe(ta, key)) == gemms(probe(built("conformer", "mirror"), key))


def test_unknown_workloads_and_impls():
    with pytest.raises(CensusError, match="presets are"):
        workload("whisper-tiny")
    with pytest.raises(CensusError, match=r"tunedb build --census my_census\.json"):
        workload("my_census.json")  # a census file: the error names the command that measures one
    with pytest.raises(CensusError, match="impl='nope'"):
        workload("whisper-base").build(META, "nope")
    if importlib.util.find_spec("torchaudio") is None:
        with pytest.raises(CensusError, match="needs the torchaudio package"):
            workload("conformer").build(META, "torchaudio")
        assert workload("conformer").build(META, "auto").impl == "mirror"
    with pytest.raises(CensusError, match="cannot load workload"):
        workload("no_such_module_xyz:make")
