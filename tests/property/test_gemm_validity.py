"""Candidate generation, the validity predicate and the compile set agree (hypothesis)."""
import dataclasses

from hypothesis import given, settings as hsettings, strategies as st

from tunedb.arch import shipped_profile
from tunedb.families.gemm import FAMILY, configs

SM90 = shipped_profile("sm90")
ARCHES = {
    "sm90": SM90,
    "sm80": dataclasses.replace(SM90, arch_family="sm80", smem_per_block=configs.smem_per_block("sm80")),
    "sm86": dataclasses.replace(SM90, arch_family="sm86", smem_per_block=configs.smem_per_block("sm86")),
}

dims = st.one_of(st.integers(1, 200), st.sampled_from([256, 520, 1280, 4096, 5120, 14336, 28672]))
signatures = st.builds(
    lambda op, dt, n, k, act, bias: FAMILY.make_signature(op, dt, n, k, act if op == "gemm_act" else "none",
                                                          bias and op == "gemm_act"),
    st.sampled_from(configs.OPS), st.sampled_from(["fp16", "bf16", "half"]), dims, dims,
    st.sampled_from(configs.ACTS), st.booleans())
ms = st.one_of(st.none(), st.integers(1, 70000))


@hsettings(max_examples=150, deadline=None)
@given(signatures, ms, st.sampled_from(sorted(ARCHES)))
def test_candidates_pass_and_grid_acceptances_are_candidates(sig, m, arch_name):
    arch = ARCHES[arch_name]
    cands = FAMILY.candidates(sig, m, arch)
    space = set(FAMILY.config_space(arch.arch_family))
    for cfg in cands:
        assert cfg in space
        assert FAMILY.invalid_reason(cfg, sig, m, arch) is None
    accepted = {c for c in FAMILY.full_grid() if FAMILY.invalid_reason(c, sig, m, arch) is None}
    assert accepted == set(cands)
    # The default always runs, at every M.
    assert FAMILY.invalid_reason(FAMILY.default_config(sig, arch), sig, None, arch) is None


@hsettings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(ARCHES)),
       st.lists(st.sampled_from([c.id for c in configs.full_grid()] + ["torch", "junk"]), max_size=12),
       st.sampled_from(["tuned", "all"]))
def test_compile_set_holds_only_configs_valid_for_some_shape(arch_name, referenced, mode):
    arch = ARCHES[arch_name]
    probe = FAMILY.make_signature("gemm", "bf16", 4096, 4096)  # aligned, deep: every lane's home
    chosen = configs.compile_set(arch.arch_family, referenced, mode)
    assert chosen, "the compile set is never empty"
    for cfg in chosen:  # the decode lane serves M <= 16 only
        assert FAMILY.invalid_reason(cfg, probe, 1 if cfg.lane == "triton_decode" else None, arch) is None
    ids = {c.id for c in chosen}
    for rid in referenced:
        if rid in {c.id for c in FAMILY.config_space(arch.arch_family)}:
            assert rid in ids


@hsettings(max_examples=100, deadline=None)
@given(signatures, st.integers(1, 5000))
def test_predicate_with_m_none_implies_every_m(sig, m):
    for cfg in FAMILY.config_space("sm90"):
        if FAMILY.invalid_reason(cfg, sig, None, SM90) is None:
            assert FAMILY.invalid_reason(cfg, sig, m, SM90) is None


@hsettings(max_examples=60, deadline=None)
@given(signatures, st.integers(1, 70000), st.sampled_from(sorted(ARCHES)))
def test_the_cost_model_ranks_and_picks_only_what_the_predicate_accepts(sig, m, arch_name):
    """The cost model gets the family's predicate: its ranking (the build's pruning) and its
    ranker (the selector's model tier) never return a config the predicate rejects."""
    from tunedb.families.gemm import costmodel
    arch = ARCHES[arch_name]
    space = FAMILY.config_space(arch.arch_family)
    ranked = costmodel.rank(space, m, sig.get("N"), sig.get("K"), arch, 16, FAMILY.invalid_reason,
                            dt=sig.dt, default_config=FAMILY.default_config)
    for cfg, _ in ranked:
        assert FAMILY.invalid_reason(cfg, sig.with_dt(sig.dt), m, arch) is None
    pick = FAMILY.cost_model(arch).pick(sig, m, tuple(space))
    assert pick is None or pick.is_sentinel or FAMILY.invalid_reason(pick, sig, m, arch) is None


@hsettings(max_examples=40, deadline=None)
@given(signatures, st.integers(1, 70000))
def test_the_selector_serves_only_configs_the_predicate_accepts(sig, m):
    """Whatever tier answers (the shipped sm90 tier, the cost model, the default), the config
    passes the predicate at the call's M: the selector judges a config at the size it serves
    (runtime/selector._usable), so a lane valid only at some sizes (triton_decode's `gv`, M <= 16:
    the shipped tier serves it at M = 1 for 4096 x 4096) serves there and nowhere else."""
    from tunedb import settings
    from tunedb.runtime import selector
    with settings.override(USER_DB="off"):
        selector.configure("sm90")
        try:
            res = selector.peek("gemm", sig, m)
        finally:
            selector.configure()
    if not res.config.is_sentinel:
        assert FAMILY.invalid_reason(res.config, sig, m, SM90) is None
    else:
        assert res.config.id in FAMILY.sentinels(sig)


def test_the_selector_serves_the_decode_lane_only_where_it_is_valid():
    """The example hypothesis found (CI, session 23): the shipped sm90 tier serves a `gv` decode
    config at M = 1 for fp16 4096 x 4096, valid at M = 1 and not at every M; past M = 16 the
    selector never serves it."""
    from tunedb import settings
    from tunedb.runtime import selector
    sig = FAMILY.make_signature("gemm", "fp16", 4096, 4096)
    with settings.override(USER_DB="off"):
        selector.configure("sm90")
        try:
            got = {m: selector.peek("gemm", sig, m).config for m in (1, 16, 17, 4096)}
        finally:
            selector.configure()
    for m, cfg in got.items():
        assert cfg.is_sentinel or FAMILY.invalid_reason(cfg, sig, m, SM90) is None, (m, cfg.id)
    assert all(not cfg.id.startswith("gv") for m, cfg in got.items() if m > 16)
