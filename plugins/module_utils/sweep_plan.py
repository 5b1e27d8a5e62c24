# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Plan a speculative-decoding sweep: expand and validate the points, and spread them over the hosts.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.
Every error is a SweepInputError naming the playbook variable (``sweep_*``) and what is accepted, so
playbooks/spec_sweep.yml can stop before any host restarts.

The rules are SGLang 0.5.23's for the EAGLE family (``srt/arg_groups/speculative_hook.py``,
``_handle_eagle_family``, and the draft tree in ``srt/speculative/eagle_utils.py``):

- steps, top-k and draft tokens are integers >= 1;
- with top-k 1 SGLang sets draft tokens to steps + 1 whatever was asked, so a point asking for other
  draft tokens would be measured as a different point than it claims;
- with top-k > 1 draft tokens must be given, and the draft tree holds topk + (steps - 1) * topk^2
  candidates, of which draft tokens - 1 are verified: more than that fails the load (``torch.topk``
  out of range while capturing CUDA graphs); fewer than 2 verifies nothing;
- NGRAM, DFLASH and DSPARK force their own steps and top-k, so there is nothing to sweep.
"""

from __future__ import annotations

import itertools

FIXED_SHAPE_ALGORITHMS = ("NGRAM", "DFLASH", "DSPARK")
APPLY_CHOICES = ("original", "best")
POINT_KEYS = ("steps", "topk", "draft_tokens")


class SweepInputError(ValueError):
    """A bad sweep variable; ``variable`` names it."""

    def __init__(self, variable: str, message: str):
        self.variable = variable
        super().__init__(f"{variable} {message}")


class Point:
    """One sweep setting: speculative steps, top-k and draft tokens (resolved as SGLang resolves them)."""

    def __init__(self, steps: int, topk: int, draft_tokens: int):
        self.steps = steps
        self.topk = topk
        self.draft_tokens = draft_tokens

    @property
    def id(self) -> str:
        """Stable and file-name safe; also the sort key of results (zero-padded)."""
        return f"steps{self.steps:03d}-topk{self.topk:02d}-draft{self.draft_tokens:03d}"

    def as_dict(self) -> dict:
        return {"id": self.id, "steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens}

    def __eq__(self, other) -> bool:
        return isinstance(other, Point) and self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Point({self.steps}, {self.topk}, {self.draft_tokens})"


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(variable: str, value, allow_none: bool = False) -> list:
    """A list of distinct integers >= 1 from an integer or a list (None kept when allowed)."""
    if value is None and allow_none:
        return [None]
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise SweepInputError(variable, "must not be empty; give at least one integer >= 1")
    bad = [item for item in values if not (is_int(item) and item >= 1)]
    if bad:
        raise SweepInputError(variable, f"must hold only integers >= 1, got {bad[0]!r} in {list(values)!r}")
    duplicates = sorted({item for item in values if values.count(item) > 1})
    if duplicates:
        raise SweepInputError(variable, f"lists {duplicates[0]} more than once: {list(values)!r}")
    return list(values)


def tree_candidates(steps: int, topk: int) -> int:
    """Draft tokens the EAGLE tree proposes: topk at the first step, topk * topk at each later one."""
    return topk + (steps - 1) * topk * topk


def resolve_point(steps: int, topk: int, draft_tokens, variable: str, topk_one_collapses: bool = False) -> Point:
    """The point SGLang would run for these flags, or SweepInputError when it rejects or rewrites them."""
    if topk == 1:
        if draft_tokens is None or topk_one_collapses:
            return Point(steps, 1, steps + 1)
        if draft_tokens != steps + 1:
            raise SweepInputError(
                variable,
                f"asks for steps {steps}, top-k 1, draft tokens {draft_tokens}: with top-k 1 SGLang sets draft "
                f"tokens to steps + 1 ({steps + 1}); leave draft tokens unset (null) or use top-k > 1",
            )
        return Point(steps, 1, draft_tokens)
    if draft_tokens is None:
        raise SweepInputError(
            variable, f"needs draft tokens for top-k {topk} (SGLang requires --speculative-num-draft-tokens then)"
        )
    most = tree_candidates(steps, topk) + 1
    if not 2 <= draft_tokens <= most:
        raise SweepInputError(
            variable,
            f"asks for steps {steps}, top-k {topk}, draft tokens {draft_tokens}: with top-k > 1 draft tokens must be "
            f"from 2 to {most} (1 + the {most - 1} candidates the draft tree holds, topk + (steps - 1) * topk^2); "
            "more fails SGLang's load",
        )
    return Point(steps, topk, draft_tokens)


def _product(steps: list, topks: list, drafts: list, variable: str) -> list:
    # In a grid that also has top-k > 1, the draft-token axis is for those; top-k 1 points use steps + 1.
    collapses = any(topk > 1 for topk in topks)
    points = []
    for step, topk, draft in itertools.product(steps, topks, drafts):
        point = resolve_point(step, topk, draft, variable, topk_one_collapses=collapses)
        if point not in points:
            points.append(point)
    return points


def _grid_points(grid) -> list:
    if isinstance(grid, dict):
        unknown = sorted(set(grid) - set(POINT_KEYS))
        if unknown:
            raise SweepInputError("sweep_grid", f"has unknown keys {unknown}; accepted: {', '.join(POINT_KEYS)}")
        if "steps" not in grid:
            raise SweepInputError("sweep_grid", "needs a 'steps' list, e.g. {steps: [2, 3, 4], topk: [1]}")
        return _product(
            _int_list("sweep_grid.steps", grid["steps"]),
            _int_list("sweep_grid.topk", grid.get("topk", 1)),
            _int_list("sweep_grid.draft_tokens", grid.get("draft_tokens"), allow_none=True),
            "sweep_grid",
        )
    if isinstance(grid, list) and grid:
        points = []
        for index, entry in enumerate(grid):
            variable = f"sweep_grid[{index}]"
            if not isinstance(entry, dict) or "steps" not in entry or set(entry) - set(POINT_KEYS):
                raise SweepInputError(
                    variable, f"must be a mapping with 'steps' and optionally 'topk', 'draft_tokens', got {entry!r}"
                )
            step = _int_list(f"{variable}.steps", entry["steps"])
            topk = _int_list(f"{variable}.topk", entry.get("topk", 1))
            draft = _int_list(f"{variable}.draft_tokens", entry.get("draft_tokens"), allow_none=True)
            if len(step) != 1 or len(topk) != 1 or len(draft) != 1:
                raise SweepInputError(variable, "must give one value per key; use the mapping form for a product")
            point = resolve_point(step[0], topk[0], draft[0], variable)
            if point in points:
                raise SweepInputError(variable, f"repeats the point {point.as_dict()} listed before it")
            points.append(point)
        return points
    raise SweepInputError(
        "sweep_grid",
        "must be a mapping of lists ({steps: [...], topk: [...], draft_tokens: [...]}, swept as their product) or a "
        f"non-empty list of points ({{steps: 3, topk: 4, draft_tokens: 8}}), got {grid!r}",
    )


def expand_points(steps=None, topk=1, draft_tokens=None, grid=None) -> list:
    """The sweep's points from ``sweep_steps``/``sweep_topk``/``sweep_draft_tokens`` or from ``sweep_grid``."""
    if grid is not None and steps is not None:
        raise SweepInputError("sweep_grid", "and sweep_steps are both set; set one of them")
    if grid is not None:
        return _grid_points(grid)
    if steps is None:
        raise SweepInputError("sweep_steps", "is not set; give a list of speculative steps such as [1, 2, 3, 4]")
    return _product(
        _int_list("sweep_steps", steps),
        _int_list("sweep_topk", topk),
        _int_list("sweep_draft_tokens", draft_tokens, allow_none=True),
        "sweep_steps",
    )


def check_algorithm(algorithm) -> str:
    """The algorithm the hosts run; it must be one whose steps, top-k and draft tokens SGLang honours."""
    if not isinstance(algorithm, str) or not algorithm.strip():
        raise SweepInputError(
            "sweep_algorithm",
            "is empty and the hosts set no sglang_service_speculative_algorithm; a sweep needs a speculative "
            "algorithm such as EAGLE, EAGLE3 or NEXTN",
        )
    if algorithm.strip().upper() in FIXED_SHAPE_ALGORITHMS:
        raise SweepInputError(
            "sweep_algorithm",
            f"is {algorithm}, for which SGLang fixes steps and top-k itself; sweep an EAGLE-family algorithm "
            "(EAGLE, EAGLE3, NEXTN, STANDALONE)",
        )
    return algorithm.strip()


def check_counts(**values) -> None:
    """Each keyword is a sweep variable name and (value, minimum)."""
    for variable, (value, minimum) in values.items():
        if not (is_int(value) and value >= minimum):
            raise SweepInputError(variable, f"must be an integer >= {minimum}, got {value!r}")


def assign(points: list, hosts: list) -> dict:
    """Point i of ``points`` to host i mod N, in order: {host: [point, ...]} for every host (maybe empty)."""
    if not hosts:
        raise SweepInputError("sweep_hosts", "matches no hosts; name an inventory group or pattern with hosts")
    plan = {host: [] for host in hosts}
    for index, point in enumerate(points):
        plan[hosts[index % len(hosts)]].append(point)
    return plan
