"""The family contract: schema checks, the one pick rule, verify rules, hooks and their defaults."""
import pytest

from fake_family import FakeFamily
from tunedb import families
from tunedb.errors import RegistryError, SignatureError
from tunedb.families import contract
from tunedb.families.contract import InputPolicy, PickRule, SignatureSchema, VerifyRule
from tunedb.records import Signature

SCHEMA = SignatureSchema(key=(("n", int), ("uplo", str)), size="batch", ladder="pow2",
                         optional=("uplo",), choices=(("uplo", ("L", "U")),), dtypes=("fp32", "fp64"))


def test_schema_accepts_a_fitting_signature_and_builds_in_key_order():
    sig = SCHEMA.make("toy", "potrf", "fp64", uplo="L", n=8)
    assert sig.format() == "toy|op=potrf|dt=fp64|n=8|uplo=L"
    assert SCHEMA.check(Signature.make("toy", "potrf", "fp32", n=4)).get("n") == 4


@pytest.mark.parametrize("sig, message", [
    (Signature.make("toy", "potrf", "fp16", n=4), "dt='fp16' is not served; allowed: fp32, fp64"),
    (Signature.make("toy", "potrf", "fp32", n=4, N=3), "unknown field 'N'; the key fields are n, uplo"),
    (Signature.make("toy", "potrf", "fp32", uplo="L"), "missing field 'n' (int)"),
    (Signature.make("toy", "potrf", "fp32", n="x"), "field n='x' must be int"),
    (Signature.make("toy", "potrf", "fp32", n=4, uplo="X"), "field uplo='X'; allowed: L, U"),
    (Signature.make("toy", "potrf", "fp32", uplo="L", n=4), "fields must come in the order n, uplo"),
])
def test_schema_check_names_the_bad_field_and_what_is_allowed(sig, message):
    with pytest.raises(SignatureError) as err:
        SCHEMA.check(sig)
    assert message in str(err.value)


def test_schema_rejects_a_malformed_definition():
    with pytest.raises(ValueError, match="ladder 'log'"):
        SignatureSchema(key=(("n", int),), ladder="log")
    with pytest.raises(ValueError, match="type"):
        SignatureSchema(key=(("n", float),))
    with pytest.raises(ValueError, match="not in its key"):
        SignatureSchema(key=(("n", int),), optional=("m",))


def test_gemm_pick_rule_gates_against_the_fallback_and_breaks_ties_simply():
    rule = PickRule()  # the GEMM default: torch, 1.05x gate, 3% tie band
    assert rule.pick({"torch": 1.0, "b64": 0.97}).winner == "torch"  # 1.03x < 1.05x
    assert rule.pick({"torch": 1.0, "b64": 0.90}).winner == "b64"
    # within 3% of the fastest the simpler arm wins: sentinels before configs, then by id
    assert rule.pick({"torch": 2.0, "b64": 0.90, "default": 0.91}).winner == "default"
    assert rule.pick({"b64": 0.90, "a32": 0.92}).winner == "a32"
    # no fallback measured: no gate
    assert rule.pick({"b64": 0.90}).winner == "b64"


def test_spec003_pick_rule_dependency_margin_and_native_winner():
    order = {"thread": 0, "warp": 1, "block": 2, "nv_block": 3}
    rule = PickRule(fallback="block", min_speedup=1.0, tie_band=0.02, dep_margin=0.05,
                    simplicity=order.__getitem__,
                    dependency=lambda c: "mathdx" if c.startswith("nv_") else None)
    # a dependency arm 4% faster than the best native does not win; 6% faster does
    res = rule.pick({"block": 1.0, "warp": 1.0, "nv_block": 1.0 / 1.04})
    assert (res.winner, res.native) == ("warp", "warp")
    res = rule.pick({"block": 1.0, "warp": 1.0, "nv_block": 1.0 / 1.06})
    assert (res.winner, res.native) == ("nv_block", "warp")
    # among natives within 2%, the simpler wins: thread before warp before block
    assert rule.pick({"thread": 1.015, "warp": 1.0, "block": 0.999}).winner == "thread"
    assert rule.pick({"thread": 1.03, "warp": 1.0, "block": 1.01}).winner == "warp"


def test_pick_rule_rejects_bad_margins():
    with pytest.raises(ValueError, match="min_speedup"):
        PickRule(min_speedup=0.9)
    with pytest.raises(ValueError, match="tie_band"):
        PickRule(tie_band=1.5)
    with pytest.raises(ValueError, match="dep_margin"):
        PickRule(dep_margin=-0.1)


def test_verify_rule_kinds():
    assert VerifyRule().kind == "tolerance" and VerifyRule().factor == 4.0
    assert VerifyRule("exact").kind == "exact"
    with pytest.raises(ValueError, match="allowed: tolerance, exact, residual"):
        VerifyRule("close")


def test_hooks_fall_back_to_defaults_and_prefer_the_familys_own():
    fam = FakeFamily()
    sig = Signature.make("fake", "mm", "half", N=64, K=32)
    assert contract.hook(fam, "pick_rule")() == PickRule()
    assert contract.hook(fam, "input_policy")(sig) is InputPolicy.ROTATE
    assert contract.hook(fam, "cost_model")(None, None) is None
    assert contract.hook(fam, "serving_keys")(sig) == sig.lookup_keys()
    assert contract.hook(fam, "census_rules")() == ()
    assert contract.hook(fam, "call_key")("mm", 8, 64, 32) == (sig, 8)
    assert not contract.has_hook(fam, "pick_rule")
    fam.pick_rule = lambda: PickRule(fallback="default")
    assert contract.hook(fam, "pick_rule")().fallback == "default"
    assert contract.has_hook(fam, "pick_rule")
    with pytest.raises(RegistryError, match="unknown family hook 'pick'"):
        contract.hook(fam, "pick")


def test_verify_rule_of_a_family_may_depend_on_the_signature():
    fam = FakeFamily()
    sig = Signature.make("fake", "mm", "half", N=64, K=32)
    assert contract.verify_rule(fam, sig) == VerifyRule()
    fam.verify = lambda s: VerifyRule("exact") if s.op == "mm" else VerifyRule()
    assert contract.verify_rule(fam, sig).kind == "exact"


def test_register_names_the_missing_members():
    class Half:
        name = "half_family"
        ops = ("x",)

    with pytest.raises(TypeError, match="lacks lanes, schema, verify"):
        families.register(Half())


def test_gemm_family_declares_its_schema_and_verify_rule():
    gemm = families.get("gemm")
    assert not contract.missing_members(gemm)
    assert gemm.schema.size == "M" and gemm.schema.ladder == "m"
    gemm.schema.check(Signature.parse("gemm|op=gemm_act|dt=bf16|N=512|K=256|act=gelu|bias=1"))
    with pytest.raises(SignatureError, match="act='tanh'"):
        gemm.schema.check(Signature.parse("gemm|op=gemm_act|dt=bf16|N=512|K=256|act=tanh|bias=1"))
