"""The run-time selector: tier order, dt=half, the memo, counters, the model slot, skipped configs."""
import warnings

import pytest

import fake_family
from fake_family import SPACE, entry_raw, sig, tier_dirs_fixture, valid_raw
from tunedb import database, settings
from tunedb.runtime import selector
from tunedb.errors import DatabaseWarning, SignatureError
from tunedb.records import Config

tier_dirs = tier_dirs_fixture()


@pytest.fixture
def fam(tier_dirs):
    family = fake_family.install()
    selector.configure("sm90")
    selector.reset_counters()
    yield family
    selector.set_ranker("fake", None)
    selector.configure()
    selector.reset_counters()


def files(tier_dirs, user=None, system=None):
    if user is not None:
        tier_dirs.write("user", valid_raw(entries=user))
    if system is not None:
        tier_dirs.write("system", valid_raw(entries=system))
    selector.reload()


S128 = "fake|op=mm|dt=half|N=128|K=64"


def test_user_tier_wins_then_system_then_default(fam, tier_dirs):
    files(tier_dirs, user={S128: entry_raw([[64, "b"]])},
          system={S128: entry_raw([[32, "a"], [None, "big"]])})
    r = selector.resolve("fake", sig(), 10)
    assert (r.config.id, r.tier, r.entry_signature) == ("b", "user", sig())
    # above the user entry's last region (no catch-all): the system tier answers
    r = selector.resolve("fake", sig(), 65)
    assert (r.config, r.tier) == (SPACE["big"], "system")
    # a signature no tier has: the default tier, which serves the pick rule's fallback
    r = selector.resolve("fake", sig(n=96), 65)
    assert (r.config.id, r.tier, r.entry_signature) == ("torch", "default", None)


def test_regions_round_up(fam, tier_dirs):
    files(tier_dirs, system={S128: entry_raw([[64, "a"], [512, "b"], [None, "torch"]])})
    got = {m: selector.resolve("fake", sig(), m).config.id for m in (1, 64, 65, 512, 513, 10**6)}
    assert got == {1: "a", 64: "a", 65: "b", 512: "b", 513: "torch", 10**6: "torch"}


def test_half_entry_serves_fp16_and_bf16_and_a_concrete_entry_wins(fam, tier_dirs):
    bf16 = "fake|op=mm|dt=bf16|N=128|K=64"
    files(tier_dirs, system={S128: entry_raw([[None, "b"]]), bf16: entry_raw([[8, "big"]])})
    r = selector.resolve("fake", sig(dt="fp16"), 100)
    assert (r.config.id, r.entry_signature) == ("b", sig())
    r = selector.resolve("fake", sig(dt="bf16"), 8)
    assert (r.config.id, r.entry_signature) == ("big", sig(dt="bf16"))
    # beyond the bf16 entry's regions the half entry still serves
    assert selector.resolve("fake", sig(dt="bf16"), 9).config.id == "b"
    # fp32 never takes a half entry
    assert selector.resolve("fake", sig(dt="fp32"), 8).tier == "default"


def test_own_op_in_any_tier_beats_a_fallback_op_in_the_user_tier(fam, tier_dirs, monkeypatch):
    # the family lets mm_act fall back to the plain mm entry of the same N, K (as gemm does)
    monkeypatch.setattr(fam, "serving_keys", lambda s: s.lookup_keys() + (
        sig(op="mm", dt=s.dt, n=s.get("N"), k=s.get("K")).lookup_keys() if s.op == "mm_act" else ()), raising=False)
    act_bf16 = sig(op="mm_act", dt="bf16")
    files(tier_dirs, user={S128: entry_raw([[None, "a"]])},
          system={"fake|op=mm_act|dt=half|N=128|K=64": entry_raw([[None, "b"]])})
    r = selector.resolve("fake", act_bf16, 8)
    assert (r.config.id, r.tier, r.entry_signature) == ("b", "system", sig(op="mm_act"))
    # within one op the user tier still wins, whatever the dtype naming (dt=half vs bf16)
    files(tier_dirs, user={"fake|op=mm_act|dt=half|N=128|K=64": entry_raw([[None, "a"]])},
          system={"fake|op=mm_act|dt=bf16|N=128|K=64": entry_raw([[None, "b"]])})
    r = selector.resolve("fake", act_bf16, 8)
    assert (r.config.id, r.tier) == ("a", "user")
    # no entry of the op anywhere: the fallback op answers, user tier first
    files(tier_dirs, user={S128: entry_raw([[None, "a"]])}, system={S128: entry_raw([[None, "b"]])})
    r = selector.resolve("fake", act_bf16, 8)
    assert (r.config.id, r.tier, r.entry_signature) == ("a", "user", sig())


def test_sentinels_resolve(fam, tier_dirs):
    act = "fake|op=mm_act|dt=half|N=128|K=64"
    files(tier_dirs, system={S128: entry_raw([[8, "default"], [None, "torch"]]),
                             act: entry_raw([[None, "fused"]])})
    assert selector.resolve("fake", sig(), 8).config == SPACE["a"]  # the family's default config
    assert selector.resolve("fake", sig(), 9).config == Config.sentinel("torch")
    assert selector.resolve("fake", sig(op="mm_act"), 9).config == Config.sentinel("fused")


@pytest.mark.parametrize("config_id, why", [
    ("zz", "not in this process's compiled set"),  # defined in the file, not compiled
    ("big", "invalid here: block 64 > N=32"),  # fails the validity predicate for N=32
    ("fused", "a sentinel that does not apply"),  # op mm has no fused arm
])
def test_unusable_config_is_warned_once_and_the_next_tier_answers(fam, tier_dirs, config_id, why):
    s32 = "fake|op=mm|dt=half|N=32|K=64"
    files(tier_dirs, user={s32: entry_raw([[None, config_id]])}, system={s32: entry_raw([[None, "b"]])})
    with pytest.warns(DatabaseWarning) as record:
        r1 = selector.resolve("fake", sig(n=32), 5)
        r2 = selector.resolve("fake", sig(n=32), 6)  # another M: a new memo slot, same skip
    assert (r1.config.id, r1.tier) == (r2.config.id, r2.tier) == ("b", "system")
    assert len(record) == 1
    assert why in str(record[0].message) and config_id in str(record[0].message)
    assert str(tier_dirs.path("user")) in str(record[0].message)


def test_memo_is_one_lookup_per_epoch_and_reload_starts_a_new_one(fam, tier_dirs, monkeypatch):
    files(tier_dirs, system={S128: entry_raw([[None, "b"]])})
    chooser = []
    real = selector._choose
    monkeypatch.setattr(selector, "_choose", lambda *a: chooser.append(a[1:]) or real(*a))
    for _ in range(10):
        assert selector.resolve("fake", sig(), 7).config.id == "b"
    assert len(chooser) == 1
    # a file written mid-epoch does not change the selection...
    tier_dirs.write("system", valid_raw(entries={S128: entry_raw([[None, "big"]])}))
    assert selector.resolve("fake", sig(), 7).config.id == "b"
    # ...until the next epoch
    before = selector.epoch()
    assert selector.reload() == before + 1 == selector.epoch()
    assert selector.resolve("fake", sig(), 7).config.id == "big"
    assert len(chooser) == 2


def test_database_reload_also_drops_the_selector_memo(fam, tier_dirs):
    files(tier_dirs, system={S128: entry_raw([[None, "b"]])})
    assert selector.resolve("fake", sig(), 7).config.id == "b"
    tier_dirs.write("system", valid_raw(entries={S128: entry_raw([[None, "big"]])}))
    database.reload()
    assert selector.resolve("fake", sig(), 7).config.id == "big"


def test_every_call_is_counted_per_tier_and_signature(fam, tier_dirs):
    files(tier_dirs, user={S128: entry_raw([[64, "b"]])}, system={S128: entry_raw([[None, "a"]])})
    for _ in range(3):
        selector.resolve("fake", sig(), 10)
    selector.resolve("fake", sig(), 100)
    selector.resolve("fake", sig(n=96), 1)
    selector.reload()  # counts survive epochs
    selector.resolve("fake", sig(), 10)
    c = selector.counters()["fake"]
    assert c["calls"] == 6
    assert c["tiers"] == {"user": 4, "system": 1, "model": 0, "default": 1}
    assert c["signatures"][S128] == {"user": 4, "system": 1, "model": 0, "default": 0}
    assert selector.report_lines() == [
        "fake: 6 calls over 2 signatures: 4 user, 1 system, 0 cost model, 1 default"]
    assert selector.tuning_report() == selector.report_lines()[0]
    selector.reset_counters()
    assert selector.counters() == {}
    assert "no tuned op" in selector.tuning_report()


def test_heuristic_off_makes_every_shape_take_the_default(fam, tier_dirs):
    files(tier_dirs, user={S128: entry_raw([[None, "b"]])})
    with settings.override(HEURISTIC="0"):
        selector.reload()
        r = selector.resolve("fake", sig(), 10)
    assert (r.config, r.tier) == (SPACE["a"], "default")


def test_model_tier_ranks_compiled_valid_candidates(fam, tier_dirs):
    seen = []

    def ranker(s, m, candidates):
        seen.append((s, m, tuple(c.id for c in candidates)))
        return max((c for c in candidates if not c.is_sentinel), key=lambda c: c.param("block"))

    files(tier_dirs, system={S128: entry_raw([[8, "b"]])})
    selector.set_ranker("fake", ranker)
    r = selector.resolve("fake", sig(n=48), 100)
    assert (r.config.id, r.tier, r.entry_signature) == ("b", "model", None)
    # big is invalid at N=48; zz is not compiled; the framework's op is always a candidate
    assert seen == [(sig(n=48), 100, ("a", "b", "torch"))]
    assert selector.resolve("fake", sig(), 8).tier == "system"  # entries still win
    assert selector.resolve("fake", sig(), 9).config.id == "big"  # uncovered M: the model
    with settings.override(MODEL_FALLBACK="0"):
        selector.reload()
        assert selector.resolve("fake", sig(), 9).tier == "default"


def test_model_tier_none_or_a_bad_choice_falls_to_the_default(fam, tier_dirs):
    files(tier_dirs)
    selector.set_ranker("fake", lambda s, m, c: None)
    assert selector.resolve("fake", sig(), 9).tier == "default"
    selector.set_ranker("fake", lambda s, m, c: SPACE["zz"])
    with pytest.warns(DatabaseWarning, match="not one of its candidates"):
        assert selector.resolve("fake", sig(), 9).tier == "default"

    def broken(s, m, c):
        raise RuntimeError("model file missing")

    selector.set_ranker("fake", broken)
    with pytest.warns(DatabaseWarning, match="model file missing"):
        assert selector.resolve("fake", sig(), 9).tier == "default"
    with pytest.raises(TypeError, match="callable"):
        selector.set_ranker("fake", 3)


def test_compile_set_gets_the_referenced_ids_once_per_epoch(fam, tier_dirs):
    files(tier_dirs, user={S128: entry_raw([[None, "b"]])},
          system={S128: entry_raw([[4, "big"], [None, "torch"]])})
    selector.resolve("fake", sig(), 1)
    selector.resolve("fake", sig(), 2)
    assert fam.compile_calls == [("sm90", ("b", "big"))]


def test_bad_calls_are_clear_errors(fam, tier_dirs):
    files(tier_dirs)
    with pytest.raises(SignatureError, match="belongs to kernel family 'fake'"):
        selector.resolve("gemm", sig(), 1)
    with pytest.raises(SignatureError, match="needs a Signature"):
        selector.resolve("fake", S128, 1)
    with pytest.raises(ValueError, match="M=-1"):
        selector.resolve("fake", sig(), -1)


def test_arch_without_a_profile_serves_the_default_with_a_warning(fam, tier_dirs):
    tier_dirs.write("system", valid_raw(arch_family="sm80", entries={S128: entry_raw([[None, "b"]])}),
                    arch="sm80")
    selector.configure("sm80")
    with pytest.warns(DatabaseWarning, match="no arch profile for sm80"):
        assert selector.resolve("fake", sig(), 1).tier == "default"


def test_configure_pins_another_arch_family(fam, tier_dirs):
    from tunedb.arch import shipped_profile

    files(tier_dirs, system={S128: entry_raw([[None, "b"]])})
    profile = shipped_profile("sm90")
    selector.configure(arch=profile)
    assert selector.resolve("fake", sig(), 1).tier == "system"
    with pytest.raises(Exception, match="sm80"):
        selector.configure("sm80", arch=profile)


def test_import_touches_neither_torch_nor_disk():
    import subprocess
    import sys

    code = ("import sys, tunedb, tunedb.runtime.selector, tunedb.database; "
            "print(sorted(m for m in ('torch', 'triton', 'filelock') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_ranker_can_read_the_files_model_and_the_arch(fam, tier_dirs):
    raw = valid_raw(entries={})
    raw["model"] = {"prefer": "b"}
    tier_dirs.write("system", raw)
    user = valid_raw(entries={})
    del user["model"]
    tier_dirs.write("user", user)
    selector.reload()
    assert selector.current_arch()[0] == "sm90" and selector.current_arch()[1].arch_family == "sm90"

    def ranker(s, m, candidates):
        want = selector.model_params("fake")["prefer"]
        return next(c for c in candidates if c.id == want)

    selector.set_ranker("fake", ranker)
    assert selector.resolve("fake", sig(), 3).config.id == "b"
    assert selector.model_params("nothing_here") is None


def test_detection_uses_the_gpus_arch_family_and_its_cached_or_queried_profile(fam, tier_dirs, monkeypatch):
    import dataclasses

    import torch

    from tunedb import arch

    profile = dataclasses.replace(arch.shipped_profile("sm90"), sku="NVIDIA H200", source="queried")
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw: asked.append(measure) or profile)
    selector.configure()
    assert selector.current_arch() == ("sm90", profile)
    assert asked == [False]  # never measures at resolve time
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))

    def no_profile(measure=True, **kw):
        raise RuntimeError("no cached or shipped profile")

    monkeypatch.setattr(arch, "current_profile", no_profile)
    selector.configure()
    assert selector.current_arch() == ("sm80", None)


def test_family_supplies_the_model_ranker_from_the_files_model(fam, tier_dirs, monkeypatch):
    built = []

    class Model:
        def pick(self, s, m, candidates):
            return [c for c in candidates if not c.is_sentinel][-1]

    def cost_model(profile, params):
        built.append((profile.arch_family, dict(params or {})))
        return Model()

    monkeypatch.setattr(fam, "cost_model", cost_model, raising=False)
    tier_dirs.write("system", valid_raw(entries={S128: entry_raw([[8, "b"]])}, model={"scale": 2.0}))
    selector.reload()
    r = selector.resolve("fake", sig(), 9)
    assert (r.config.id, r.tier) == ("big", "model")  # the last compiled, valid candidate
    selector.resolve("fake", sig(), 10)
    assert built == [("sm90", {"scale": 2.0})]  # built once per epoch, from the file's model
    selector.reload()
    selector.resolve("fake", sig(), 11)
    assert len(built) == 2
    selector.set_ranker("fake", lambda s, m, c: c[0])  # an installed ranker wins over the family's
    assert selector.resolve("fake", sig(), 9).config.id == "a"
    selector.set_ranker("fake", lambda s, m, c: c[-1])  # and may answer the framework's op
    assert (selector.resolve("fake", sig(), 9).config.id, selector.resolve("fake", sig(), 9).tier) == ("torch", "model")


def test_a_family_can_let_another_signatures_entry_serve(fam, tier_dirs, monkeypatch):
    fused = sig(op="mm_act")
    monkeypatch.setattr(fam, "serving_keys", lambda s: s.lookup_keys() + (sig(),), raising=False)
    files(tier_dirs, system={S128: entry_raw([[64, "b"]])})
    r = selector.resolve("fake", fused, 10)
    assert (r.config.id, r.tier, r.entry_signature) == ("b", "system", sig())


def test_without_an_entry_or_a_model_the_familys_heuristic_answers(fam, tier_dirs, monkeypatch):
    files(tier_dirs)
    selector.set_ranker("fake", lambda s, m, c: None)  # no model pick
    monkeypatch.setattr(fam, "heuristic", lambda s, m, arch: SPACE["b"], raising=False)
    r = selector.resolve("fake", sig(n=64), 9)
    assert (r.config.id, r.tier) == ("b", "default")
    monkeypatch.setattr(fam, "heuristic", lambda s, m, arch: SPACE["big"], raising=False)
    selector.reload()
    r = selector.resolve("fake", sig(n=32), 9)  # big needs N >= 64: invalid, the fallback answers
    assert (r.config.id, r.tier) == ("torch", "default")
