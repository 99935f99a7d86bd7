"""A decode-lane config's PDL twin serves only a captured call that directly follows one of our
launches (the capture's only dependency is the node our last call added) and whose weight is an
nn.Parameter (never a GEMM's or a parametrization's output); every other call launches the config
without PDL: launch_gemv.pdl_pair through the family's pdl_pair hook, capture_chain.switch applied
by launch_table.bind. CPU only: the driver's capture query and the capture state are faked."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import settings  # noqa: E402
from tunedb.families.gemm import FAMILY, launch_gemv  # noqa: E402
from tunedb.families.gemm.launch_gemv import pdl_pair, static_weight  # noqa: E402
from tunedb.runtime import capture_chain, launch_table  # noqa: E402


@pytest.fixture
def pdl_here(monkeypatch):
    monkeypatch.setattr(launch_gemv, "_pdl_here", lambda: True)


def test_decode_configs_pair_with_their_pdl_twins_and_others_do_not(pdl_here):
    for plain, twin in (("gv1_n8x512_w4_s5_lr", "gv1_n8x512_w4_s5_lr_pdl"), ("dk8_n32x256_w4_s3_at", "dk8_n32x256_w4_s3_at_pdl"),
                        ("gv1_n8x256_w4_s5_lr_p4", "gv1_n8x256_w4_s5_lr_p4_pdl")):
        for cid in (plain, twin):  # a measured `_pdl` config pairs with its plain form the same way
            got = pdl_pair(FAMILY.parse_config(cid))
            assert (got[0].id, got[1].id, got[2]) == (plain, twin, static_weight)
    for cid in ("b128x128x64_w8_s3_g8", "torch", "sk4_b16x64x256_w4_s4"):
        assert pdl_pair(FAMILY.parse_config(cid)) is None


def test_no_pair_where_pdl_cannot_launch(monkeypatch):
    monkeypatch.setattr(launch_gemv, "_pdl_here", lambda: False)
    assert pdl_pair(FAMILY.parse_config("gv1_n8x512_w4_s5_lr")) is None


def test_only_a_parameter_weight_may_be_read_early():
    w = torch.nn.Parameter(torch.ones(4, 4))
    assert static_weight(None, w, None, None) and not static_weight(None, w * 2, None, None)


class FakeCapture:
    """A capture whose node ids advance with every launch (ours or torch's)."""

    def __init__(self):
        self.active, self.node = False, 0

    def launch(self):
        self.node += 1

    def info(self, stream):
        return (7, (self.node,)) if self.active else None


@pytest.fixture
def capture(monkeypatch):
    monkeypatch.setenv("TUNEDB_CHAIN_PDL", "1")
    cap = FakeCapture()
    monkeypatch.setattr(capture_chain, "capture_info", cap.info)
    monkeypatch.setattr(capture_chain, "_capturing_stream", lambda: 99 if cap.active else None)
    capture_chain._last.clear()
    yield cap
    capture_chain._last.clear()


def _launcher(cap, name, log):
    def run(x, w, b, out):
        cap.launch()
        log.append(name)
        return name
    return run


def test_switch_launches_the_twin_only_after_one_of_ours(capture):
    log = []
    call = capture_chain.switch(_launcher(capture, "plain", log), _launcher(capture, "pdl", log), static_weight)
    w = torch.nn.Parameter(torch.ones(2, 2))
    call(None, w, None, None)  # eager
    capture.active = True
    call(None, w, None, None)  # first in the capture: nothing of ours before it
    call(None, w, None, None)  # right after ours
    call(None, w * 2, None, None)  # after ours, but a computed weight
    capture.launch()  # a torch kernel in between
    call(None, w, None, None)
    call(None, w, None, None)
    assert log == ["plain", "plain", "pdl", "plain", "plain", "pdl"]
    with settings.override(CHAIN_PDL="0"):  # the default
        call(None, w, None, None)
    assert log[-1] == "plain"


def test_a_new_capture_does_not_follow_the_last_one(capture, monkeypatch):
    log = []
    call = capture_chain.switch(_launcher(capture, "plain", log), _launcher(capture, "pdl", log), static_weight)
    w = torch.nn.Parameter(torch.ones(2, 2))
    capture.active = True
    call(None, w, None, None)
    monkeypatch.setattr(capture_chain, "capture_info", lambda stream: (8, (capture.node,)))  # another capture
    call(None, w, None, None)
    assert log == ["plain", "plain"]


def test_bind_wraps_a_decode_config_in_the_switch(pdl_here, capture):
    cfg = FAMILY.parse_config("gv1_n8x512_w4_s5_lr")
    sig = FAMILY.make_signature("gemm", "bf16", 4096, 4096)
    made, log = [], []

    def make(family, config, s):
        made.append(config.id)
        return _launcher(capture, config.id, log)

    with launch_table.overriding(lambda family, s, m: (cfg, "autotune") if s == sig else None):
        bound = launch_table.bind(FAMILY, sig, 1, make)
    assert made == ["gv1_n8x512_w4_s5_lr", "gv1_n8x512_w4_s5_lr", "gv1_n8x512_w4_s5_lr_pdl"]
    assert bound.config.id == cfg.id and bound.direct is None  # the report names what was measured
    w = torch.nn.Parameter(torch.ones(4096, 4096))
    capture.active = True
    assert [bound.call(None, w, None, None) for _ in range(2)] == ["gv1_n8x512_w4_s5_lr", "gv1_n8x512_w4_s5_lr_pdl"]


def test_other_configs_are_bound_as_they_are(pdl_here):
    cfg = FAMILY.parse_config("b128x128x64_w8_s3_g8")
    sig = FAMILY.make_signature("gemm", "bf16", 4096, 4096)
    made = []

    def make(family, config, s):
        made.append(config.id)
        return lambda *a: config.id

    with launch_table.overriding(lambda family, s, m: (cfg, "autotune")):
        bound = launch_table.bind(FAMILY, sig, 64, make)
    assert made == [cfg.id] and bound.call(None, None, None, None) == cfg.id


def test_with_chain_pdl_off_a_plain_config_is_bound_as_it_is_and_a_pdl_config_runs_plain(pdl_here, monkeypatch):
    monkeypatch.delenv("TUNEDB_CHAIN_PDL", raising=False)
    sig = FAMILY.make_signature("gemm", "bf16", 4096, 4096)
    for cid, made_want in (("gv1_n8x512_w4_s5_lr", ["gv1_n8x512_w4_s5_lr"]),
                           ("gv1_n8x512_w4_s5_lr_pdl", ["gv1_n8x512_w4_s5_lr_pdl", "gv1_n8x512_w4_s5_lr",
                                                        "gv1_n8x512_w4_s5_lr_pdl"])):
        cfg, made = FAMILY.parse_config(cid), []

        def make(family, config, s, made=made):
            made.append(config.id)
            return lambda *a, c=config.id: c

        with launch_table.overriding(lambda family, s, m, cfg=cfg: (cfg, "autotune")):
            bound = launch_table.bind(FAMILY, sig, 1, make)
        assert made == made_want
        monkeypatch.setattr(capture_chain, "_capturing_stream", lambda: 5)
        monkeypatch.setattr(capture_chain, "follows_ours", lambda s: True)
        assert bound.call(None, torch.nn.Parameter(torch.ones(2, 2)), None, None) == "gv1_n8x512_w4_s5_lr"


def test_a_non_contiguous_parameter_is_not_read_early():
    # the launcher copies it to a contiguous buffer right before the kernel: that copy would be the
    # kernel the twin's early weight reads overlap
    w = torch.nn.Parameter(torch.ones(4, 6).t())
    assert not w.is_contiguous() and not static_weight(None, w, None, None)


def test_a_pfw_config_pairs_with_its_plain_prefetch(pdl_here):
    for cid, plain in (("dk8_n32x256_w4_s2_pfw2_pdl", "dk8_n32x256_w4_s2_pf2"),
                       ("dk2_n64x256_w4_s2_pfnw8_pdl", "dk2_n64x256_w4_s2_pfn8")):
        got = pdl_pair(FAMILY.parse_config(cid))
        assert (got[0].id, got[1].id) == (plain, cid)


def test_a_config_and_its_twin_share_their_split_k_buffers():
    from tunedb.families.gemm.launch import decode_scratch

    sig = FAMILY.make_signature("gemm", "bf16", 4096, 4096)
    for a, b in (("gv4_n16x256_w4_s5_lr", "gv4_n16x256_w4_s5_lr_pdl"),
                 ("dk8_n32x256_w4_s2_pf2", "dk8_n32x256_w4_s2_pfw2_pdl")):
        assert decode_scratch(FAMILY.parse_config(a), sig) is decode_scratch(FAMILY.parse_config(b), sig)
    assert decode_scratch(FAMILY.parse_config("gv4_n16x256_w4_s5_lr"), sig) is not \
        decode_scratch(FAMILY.parse_config("gv1_n16x256_w4_s5_lr"), sig)


def test_pre_1_ids_keep_their_old_rules():
    # the first-tile register rule is PRE's: at PRE 1 the kernel is as it always was
    for cid in ("gv1_n64x512_w4_s3_mma", "gv1_n16x512_w1_s3", "gv1_n128x256_w4_s3_mma"):
        assert FAMILY.parse_config(cid).id == cid
