"""The fit on recorded traces: the optimum, the band, its center, and the statistic's choice."""
from __future__ import annotations

import pytest

from tunedb.cutoff.fitting import fit, stat_of, within_band
from tunedb.cutoff.probing import Probe, Trace
from tunedb.errors import CutoffError

SIGNALS = tuple(float(s) for s in range(1, 101))


def traces(iterative, direct=None):
    direct = direct or (lambda s: 10.0)
    return {"iterative": Trace("iterative", tuple(iterative(s) for s in SIGNALS), SIGNALS),
            "direct": Trace("direct", tuple(direct(s) for s in SIGNALS), SIGNALS)}


def test_mean_cutoff_is_the_band_center_around_the_crossover():
    f = fit(traces(lambda s: 0.2 * s), statistic="mean", tolerance=0.02)  # crossover at s = 50
    assert f.pairing == "index" and f.solves == 100
    assert 49.0 <= f.optimum <= 51.0
    lo, hi = f.band
    assert lo < f.optimum < hi
    assert f.cutoff == pytest.approx((lo + hi) / 2)
    # the band is exactly the candidates within 2% of the optimum: one step past each edge is out
    composed = lambda c: stat_of([0.2 * s if s <= c else 10.0 for s in SIGNALS], "mean")  # noqa: E731
    assert composed(lo) <= f.value_at_optimum * 1.02 and composed(hi) <= f.value_at_optimum * 1.02
    assert composed(lo - 1) > f.value_at_optimum * 1.02 and composed(hi + 1) > f.value_at_optimum * 1.02
    assert f.value_at_optimum == pytest.approx(composed(50))
    assert f.fixed == {"iterative": pytest.approx(10.1), "direct": pytest.approx(10.0)}


def test_the_statistic_decides_the_cutoff():
    """Rare slow iterative solves at low signals: the mean still wants iterative up to the
    crossover, a deadline (max or p99) wants direct for every solve that could spike."""
    spikes = {10.0, 20.0, 30.0, 40.0}
    it = lambda s: 50.0 if s in spikes else (1.0 if s <= 50 else 30.0)  # noqa: E731
    mean = fit(traces(it), statistic="mean")
    worst = fit(traces(it), statistic="max")
    p99 = fit(traces(it), statistic="p99")
    assert mean.cutoff > 40.0
    assert worst.band[1] < 10.0 and worst.cutoff < 10.0
    assert p99.cutoff < 10.0
    assert worst.value_at_cutoff == pytest.approx(10.0)


def test_log_scale_center_and_within_band():
    f = fit(traces(lambda s: 0.2 * s), statistic="mean", scale="log")
    lo, hi = f.band
    assert f.cutoff == pytest.approx((lo * hi) ** 0.5)
    assert within_band(f.cutoff, f.band) and not within_band(hi * 1.01, f.band)


def test_nearest_pairing_when_runs_saw_different_signals():
    it = Trace("iterative", tuple(0.2 * s for s in SIGNALS[::2]), SIGNALS[::2])
    di = Trace("direct", tuple(10.0 for _ in SIGNALS[1::2]), SIGNALS[1::2][::-1])  # another order
    f = fit({"iterative": it, "direct": di}, statistic="mean")
    assert f.pairing == "nearest" and f.solves == 100
    assert 45.0 <= f.optimum <= 55.0


def test_fit_reads_a_probe_and_rejects_bad_arguments():
    probe = Probe("p", "cpu", "perf_counter", traces(lambda s: 0.2 * s))
    assert fit(probe, statistic="mean").optimum == fit(probe.traces, statistic="mean").optimum
    with pytest.raises(CutoffError, match="statistic 'p50' not supported"):
        fit(probe, statistic="p50")
    with pytest.raises(CutoffError, match="no trace"):
        fit({"direct": probe.traces["direct"]})
    with pytest.raises(CutoffError, match="tolerance"):
        fit(probe, tolerance=1.5)
    with pytest.raises(CutoffError, match="3 times but 2 signals"):
        Trace("direct", (1.0, 2.0, 3.0), (1.0, 2.0))


@pytest.mark.parametrize("scale", ["linear", "log"])
def test_one_policy_everywhere_gives_a_band_open_to_the_signal_domain_end(scale):
    """Direct faster on every solve (the optimum at the edge): every cutoff below the smallest
    observed signal composes the same times, so the band runs from the domain's end up to the
    last cutoff within tolerance, and a re-probe whose signals moved still lands inside it."""
    f = fit(traces(lambda s: 30.0 + 0.01 * s), statistic="max", scale=scale)
    lo, hi = f.band
    assert lo == (0.0 if scale == "log" else float("-inf"))
    assert hi < SIGNALS[0] and f.cutoff < SIGNALS[0] and within_band(f.cutoff, f.band)
    assert f.value_at_cutoff == pytest.approx(10.0) and f.value_at_optimum == pytest.approx(10.0)
    moved = tuple(s * 1.05 for s in SIGNALS)  # a second probe: the same workload, signals 5% off
    again = fit({"iterative": Trace("iterative", tuple(30.0 for _ in moved), moved),
                 "direct": Trace("direct", tuple(10.0 for _ in moved), moved)}, statistic="max", scale=scale)
    assert within_band(again.cutoff, f.band) and within_band(f.cutoff, again.band)
    # iterative everywhere: the band is open above instead
    g = fit(traces(lambda s: 5.0), statistic="mean", scale=scale)
    assert g.band[1] == float("inf") and g.cutoff > SIGNALS[-1] and g.value_at_cutoff == pytest.approx(5.0)
    # both policies equal within tolerance everywhere: the whole domain, cutoff mid-range
    h = fit(traces(lambda s: 10.05), statistic="mean", scale=scale)
    assert h.band[1] == float("inf") and h.band[0] == lo and SIGNALS[0] < h.cutoff < SIGNALS[-1]


def test_package_attributes_stay_the_functions_after_use():
    # the submodules are named probing/fitting so that importing them never rebinds
    # tunedb.cutoff.probe / tunedb.cutoff.fit to a module
    import tunedb.cutoff as cutoff
    from tunedb.cutoff import fitting, probing  # noqa: F401

    for _ in range(2):
        assert callable(cutoff.probe) and callable(cutoff.fit)
        f = cutoff.fit(traces(lambda s: 0.2 * s), statistic="mean")
        assert 40.0 <= f.cutoff <= 60.0


@pytest.mark.parametrize("kwargs, word", [({"k": 0}, "k must be"), ({"k": -2}, "k must be"),
                                          ({"below": "direct", "above": "direct"}, "same policy")])
def test_fit_refuses_bad_arguments_by_name(kwargs, word):
    with pytest.raises(CutoffError, match=word):
        fit(traces(lambda s: 0.2 * s), statistic="mean", **kwargs)


@pytest.mark.parametrize("times, signals, word", [((1.0, float("nan")), (1.0, 2.0), "time nan"),
                                                  ((1.0, 2.0), (1.0, float("inf")), "signal inf"),
                                                  ((1.0, -2.0), (1.0, 2.0), "negative")])
def test_trace_refuses_non_finite_or_negative_values(times, signals, word):
    with pytest.raises(CutoffError, match=word):
        Trace("direct", times, signals)


def test_probe_refuses_negative_discard():
    from tunedb.cutoff.probing import probe

    with pytest.raises(CutoffError, match="discard must be"):
        probe(lambda solver: None, problem="p", device="cpu", discard=-1)


@pytest.mark.parametrize("bad", [{"tolerance": "0.05"}, {"tolerance": None}, {"traces": None},
                                 {"traces": {"direct": {"times_ms": [1.0]}, "iterative": {"times_ms": [1.0]}}}])
def test_fit_names_a_bad_argument(bad):
    from tunedb import cutoff
    from tunedb.cutoff.probing import Trace
    from tunedb.errors import CutoffError

    traces = {"direct": Trace("direct", (1.0, 1.0), (0.1, 0.2)), "iterative": Trace("iterative", (0.5, 2.0), (0.1, 0.2))}
    kw = dict(bad)
    traces = kw.pop("traces", traces)
    with pytest.raises(CutoffError, match="tolerance must be a number|fit takes a Probe"):
        cutoff.fit(traces, **kw)


def test_an_open_band_is_written_as_standard_json_and_read_back():
    """An open band edge was written as Infinity, which jq and JSON.parse refuse."""
    import json
    import math

    from tunedb.cutoff.fitting import Fit
    from tunedb.cutoff.store import Decision

    fit = Fit("p99", 0.02, "iterative", "direct", 7.5, 7.5, (7.5, math.inf), 1.0, 1.0, {"direct": 1.0},
              4, "index", "linear")
    text = json.dumps(fit.to_json(), allow_nan=False)
    assert Fit.from_json(json.loads(text)) == fit
    d = Decision("p", "cpu", 7.5, band=(-math.inf, math.inf), fit=fit.to_json())
    back = Decision.from_json(json.loads(json.dumps(d.to_json(), allow_nan=False)))
    assert back.band == (-math.inf, math.inf) and back.cutoff == 7.5
