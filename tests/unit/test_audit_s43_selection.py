"""Session 43 audit: what the selector serves on shapes no table measured, on the shipped sm90
profile and tables (CPU only). Whatever resolves is a sentinel of the signature or a config THE
validity predicate accepts at that exact (signature, size, arch); a key no family can serve is
refused with an error naming the bad value; the cost model prices no config the predicate refuses.
"""
from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest

import tunedb
from tunedb import arch, families, settings
from tunedb.errors import SignatureError
from tunedb.families.gemm import costmodel
from tunedb.records import Signature, Status
from tunedb.runtime import selector

PROFILE = arch.shipped_profile("sm90")
DB = Path(tunedb.__file__).parent / "db" / "sm90"
SIZES = (0, 1, 2, 3, 7, 16, 17, 97, 1000, 4097, 65537, 2**31 - 1, 2**40)


@pytest.fixture
def shipped():
    with settings.override(USER_DB="off"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        selector.configure("sm90")
        yield
    selector.configure()


def assert_servable(name: str, sig: Signature, m: int) -> None:
    fam = families.get(name)
    r = selector.peek(name, sig, m)
    if r.config.is_sentinel:
        assert r.config.id in fam.sentinels(sig, settings.approximate_allowed()), (sig, m, r)
    else:
        why = fam.invalid_reason(r.config, sig, m, PROFILE)
        assert why is None, f"{sig} M={m}: the {r.tier} tier served {r.config.id}, which is invalid: {why}"


def test_a_huge_batch_gets_no_linalg_config_that_cannot_launch_there(shipped):
    # before: the model tier (candidates judged for every size), then the default tier (its
    # heuristic judged the same way) served block_w4, whose grid CUDA cannot launch at this batch
    sig = Signature.parse("linalg|op=dot|dt=fp32|n=128")
    for tier_switch in ({}, {"MODEL_FALLBACK": "0"}):
        with settings.override(**tier_switch):
            selector.reload()
            assert_servable("linalg", sig, 2**40)
            assert selector.peek("linalg", sig, 2**40).config.id == "torch"


@pytest.mark.parametrize("text, names", [
    ("gemm|op=gemm|dt=fp32|N=512|K=512", ["fp32", "fp16"]),  # before: b64x64x64 served an fp32 key
    ("gemm|op=gemm_act|dt=half|N=512|K=512|act=relu", ["bias"]),  # before: a tile for a key with no bias
    ("gemm|op=gemm|dt=half|N=0|K=512", ["N=0"]),
    ("gemm|op=foo|dt=half|N=512|K=512", ["foo", "gemm_act"]),
    ("gemm|op=gemm|dt=half|N=512|K=512|zz=1", ["zz"]),
    ("gemm|op=gemm|dt=half|N=x|K=512", ["N", "int"]),  # before: a bare TypeError in the predicate
    ("linalg|op=dot|dt=fp32", ["'n'"]),  # before: a bare TypeError in linalg's heuristic
    ("scaled_mm|op=scaled_mm|dt=half|N=16|K=16|out=bf16", ["half", "int8"]),
])
def test_a_key_the_family_cannot_serve_is_refused_naming_the_bad_value(shipped, text, names):
    sig = Signature.parse(text)
    with pytest.raises(SignatureError) as err:
        selector.peek(sig.family, sig, 64)
    for name in names:
        assert name in str(err.value)


def test_a_model_call_with_such_a_key_runs_the_framework_op_instead_of_failing(shipped):
    """The run time's resolution (launch_table.resolve: a model's forward) serves torch where the
    selector refuses a key, as first_call's fallback would; asking the selector raises."""
    from tunedb.runtime import launch_table

    sig = Signature.parse("gemm|op=gemm|dt=fp32|N=512|K=512")
    config, tier, _counter = launch_table.resolve(families.get("gemm"), sig, 64)
    assert (config.id, tier) == ("torch", "default")


def _random_keys(name: str, rng: random.Random, count: int) -> list[Signature]:
    fam = families.get(name)
    path = DB / f"{name}.json"
    shipped_keys = [Signature.parse(k) for k in json.loads(path.read_text())["entries"]] if path.exists() else []
    keys = rng.sample(shipped_keys, min(len(shipped_keys), count // 2))
    odd, choices = (1, 3, 17, 64, 255, 4096, 65535), dict(fam.schema.choices)
    while len(keys) < count:
        base = dict(rng.choice(shipped_keys).params) if shipped_keys else {}
        fields = {f: (rng.choice(choices[f]) if f in choices else
                      base[f] if f in base and rng.random() < 0.5 else rng.choice(odd))
                  for f, typ in fam.schema.key if typ is int or f in choices or f in base}
        op = rng.choice(fam.ops)
        if name == "gemm" and op == "gemm":
            fields.pop("act", None), fields.pop("bias", None)
        try:
            sig = fam.schema.make(fam.name, op, rng.choice(fam.schema.dtypes or ("half",)), **fields)
            selector.check_signature(fam, sig)
        except SignatureError:
            continue
        keys.append(sig)
    return keys


@pytest.mark.parametrize("name", ["gemm", "linalg", "bmm", "scaled_mm", "group_gemm", "gemm_log_softmax"])
def test_every_tier_serves_only_sentinels_or_configs_valid_at_the_exact_size(shipped, name):
    rng = random.Random(43)
    keys = _random_keys(name, rng, 24)
    for switches in ({}, {"MODEL_FALLBACK": "0"}):
        with settings.override(**switches):
            selector.reload()
            for sig in keys:
                for m in SIZES + (rng.randint(1, 5000),):
                    try:
                        assert_servable(name, sig, m)
                    except SignatureError as exc:  # a family refusing an op/dtype pair: named, not a crash
                        assert sig.dt in str(exc) or sig.op in str(exc), exc


@pytest.mark.parametrize("sig, m, cid", [
    (Signature.parse("gemm|op=gemm|dt=bf16|N=11008|K=65535"), 1, "tma_b64x128x64_w4_s2_g8"),  # K*2 not 16-aligned
    (Signature.parse("gemm|op=gemm|dt=fp16|N=1000|K=1000"), 4096, "dk1_n32x512_w4_s4"),  # decode lane: M <= 16
])
def test_the_cost_model_prices_no_config_the_predicate_refuses(shipped, sig, m, cid):
    fam = families.get("gemm")
    config = fam.parse_config(cid)
    assert fam.invalid_reason(config, sig, m, PROFILE) is not None
    # before: 1.14 ms and 136 s, predicted for kernels that cannot run this shape
    assert costmodel.predict(config, (sig, m), PROFILE) is Status.INFEASIBLE
    assert selector.family_model(fam, PROFILE).predict(sig, m, cid) is None


def test_the_cost_model_agrees_with_the_predicate_on_odd_shapes(shipped):
    fam, rng = families.get("gemm"), random.Random(7)
    space = fam.config_space("sm90")
    for _ in range(40):
        sig = fam.make_signature("gemm", rng.choice(("half", "bf16")), rng.choice((1, 3, 17, 4096, 65535)),
                                 rng.choice((1, 3, 17, 4096, 65535)))
        m = rng.choice((1, 3, 16, 17, 1000, 2**31 - 1))
        for config in rng.sample(space, 25):
            ms = costmodel.predict(config, (sig, m), PROFILE)
            valid = fam.invalid_reason(config, sig, m, PROFILE) is None
            if not valid:
                assert ms is Status.INFEASIBLE, (sig, m, config.id, ms)
            if not isinstance(ms, Status):
                assert ms > 0 and ms == ms and ms != float("inf"), (sig, m, config.id, ms)
