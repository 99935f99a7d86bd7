"""The bf16 GEMV (`gv`) decode lane held out by model (issue 18, item 1), on the CPU from a recorded
H200 build log: does the M <= 16 weight-read regime, where `gv` beats cuBLAS, transfer from model
to model, and how much of each held-out model's oracle gain could a rule serving it keep?

    python bench/lomo_gv.py [--log LOG.jsonl.gz] [--out JSON]     (about 40 s)

--log defaults to session 17 B's build (`gv` in the build space; lomo_cli.GV_LOG): earlier logs
hold no `gv` arm.

The rule (gv_rule): at a held-out point with M <= M*, serve the `gv` arm the GEMV predictor
(decode_cost.gemv_us, costmodel.predict) ranks fastest among the `gv` arms measured there; else
torch. M* is chosen on the training models only: the largest of M_STARS such that the training
set holds at least MIN_EVIDENCE points with M <= M* and, at every one of them, the rule's pick is
within the goal's 5% of the best measured arm (and its geomean regret no worse than torch's); 0
(serve nothing) where no M* qualifies. Caveat in the rule's favour: the GEMV predictor's constants
were fitted on Llama-3-8B's decode weights (session 16 C), so on the llama split it is not blind.
Also printed, per split: where the oracle's gain over torch lies (share of its summed log gain by
epilogue kind x M range), the largest decode (M <= 16) weight the training set measured against
the held-out model's, and "peeked" lines (NOT results): the rule at each fixed M*, chosen with the
held-out split in view, i.e. the most any M* could show here.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lomo_transfer as lt  # noqa: E402

GOAL_MAX = 0.05
M_STARS = (1, 2, 4, 8, 16)  # M <= 16: the gv lane's range (configs_gemv.MAX_M)
MIN_EVIDENCE = 2
M_RANGES = ((1, "m1"), (16, "m2-16"), (128, "m17-128"), (1 << 62, "m129+"))

Picker = Callable[["lt.Point"], "str | None"]


def gv_rule(points: Sequence[lt.Point], pick: Picker, m_star: int) -> dict[Any, str]:
    """{point key: arm}: the predictor's `gv` pick at M <= m_star (where it has one), else torch."""
    out = {}
    for p in points:
        c = pick(p) if p.m <= m_star else None
        out[p.key] = c or "torch"
    return out


def choose_m_star(train: Sequence[lt.Point], pick: Picker) -> int:
    """The largest M* of M_STARS safe on the training points themselves (module docstring); 0 when none."""
    best = 0
    for m_star in M_STARS:
        pts = [p for p in train if p.m <= m_star and "torch" in p.ms]
        if len(pts) < MIN_EVIDENCE:
            continue
        s = lt.score(pts, gv_rule(pts, pick, m_star))
        if lt.safe(s):  # every M* is judged: the geomean part of `safe` is not monotone in M*
            best = m_star
    return best


def gain_shares(points: Sequence[lt.Point]) -> dict[str, float]:
    """Share of the oracle's summed log gain over torch per 'kind|M range'."""
    out: dict[str, float] = {}
    for p in points:
        if "torch" in p.ms:
            key = f"{p.kind or 'plain'}|{next(n for e, n in M_RANGES if p.m <= e)}"
            out[key] = out.get(key, 0.0) + math.log(p.ms["torch"] / min(p.ms.values()))
    total = sum(out.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in sorted(out.items())}


def predictor_pick(study: Any) -> Picker:
    """The GEMV predictor's fastest `gv` arm measured at a point (None: no `gv` arm there)."""
    from tunedb.families.gemm import costmodel
    from tunedb.families.gemm.configs_gemv import is_gemv
    from tunedb.records import Status

    def pick(p: lt.Point) -> str | None:
        best: tuple[float, str] | None = None
        for c in sorted(p.ms):
            cfg = study.configs.get(c)
            if cfg is None or cfg.is_sentinel or not is_gemv(cfg):
                continue
            t = costmodel.predict(cfg, p.key, study.arch, costmodel.ModelParams())
            if not isinstance(t, Status) and (best is None or t < best[0]):
                best = (t, c)
        return None if best is None else best[1]
    return pick


def run(log: Path) -> dict[str, Any]:
    points, held, study = lt.study_points(log)
    pick = predictor_pick(study)
    splits = {}
    for w, sigs in held.items():
        train = [p for p in points if p.key[0].format() not in sigs]
        test = [p for p in points if p.key[0].format() in sigs]
        m_star = choose_m_star(train, pick)
        picks = gv_rule(test, pick, m_star)
        decode_w = lambda ps: max((p.weight for p in ps if p.m <= 16), default=0.0) / (1 << 20)  # noqa: E731
        splits[w] = {"m_star": m_star, **lt.score(test, picks), "gain_shares": gain_shares(test),
                     "train_decode_weight_mb": decode_w(train), "held_decode_weight_mb": decode_w(test),
                     "peeked": {m: lt.score(test, gv_rule(test, pick, m)) for m in M_STARS},
                     "served_configs": sorted(f"{k[0].format()} M={k[1]}: {c}" for k, c in picks.items() if c != "torch")}
    return {"log": str(log), "splits": splits}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def print_report(doc: Mapping[str, Any]) -> None:
    print("gv decode rule (the GEMV predictor's pick at M <= M*, M* chosen on the training models only):")
    print(f"{'held out':18} {'M*':>3} {'torch geo':>9} {'rule geo':>9} {'served':>7} {'served max':>10} {'kept':>6}"
          f"  {'train/held decode weight':>25}")
    for w, s in doc["splits"].items():
        print(f"{w:18} {s['m_star']:>3} {_pct(s['torch_geomean']):>9} {_pct(s['rule_geomean']):>9} "
              f"{s['served']:>3}/{s['points']:<3} {_pct(s['served_max']):>10} {_pct(s['gain_kept']):>6}"
              f"  {s['train_decode_weight_mb']:>9.1f} / {s['held_decode_weight_mb']:.1f} MB")
    print("peeked (NOT results: each fixed M*, held-out split in view): kept / served max")
    for w, s in doc["splits"].items():
        print(f"  {w:18} " + "  ".join(f"M*={m}: {_pct(r['gain_kept'])} / {_pct(r['served_max'])}"
                                      for m, r in s["peeked"].items()))
    print("where each held-out model's oracle gain over torch lies (share of its summed log gain):")
    for w, s in doc["splits"].items():
        print(f"  {w:18} " + ", ".join(f"{k} {_pct(v)}" for k, v in s["gain_shares"].items() if v > 0.0005))


def main(argv: Sequence[str] | None = None) -> int:
    from lomo_cli import GV_LOG, replay_main

    return replay_main(argv, __doc__, run, lambda doc, _log: print_report(doc), default_log=GV_LOG, json_default=str)


if __name__ == "__main__":
    sys.exit(main())
