"""One row of benchmarks/paper/REPORT.md: a paper figure's claim against the reproduction.

In: what a reproduction script measured (text for the table, and the scalars or ranges
that decide "within 20%"). Out: a plain dict that the script writes into its JSON under
`rows`, and that `report.py` turns into the report's tables. Owned by the paper
reproductions; the generator reads only these fields.
"""

import math

TOLERANCE = 0.2
"""A reproduced number is "within 20%" of the paper's when |sim / paper - 1| <= this. For a
claim worded "X% lower / shorter / less" the number is the ratio ours / baseline = 1 - X
(`within_reduction`), as issue 35 reads every claim: "ordering and ratio within 20%"."""
NO_TOP = math.inf
"""The top of a paper range whose text leaves it open ("A to over B", with no bound above
stated in the text or a figure's text): a point holds when it is >= A * (1 - TOLERANCE)
(the lead's reading for issue 35, applied the same whether it helps or hurts)."""


def within(
    sim_value: float | None = None,
    paper_value: float | None = None,
    sim_range: tuple[float, float] | None = None,
    paper_range: tuple[float, float] | None = None,
) -> bool | None:
    """Whether the reproduction is within TOLERANCE of the paper: a value against a value,
    or every simulated point inside the paper's range widened by TOLERANCE (a range's top
    may be NO_TOP). None when the paper gives no number."""
    if paper_range is not None:
        lo, hi = paper_range
        pts = sim_range if sim_range is not None else (sim_value, sim_value)
        if pts[0] is None or pts[1] is None:
            return None
        return lo * (1 - TOLERANCE) <= pts[0] and pts[1] <= hi * (1 + TOLERANCE)
    if sim_value is None or paper_value is None or paper_value == 0:
        return None
    return abs(sim_value / paper_value - 1) <= TOLERANCE


def within_reduction(sim_reduction: float | None, paper_reduction: float | None) -> bool | None:
    """An "X% lower" claim judged on its ratio, ours / baseline = 1 - X, against the
    paper's 1 - X_paper (one rule for every percent-reduction row; "Nx" speedups are
    already ratios and go through `within`). None when either is missing."""
    if sim_reduction is None or paper_reduction is None:
        return None
    return within(1 - sim_reduction, 1 - paper_reduction)


def row(
    paper: str,
    figure: str,
    claim: str,
    paper_text: str,
    sim_text: str,
    ordering: bool | None,
    sim_value: float | None = None,
    paper_value: float | None = None,
    sim_range: tuple[float, float] | None = None,
    paper_range: tuple[float, float] | None = None,
    cause: str | None = None,
    pairs: tuple[tuple[float, float], ...] = (),
    reductions: tuple[tuple[float, float], ...] = (),
) -> dict:
    """A report row. `cause` says why it misses (with its measured counterfactual) where
    the ordering fails or the number is more than 20% off; `report.py` adds the emulated
    column and any cause recorded in causes.json. `pairs`: several (simulated, paper)
    numbers of one figure, all of which must be within 20%. `reductions`: the same for a
    claim worded "X% lower" (simulated, paper fractions X), each judged by
    `within_reduction`."""
    if reductions:
        close = all([within_reduction(sim, pap) for sim, pap in reductions])  # every pair judged
    elif pairs:
        close = all(within(sim, pap) for sim, pap in pairs)
    else:
        close = within(sim_value, paper_value, sim_range, paper_range)
    return {
        "paper": paper,
        "figure": figure,
        "claim": claim,
        "paper_value": paper_text,
        "simulator": sim_text,
        "ordering": None if ordering is None else bool(ordering),
        "within_20": close,
        "cause": cause,
    }
