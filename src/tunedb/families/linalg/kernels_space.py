"""The small batched linear-algebra kernels' configuration space and THE validity predicate.

Pure Python (no torch, no triton): the family, the bench and the tests share it.

A config is (packing, P problems per program, num_warps); the kernel is also specialised on
n (padded to the next power of two NP with masks) and the dtype. Ids:
  thread_p{P}_w{W}  one problem per lane, processed sequentially along n (P >= 32*W);
  warp_p{P}_w{W}    P problems per program in a [P, NP(, NP)] register layout, reductions along n;
  block_w{W}        one problem per program, the whole NP x NP tile across W warps;
  lane_p{P}_w{W}    potrf/posv only, n <= 32: one matrix column per lane, its rows in registers
                    (kernels_lane.py), NP lanes per problem, P problems per program;
  reg_p{P}_w{W}     potrf/posv only, small n: one problem per thread, its lower triangle in that
                    thread's registers (kernels_reg.py), P = 32*num_warps*k problems per program.
  rows_p{P}_w{W}    potrf/posv only, n <= 32: G = 32*num_warps/P threads per problem, each holding
                    NP/G whole rows of the symmetric tile in registers (kernels_rows.py).
  shfl_p{P}_w1      potrf/posv/trsv, n <= 32: the lane layout with one column (trsv: row) per lane
                    (P * NP == 32, one warp), each pivot's column broadcast by warp shuffles
                    instead of a shared-memory transpose (kernels_shfl.py).
  panel_w{W}        potrf/posv/trsv, n >= 16: one problem per program, left-looking in panels of
                    PANEL_B columns through memory (kernels_panel.py), rows across 32*W threads.
  pdot_w{W}         potrf/posv, n >= 33: the panel packing with its left-looking update on tl.dot
                    (kernels_pdot.py; fp32 on FMAs, fp64 on DMMA), 16-column panels;
  pdottf_w{W}       the same in fp32 with tl.dot's tf32x3 (three tensor-core passes a product).
The validity predicate bounds the register tile (elements held per thread) and the sequential
work a thread-packed lane does, so every config it admits compiles without spilling, except
block_w8 at n >= 64, admitted always so every (op, n, dtype) cell has a Triton arm. Checked
again for the split potrf/posv and the row-wise trsv (sm90 cubins, Triton 3.6, the largest P at
each warp count for n in 8, 13, 16, 24, 32, 64, 128): potrf/posv spill nothing below n = 128
(the split tile holds 3/4 of what the budget counts); ptxas leaves 8-24 bytes of stack in three
trsv edge configs (fp32 n=16 P=128 w8, fp64 n=32 P=8 w1, fp64 n=64 P=16 w4) and 4 bytes in
potrf's block_w8 at n=64: a value or two reloaded from L1, left admitted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

OPS = ("dot", "gemv", "gemm", "potrf", "trsv", "posv")
PACKINGS = ("thread", "warp", "block", "lane", "reg", "rows", "shfl", "panel", "pdot", "pdottf")
DTYPES = ("fp32", "fp64", "fp16", "bf16")
HALF_OPS = ("dot", "gemv", "gemm")  # ops that also take fp16/bf16 (accumulating in fp32)
N_MIN, N_MAX = 2, 128

THREAD_P = (32, 64, 128, 256)
WARP_P = (2, 4, 8, 16, 32, 64, 128)
WARPS = (1, 2, 4, 8)
# Largest n a thread-packed lane takes per op: its sequential work grows as n, n^2 or n^3.
THREAD_MAX_N = {"dot": 128, "gemv": 64, "trsv": 64, "gemm": 16, "potrf": 32, "posv": 32}
# Ops whose warp/block kernels hold an NP x NP register tile per problem (the rest hold [NP]).
TILE_OPS = ("gemv", "gemm", "potrf", "posv")
# Register tile budget per op, in tile elements per thread, (fp32/fp16/bf16, fp64). Calibrated on
# sm90 cubins (Triton 3.9, ptxas): at these budgets no kernel spills; one step above, potrf and
# posv spill (255 registers + 350-1000 bytes of stack) and trsv's gathered columns (a 64-bit
# address per element) do too.
TILE_BUDGET = {"dot": (32, 32), "gemv": (128, 64), "gemm": (128, 64), "trsv": (16, 8),
               "potrf": (64, 32), "posv": (32, 16)}

_ID = re.compile(r"^(?:(thread|warp|lane|reg|rows|shfl)_p(\d+)_w(\d+)|(block|panel|pdot|pdottf)_w(\d+))$")
# Lane packing (kernels_lane.py): potrf/posv up to n = 32 (a problem's columns fit one warp's
# lanes). Every lane holds distinct columns (P * NP >= 32 * num_warps: a replicated lane would
# break the register-only row axis); the columns a lane holds, P * NP * NP / (32 * num_warps)
# elements, stay within LANE_BUDGET (fp32, fp64), except that one column per lane in a
# one-warp program is always admitted. Calibrated on sm90 cubins of the final kernels (Triton
# 3.6, ptxas -v, every lane config the goal bench times and the heaviest of each op, dtype, n
# and warp count): at 32 fp32 elements at most 206 registers, no spill; at 64, potrf n=8/32 and
# posv n=8/16 spilled 20-112 bytes. fp64 at 16 elements at most 150 registers; one column of
# n=32 in one warp: 212 (potrf) / 196 (posv), no spill; across 2 or 4 warps (224-226 registers,
# no spill) it stays refused: the one-warp program is the one the budget trusts.
LANE_OPS = ("potrf", "posv")
LANE_MAX_N = 32
LANE_P = (1, 2, 4, 8, 16, 32, 64, 128)
LANE_WARPS = (1, 2, 4)
LANE_BUDGET = (32, 16)
# Register packing (kernels_reg.py): potrf/posv, one problem per thread (P a multiple of
# 32*num_warps: k = P / (32*num_warps) problems per thread), the lower triangle held in
# registers: k * n(n+1)/2 elements per thread within REG_BUDGET (fp32, fp64). Calibrated on sm90
# cubins (Triton 3.6, ptxas -v, P = 32): fp32 n=16 (136 elements) posv 255 registers / potrf
# 168, no spill; fp64 n=12 (78) posv 216 / potrf 182, no spill, n=16 spills 2 KB; k=2 at fp32
# n=8 (72) 123 registers.
REG_P = (32, 64, 128, 256)
REG_WARPS = (1, 2, 4)
REG_BUDGET = (136, 78)
# Rows packing (kernels_rows.py): potrf/posv, n <= 32, G = 32*num_warps/P threads per problem
# (2 <= G <= NP: every thread holds whole rows, none is replicated), each holding NP/G rows of
# NP columns: NP*NP/G elements per thread within ROWS_BUDGET[op] (fp32, fp64). Calibrated on
# sm90 cubins (Triton 3.6, ptxas -v, one warp): fp32 n=32 G=16 (64 elements) potrf 158 / posv
# 225 registers, no spill; G=8 (128) potrf 255 + 16 bytes of spill. fp64 n=32 G=16 (64) potrf
# 240 registers, no spill, posv 255 + 552 bytes; posv at G=32 (32) 255 + 80 bytes, left
# admitted (fp64 posv n=32 has no other rows config; the ladder decides whether it is worth it).
ROWS_MAX_N = 32
ROWS_P = (1, 2, 4, 8, 16, 32, 64)
ROWS_WARPS = (1, 2, 4)
ROWS_BUDGET = {"potrf": (64, 64), "posv": (64, 32)}
# Shuffle packing (kernels_shfl.py): potrf/posv, n <= 32, exactly one column per lane of one warp
# (P * NP == 32): the pivot broadcast is a gather along the lanes only when the column axis lies
# in the lanes alone (with two columns a lane, or the problems across warps, Triton 3.6 lowers
# it to selects over registers or a shared-memory exchange with a barrier per pivot: sm90 TTGIR).
# A lane then holds NP rows of its column and the gathered chunk: within the lane packing's
# one-column budget (sm90 cubins, Triton 3.6, ptxas -v: n=32 potrf fp32 163 / fp64 152 registers,
# posv fp32 128 / fp64 150, fp64 posv n=16 102; no spill).
SHFL_MAX_N = 32
SHFL_OPS = ("potrf", "posv", "trsv")  # trsv (session 20): one row of L a lane, x_j by one shuffle a step
SHFL_P = (1, 2, 4, 8, 16)
SHFL_CHUNK = 8  # rows per chunk: pivot j gathers only the chunks that hold rows >= j
# Panel packing (kernels_panel.py): potrf/posv/trsv, n >= PANEL_MIN_N, one problem per program,
# the matrix in memory and one panel of PANEL_B columns in registers ([NP rows, 1, B], rows across
# the 32*W threads, NP / (32*W) rows a thread), updated KC columns at a time from a [NP, KC, B]
# product. No thread without a row (32*W <= NP, one warp always admitted); rows a thread within
# PANEL_ROWS (fp32, fp64). Calibrated on sm90 cubins (Triton 3.6, ptxas -v, session 20's
# kernels): potrf fp32 n=128 118 registers (W=2) / 208 (W=1), fp64 n=64 118 (W=2) / 233 (W=1);
# posv fp64 n=64 W=1 250, n=128 W=2 252 / W=4 134 (two rows a thread in fp64 is the edge);
# no config spills (tests/unit/test_linalg_panel.py reads the spills off ptxas).
PANEL_OPS = ("potrf", "posv", "trsv")
PANEL_MIN_N = 16
PANEL_WARPS = (1, 2, 4)
PANEL_B = {"fp32": 8, "fp64": 8}
PANEL_KC = {"fp32": 8, "fp64": 4}
PANEL_ROWS = (4, 2)
# pdot (kernels_pdot.py, session 20): potrf/posv, NP >= 64, one problem per program, rows across
# 32*W threads, at most PDOT_ROWS (fp32, fp64) a thread and none without a row. Calibrated on
# sm90 cubins (Triton 3.6, ptxas -v): fp32 n=128 W=1 (4 rows) spills 8-52 bytes, W=2 207-222
# registers; fp64 n=64 W=1 (2 rows) spills 24-32 bytes, W=2 254; fp64 n=128 W=4 253-255, none
# spills at these budgets. pdottf (input_precision tf32x3, fp32 only): the same budget.
PDOT_PACKINGS = ("pdot", "pdottf")
PDOT_OPS = ("potrf", "posv")
PDOT_MIN_N = 33
PDOT_ROWS = (2, 1)
PDOT_B, PDOT_KC = 8, 16  # the factor's sub-panel and the product's k-chunk (the update's panel is 2B)
ONE_PROBLEM = ("block", "panel", *PDOT_PACKINGS)  # packings whose ids carry no _p<P>


@dataclass(frozen=True)
class KernelConfig:
    """One Triton arm: packing, problems per program, warps per program."""

    packing: str
    problems: int
    warps: int

    @property
    def id(self) -> str:
        if self.packing in ONE_PROBLEM:
            return f"{self.packing}_w{self.warps}"
        return f"{self.packing}_p{self.problems}_w{self.warps}"

    @property
    def simplicity(self) -> int:
        """Rank for the tie band: thread before warp before block (lower is simpler)."""
        return PACKINGS.index(self.packing)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def parse_config(config_id: str) -> KernelConfig:
    """The KernelConfig named by `config_id`; ValueError naming the id and the allowed forms."""
    m = _ID.match(str(config_id))
    if not m:
        raise ValueError(f"bad linalg config id {config_id!r}: expected thread_p<P>_w<W>, "
                         "warp_p<P>_w<W>, block_w<W>, lane_p<P>_w<W>, reg_p<P>_w<W>, rows_p<P>_w<W>, shfl_p<P>_w1 "
                         "or panel_w<W> "
                         "(P a power of two, W in 1, 2, 4, 8)")
    if m.group(4):
        return KernelConfig(m.group(4), 1, int(m.group(5)))
    return KernelConfig(m.group(1), int(m.group(2)), int(m.group(3)))


def tile_elements(op: str, packing: str, problems: int, n: int) -> int:
    """Elements of the register tile one program holds (padded to NP)."""
    np2 = next_pow2(n)
    per = np2 * np2 if op in TILE_OPS else np2
    return problems * per


def invalid_reason(op: str, packing: str, problems: int, warps: int, n: int, dtype: str) -> str | None:
    """Why (op, packing, P, warps, n, dtype) cannot run, or None when it can. THE predicate."""
    if op not in OPS:
        return f"op {op!r} is not one of {', '.join(OPS)}"
    if packing not in PACKINGS:
        return f"packing {packing!r} is not one of {', '.join(PACKINGS)}"
    if dtype not in DTYPES:
        return f"dtype {dtype!r} is not one of {', '.join(DTYPES)}"
    if dtype in ("fp16", "bf16") and op not in HALF_OPS:
        return f"{op} takes fp32 or fp64, not {dtype} (fp16/bf16 only for {', '.join(HALF_OPS)})"
    if not isinstance(n, int) or not N_MIN <= n <= N_MAX:
        return f"n={n!r} is outside {N_MIN}..{N_MAX}"
    if warps not in WARPS:
        return f"num_warps={warps} is not one of {WARPS}"
    if problems < 1 or problems & (problems - 1):
        return f"P={problems} is not a power of two"
    lanes = 32 * warps
    if packing == "lane":
        return _lane_invalid(op, problems, warps, n, dtype, lanes)
    if packing == "reg":
        return _reg_invalid(op, problems, warps, n, dtype, lanes)
    if packing == "rows":
        return _rows_invalid(op, problems, warps, n, dtype, lanes)
    if packing == "shfl":
        return _shfl_invalid(op, problems, warps, n)
    if packing == "panel":
        return _panel_invalid(op, problems, warps, n, dtype)
    if packing in PDOT_PACKINGS:
        return _pdot_invalid(op, packing, problems, warps, n, dtype)
    if packing == "thread":
        if problems < lanes:
            # Each lane re-reads what it wrote; a replicated lane would read another's stale copy.
            return f"thread packing needs P >= 32*num_warps ({lanes}), got P={problems}"
        if problems > max(THREAD_P):
            return f"thread packing takes P <= {max(THREAD_P)}, got P={problems}"
        if n > THREAD_MAX_N[op]:
            return f"thread packing of {op} takes n <= {THREAD_MAX_N[op]} (sequential work per lane), got n={n}"
        return None
    if packing == "block" and problems != 1:
        return f"block packing carries one problem per program, got P={problems}"
    if packing == "warp" and problems < 2:
        return "warp packing carries P >= 2 problems per program (P=1 is block packing)"
    elems = tile_elements(op, packing, problems, n)
    per = TILE_BUDGET[op][dtype == "fp64"]
    # block_w8 stays admitted at n >= 64 even where it spills: at n=128 it is the only Triton
    # arm of potrf/posv, and the ladder (with torch in it) decides whether it is worth serving.
    if elems > per * lanes and not (packing == "block" and warps == 8 and n >= 64):
        return (f"register tile of {elems} elements exceeds {per} per thread x {lanes} threads "
                f"for {op} in {dtype} (it would spill)")
    if warps > 1 and elems < lanes:
        return f"tile of {elems} elements leaves lanes idle at num_warps={warps} (use fewer warps)"
    return None


def _lane_invalid(op: str, problems: int, warps: int, n: int, dtype: str, lanes: int) -> str | None:
    if op not in LANE_OPS:
        return f"lane packing runs {', '.join(LANE_OPS)} only, not {op}"
    if n > LANE_MAX_N:
        return f"lane packing takes n <= {LANE_MAX_N} (a problem's columns across one warp), got n={n}"
    if warps not in LANE_WARPS:
        return f"lane packing takes num_warps in {LANE_WARPS}, got {warps}"
    if problems > max(LANE_P):
        return f"lane packing takes P <= {max(LANE_P)}, got P={problems}"
    np2 = next_pow2(n)
    if problems * np2 < lanes:
        return (f"lane packing needs P * NP >= 32*num_warps ({lanes}) so no lane is replicated, "
                f"got P={problems}, NP={np2}")
    cols = problems * np2 // lanes
    per = cols * np2
    budget = LANE_BUDGET[dtype == "fp64"]
    if per > budget and not (cols == 1 and warps == 1):
        return (f"lane tile of {per} elements per thread exceeds {budget} for {op} in {dtype} "
                f"(it would spill)")
    return None


def _reg_invalid(op: str, problems: int, warps: int, n: int, dtype: str, lanes: int) -> str | None:
    if op not in LANE_OPS:
        return f"reg packing runs {', '.join(LANE_OPS)} only, not {op}"
    if warps not in REG_WARPS:
        return f"reg packing takes num_warps in {REG_WARPS}, got {warps}"
    if problems > max(REG_P):
        return f"reg packing takes P <= {max(REG_P)}, got P={problems}"
    if problems < lanes:
        return f"reg packing needs P >= 32*num_warps ({lanes}): one problem per thread, got P={problems}"
    per = problems // lanes * (n * (n + 1) // 2)
    budget = REG_BUDGET[dtype == "fp64"]
    if per > budget:
        return (f"reg packing holds {per} elements per thread (the lower triangle of "
                f"{problems // lanes} problem(s) of n={n}), over {budget} for {dtype} (it would spill)")
    return None


def _rows_invalid(op: str, problems: int, warps: int, n: int, dtype: str, lanes: int) -> str | None:
    if op not in LANE_OPS:
        return f"rows packing runs {', '.join(LANE_OPS)} only, not {op}"
    if n > ROWS_MAX_N:
        return f"rows packing takes n <= {ROWS_MAX_N} (a problem's threads within one warp), got n={n}"
    if warps not in ROWS_WARPS:
        return f"rows packing takes num_warps in {ROWS_WARPS}, got {warps}"
    if problems > max(ROWS_P):
        return f"rows packing takes P <= {max(ROWS_P)}, got P={problems}"
    if 2 * problems > lanes:
        return (f"rows packing puts 32*num_warps/P >= 2 threads on a problem, got P={problems} at "
                f"num_warps={warps} (one problem per thread is the reg packing)")
    np2 = next_pow2(n)
    group = lanes // problems
    if group > np2:
        return (f"rows packing needs 32*num_warps/P <= NP ({np2}) threads per problem so each holds "
                f"whole rows, got {group} (P={problems}, num_warps={warps})")
    per = np2 * np2 // group
    budget = ROWS_BUDGET[op][dtype == "fp64"]
    if per > budget:
        return (f"rows packing holds {per} elements per thread ({np2 // group} rows of {np2}) for "
                f"{op} in {dtype}, over {budget} (it would spill)")
    return None


def _shfl_invalid(op: str, problems: int, warps: int, n: int) -> str | None:
    if op not in SHFL_OPS:
        return f"shfl packing runs {', '.join(SHFL_OPS)} only, not {op}"
    if n > SHFL_MAX_N:
        return f"shfl packing takes n <= {SHFL_MAX_N} (a problem's columns across one warp's lanes), got n={n}"
    if warps != 1:
        return f"shfl packing runs one warp per program (the shuffles stay inside it), got num_warps={warps}"
    np2 = next_pow2(n)
    if problems * np2 != 32:
        return (f"shfl packing holds one column per lane: P * NP must be 32, got P={problems}, NP={np2} "
                f"(P={32 // np2} at n={n})")
    return None


def _panel_invalid(op: str, problems: int, warps: int, n: int, dtype: str) -> str | None:
    if op not in PANEL_OPS:
        return f"panel packing runs {', '.join(PANEL_OPS)} only, not {op}"
    if n < PANEL_MIN_N:
        return f"panel packing takes n >= {PANEL_MIN_N}, got n={n}"
    if problems != 1:
        return f"panel packing carries one problem per program, got P={problems}"
    if warps not in PANEL_WARPS:
        return f"panel packing takes num_warps in {PANEL_WARPS}, got {warps}"
    if op == "trsv":  # every lane carries the whole solve (one copy a lane, whatever n)
        return None if warps == 1 else (
            f"panel packing of trsv runs one warp (every thread carries the whole solve), got num_warps={warps}")
    np2 = panel_rows(n)
    if warps > 1 and 32 * warps > np2:
        return (f"panel packing puts the {np2} rows across 32*num_warps threads: num_warps={warps} "
                f"leaves threads without a row (at most {max(1, np2 // 32)})")
    rows = max(1, np2 // (32 * warps))
    budget = PANEL_ROWS[dtype == "fp64"]
    if rows > budget:
        return (f"panel packing holds {rows} rows a thread at n={n}, num_warps={warps}, over {budget} "
                f"for {dtype} (it would spill; num_warps >= {np2 // (32 * budget)} fits)")
    return None


def _pdot_invalid(op: str, packing: str, problems: int, warps: int, n: int, dtype: str) -> str | None:
    if op not in PDOT_OPS:
        return f"{packing} packing runs {', '.join(PDOT_OPS)} only, not {op}"
    if packing == "pdottf" and dtype != "fp32":
        return f"pdottf packing (tf32x3 products) runs fp32 only, not {dtype} (pdot is the {dtype} form)"
    if n < PDOT_MIN_N:
        return f"{packing} packing takes n >= {PDOT_MIN_N} (16-column panels), got n={n}"
    if problems != 1:
        return f"{packing} packing carries one problem per program, got P={problems}"
    if warps not in PANEL_WARPS:
        return f"{packing} packing takes num_warps in {PANEL_WARPS}, got {warps}"
    np2 = panel_rows(n)
    rows = np2 // (32 * warps)
    budget = PDOT_ROWS[dtype == "fp64"]
    if rows < 1:
        return f"{packing} packing at n={n} leaves threads without a row at num_warps={warps} (at most {np2 // 32})"
    if rows > budget:
        return (f"{packing} packing holds {rows} rows a thread at n={n}, num_warps={warps}, over {budget} "
                f"for {dtype} (it would spill; num_warps >= {np2 // (32 * budget)} fits)")
    return None


def panel_rows(n: int, op: str = "potrf") -> int:
    """The row axis of a panel tile (the kernel's NP): n padded to a power of two, and at least
    one warp's 32 lanes (a shorter axis would replicate rows across lanes, and Triton 3.6 then
    gives the tile a layout whose in-thread picks become shuffles: sm90 PTX, n = 16). trsv's is
    always the one warp's 32 lanes (every lane carries the whole solve)."""
    return 32 if op == "trsv" else max(32, next_pow2(n))


def panel_shape(dtype: str) -> tuple[int, int]:
    """(B, KC) of a panel kernel: columns a panel, columns of the update's product at a time
    (KC divides B: the update's chunks never reach the panel's own columns)."""
    b, kc = PANEL_B["fp64" if dtype == "fp64" else "fp32"], PANEL_KC["fp64" if dtype == "fp64" else "fp32"]
    assert b % kc == 0, (b, kc)
    return b, kc


def shfl_chunk(n: int) -> int:
    """Rows per chunk of a shfl tile (the kernel's CH): SHFL_CHUNK, or NP below it (NP / CH is
    1, 2 or 4: the kernel holds at most four chunks)."""
    return min(SHFL_CHUNK, next_pow2(n))


def lane_columns(problems: int, warps: int, n: int) -> int:
    """Matrix columns each lane holds in a lane config (the kernel's COLS: its load's vector)."""
    return max(1, problems * next_pow2(n) // (32 * warps))


def config_space(op: str | None = None, n: int | None = None, dtype: str | None = None) -> list[KernelConfig]:
    """Every Triton config; restricted to the valid ones for (op, n, dtype) when all three are given."""
    out = [KernelConfig("thread", p, w) for p in THREAD_P for w in WARPS if p >= 32 * w]
    out += [KernelConfig("warp", p, w) for p in WARP_P for w in WARPS]
    out += [KernelConfig("block", 1, w) for w in WARPS]
    out += [KernelConfig("lane", p, w) for p in LANE_P for w in LANE_WARPS]
    out += [KernelConfig("reg", p, w) for p in REG_P for w in REG_WARPS if p >= 32 * w]
    out += [KernelConfig("rows", p, w) for p in ROWS_P for w in ROWS_WARPS if 2 * p <= 32 * w]
    out += [KernelConfig("shfl", p, 1) for p in SHFL_P]
    out += [KernelConfig("panel", 1, w) for w in PANEL_WARPS]
    out += [KernelConfig(p, 1, w) for p in PDOT_PACKINGS for w in PANEL_WARPS]
    if op is None or n is None or dtype is None:
        return out
    return [c for c in out if invalid_reason(op, c.packing, c.problems, c.warps, n, dtype) is None]

