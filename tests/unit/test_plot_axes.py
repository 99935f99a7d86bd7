"""`tunedb plot` of a table names its family's size axis (the linalg table's regions run along
batch, and were labelled M) and tells apart configs past the palette's 20 colours by a hatch."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tunedb.evaluate.regret import draw_regions, size_axis  # noqa: E402
from tunedb.records import Region  # noqa: E402


def test_the_axis_is_the_rows_family_size_axis():
    assert size_axis(["linalg|op=potrf|dt=fp32|n=8", "linalg|op=dot|dt=fp64|n=4"]) == "batch"
    assert size_axis(["gemm|op=gemm|dt=half|N=512|K=512"]) == "M"
    assert size_axis(["linalg|op=potrf|dt=fp32|n=8", "gemm|op=gemm|dt=half|N=512|K=512"]) == "M"
    assert size_axis(["not a signature"]) == "M"


def test_configs_past_twenty_are_told_apart():
    regions = {f"linalg|op=dot|dt=fp32|n={n}": [Region(None, f"warp_p{i}_w1")]
               for i, n in enumerate(range(2, 26), start=1)}
    fig, ax = plt.subplots()
    draw_regions(ax, regions)
    assert ax.get_xlabel() == "batch" and ax.get_title() == "regions along batch"
    look = {(tuple(p.get_facecolor()), p.get_hatch()) for p in ax.patches}
    assert len(look) == len(regions)  # 24 configs, 24 distinct fill + hatch pairs
    plt.close(fig)
