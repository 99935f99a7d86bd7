"""Evaluation: regret of selections against a measured oracle.

regret.py holds the records and the arithmetic (pure: measurements and selectors in, a summary
out); oracle.py reads measurement logs and assembles the selectors it compares (database tiers,
the family's cost model, the default). The package exposes regret's names, so
``from tunedb import evaluate; evaluate.evaluate(...)`` reads as one stage.
"""
from tunedb.evaluate.regret import (Evaluation, Pick, PointResult, Summary, carry_weights, draw_regions,
                                    draw_regret, evaluate, latest, percentile, render_table,
                                    save_figure)

__all__ = ["Evaluation", "Pick", "PointResult", "Summary", "carry_weights", "draw_regions",
           "draw_regret", "evaluate", "latest", "percentile", "render_table", "save_figure"]
