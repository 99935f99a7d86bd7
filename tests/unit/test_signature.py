"""Signature parse/format: the static key of an op, and the dt=half lookup rule."""
import pytest

from tunedb.errors import SignatureError
from tunedb.records import Signature


@pytest.mark.parametrize("text", [
    "gemm|op=gemm|dt=half|N=512|K=256",
    "gemm|op=gemm_act|dt=bf16|N=80|K=17|act=gelu",
    "scaled_mm|op=scaled_mm|dt=int8|N=768|K=256",
    "gemm|op=gemm|dt=fp32",
])
def test_format_of_parse_is_identity(text):
    assert Signature.parse(text).format() == text
    assert str(Signature.parse(text)) == text


def test_parse_reads_ints_and_strings():
    sig = Signature.parse("gemm|op=gemm_act|dt=fp16|N=512|K=256|act=gelu")
    assert (sig.family, sig.op, sig.dt) == ("gemm", "gemm_act", "fp16")
    assert sig.get("N") == 512 and sig.get("K") == 256 and sig.get("act") == "gelu"
    assert sig.get("missing", 7) == 7
    assert sig == Signature.make("gemm", "gemm_act", "fp16", N=512, K=256, act="gelu")


@pytest.mark.parametrize("text, names", [
    ("gemm|op=gemm|dt=half|N512|K=256", "N512"),  # no '='
    ("gemm|op=gemm|dt=half|N=|K=256", "N="),  # empty value
    ("gemm|dt=half|op=gemm|N=1", "FAMILY|op=OP|dt=DT"),  # order
    ("gemm|op=gemm|dt=fp128|N=1", "fp128"),  # unknown dtype
    ("Gemm|op=gemm|dt=half|N=1", "Gemm"),  # bad family
    ("gemm|op=gemm|dt=half|N=1|N=2", "'N'"),  # repeated parameter
    ("gemm|op=gemm|dt=half|N=007", "not canonical"),
    ("gemm|op=gemm|dt=half|N=a b", "a b"),
    ("", "non-empty"),
    ("gemm", "FAMILY|op=OP|dt=DT"),
])
def test_malformed_signature_names_the_bad_part(text, names):
    with pytest.raises(SignatureError) as err:
        Signature.parse(text)
    assert names in str(err.value)


def test_half_serves_fp16_and_bf16_but_concrete_dtype_wins():
    bf16 = Signature.parse("gemm|op=gemm|dt=bf16|N=512|K=256")
    assert [s.format() for s in bf16.lookup_keys()] == [
        "gemm|op=gemm|dt=bf16|N=512|K=256", "gemm|op=gemm|dt=half|N=512|K=256"]
    fp16 = bf16.with_dt("fp16")
    assert fp16.lookup_keys()[1].dt == "half"
    fp32 = bf16.with_dt("fp32")
    assert fp32.lookup_keys() == (fp32,)  # fp32 never falls back to half
    assert bf16.with_dt("half").lookup_keys() == (bf16.with_dt("half"),)


def test_signature_is_hashable_and_ordered():
    a = Signature.make("gemm", "gemm", "half", N=1, K=2)
    b = Signature.make("gemm", "gemm", "half", N=1, K=2)
    assert {a: 1}[b] == 1
    assert sorted([b.with_dt("fp16"), a])[0] in (a, b.with_dt("fp16"))


def test_a_non_ascii_digit_is_a_signature_error():
    with pytest.raises(SignatureError):
        Signature.parse("gemm|op=gemm|dt=half|N=\u00b2|K=256")


def test_equal_signatures_hash_equal_across_processes_pickling():
    import pickle

    a = Signature.parse("gemm|op=gemm_act|dt=bf16|N=512|K=256|act=gelu|bias=1")
    b = Signature.make("gemm", "gemm_act", "bf16", N=512, K=256, act="gelu", bias=1)
    c = pickle.loads(pickle.dumps(a))
    assert a == b == c and hash(a) == hash(b) == hash(c) and {a: 1}[c] == 1
    assert a.with_dt("half").format() == "gemm|op=gemm_act|dt=half|N=512|K=256|act=gelu|bias=1"
