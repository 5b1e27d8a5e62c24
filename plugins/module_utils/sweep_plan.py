# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Plan a speculative-decoding sweep: expand and validate the points and load levels, size each level's
benchmark and its time budget, and spread the points over the engines (a host, or a multi-node engine's hosts).

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.
Every error is a SweepInputError naming the playbook variable (``sweep_*``) and what is accepted, so
playbooks/spec_sweep.yml can stop before any host restarts.

The point rules are SGLang 0.5.23's own for the EAGLE family; each rejected combination names the point,
the rule and the file of the wheel it comes from (paths inside the ``sglang`` package):

- ``topk1-draft``: with top-k 1 SGLang sets draft tokens to steps + 1 whatever was asked
  (``srt/arg_groups/speculative_hook.py``, ``_handle_eagle_family``: "speculative_num_draft_tokens is
  adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"), so the point would be measured
  as another point than it claims;
- ``topk-needs-draft``: with top-k > 1 nothing sets draft tokens (``_handle_eagle_family`` only fills them in
  for top-k 1 or when steps, top-k and draft tokens are all unset), and the EAGLE worker sizes its verify
  step by them (``srt/speculative/eagle_worker_v2.py``);
- ``draft-above-tree``: the draft tree proposes topk tokens at the first step and topk * topk at each later one
  (``srt/speculative/spec_utils.py``, ``select_top_k_tokens``), and ``organize_draft_results``
  (``srt/speculative/eagle_utils.py``) keeps the best ``draft_tokens - 1`` of them with ``torch.topk``: more
  than topk + (steps - 1) * topk^2 fails the load ("selected index k out of range");
- ``draft-below-two``: one draft token verifies no drafted token at all (a sweep's own rule: nothing to
  measure);
- ``needs-steps``: top-k or draft tokens without steps fail SGLang's assertion in ``_handle_eagle_family``
  (``assert speculative_eagle_topk is None and speculative_num_draft_tokens is None``);
- with the hosts' extra arguments: ``rejection-sampling-topk`` (``--speculative-use-rejection-sampling
  requires --speculative-eagle-topk=1``), ``trtllm-mha-topk`` ("trtllm_mha backend only supports topk = 1")
  and ``paged-tree-backend`` (top-k > 1 with ``--page-size`` > 1 only on flashinfer, fa3 or triton), all in
  ``_handle_eagle_family``;
- NGRAM, DFLASH and DSPARK force their own steps and top-k (``_handle_ngram``, ``_handle_dflash``,
  ``_handle_dspark``), so there is nothing to sweep.
"""

from __future__ import annotations

import itertools
import math

from ansible_collections.llmops.inference.plugins.module_utils.rollout import engines

FIXED_SHAPE_ALGORITHMS = ("NGRAM", "DFLASH", "DSPARK")
POINT_KEYS = ("steps", "topk", "draft_tokens")
HOOK = "srt/arg_groups/speculative_hook.py _handle_eagle_family"
RULE_SOURCES = {
    "topk1-draft": HOOK,
    "topk-needs-draft": f"{HOOK}; srt/speculative/eagle_worker_v2.py",
    "draft-above-tree": "srt/speculative/eagle_utils.py organize_draft_results; srt/speculative/spec_utils.py",
    "draft-below-two": "the sweep's own rule",
    "needs-steps": HOOK,
    "rejection-sampling-topk": HOOK,
    "trtllm-mha-topk": HOOK,
    "paged-tree-backend": HOOK,
}
# SGLang's backends that can run a draft tree on paged KV (speculative_hook.py, _PAGE_TREE_SPEC_BACKENDS).
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
# With speculative decoding SGLang caps running requests at 48 unless --max-running-requests is given
# (speculative_hook.py, _handle_eagle_family); a heavier level queues the rest.
SPECULATIVE_MAX_RUNNING_REQUESTS = 48
# SLO bounds name a latency statistic of sglang_bench, in milliseconds.
SLO_STATS = ("mean", "median", "p90", "p95", "p99")
SLO_LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")
SLO_KEYS = tuple(f"{stat}_{name}_ms" for stat in SLO_STATS for name in SLO_LATENCIES)
# Seconds a level may take beyond its requests: the module's start over SSH, its client pool, the engine readings.
LEVEL_START_MARGIN_S = 30.0


class SweepInputError(ValueError):
    """A bad sweep variable; ``variable`` names it, ``rejected`` lists refused points (if any)."""

    def __init__(self, variable: str, message: str, rejected: list | None = None):
        self.variable = variable
        self.rejected = rejected or []
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
        return point_id(self.steps, self.topk, self.draft_tokens)

    def as_dict(self) -> dict:
        return {"id": self.id, "steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens}

    def __eq__(self, other) -> bool:
        return isinstance(other, Point) and self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Point({self.steps}, {self.topk}, {self.draft_tokens})"


class Rejection(ValueError):
    """A combination SGLang would refuse or rewrite: which one, the rule's name, and why."""

    def __init__(self, steps, topk, draft_tokens, rule: str, why: str):
        self.point = {"steps": steps, "topk": topk, "draft_tokens": draft_tokens}
        self.rule = rule
        self.why = why
        super().__init__(f"{describe(steps, topk, draft_tokens)}: {why} [{rule}: {RULE_SOURCES[rule]}]")

    def as_dict(self) -> dict:
        return {"point": self.point, "rule": self.rule, "reason": self.why, "source": RULE_SOURCES[self.rule]}


def point_id(steps: int, topk: int, draft_tokens: int) -> str:
    return f"steps{steps:03d}-topk{topk:02d}-draft{draft_tokens:03d}"


def describe(steps, topk, draft_tokens) -> str:
    draft = "unset" if draft_tokens is None else draft_tokens
    return f"steps {steps}, top-k {topk}, draft tokens {draft}"


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


def resolve_point(steps: int, topk: int, draft_tokens, topk_one_collapses: bool = False) -> Point:
    """The point SGLang would run for these flags, or Rejection when it refuses or rewrites them."""
    if topk == 1:
        if draft_tokens is None or topk_one_collapses:
            return Point(steps, 1, steps + 1)
        if draft_tokens != steps + 1:
            raise Rejection(
                steps,
                topk,
                draft_tokens,
                "topk1-draft",
                f"with top-k 1 SGLang sets draft tokens to steps + 1 ({steps + 1}); leave draft tokens unset (null) "
                "or use top-k > 1",
            )
        return Point(steps, 1, draft_tokens)
    if draft_tokens is None:
        raise Rejection(
            steps,
            topk,
            draft_tokens,
            "topk-needs-draft",
            f"top-k {topk} needs draft tokens (--speculative-num-draft-tokens): SGLang sets them only for top-k 1",
        )
    most = tree_candidates(steps, topk) + 1
    if draft_tokens > most:
        raise Rejection(
            steps,
            topk,
            draft_tokens,
            "draft-above-tree",
            f"draft tokens larger than the EAGLE tree offers: at most {most} (1 + the {most - 1} candidates of "
            "topk + (steps - 1) * topk^2); more fails SGLang's load",
        )
    if draft_tokens < 2:
        raise Rejection(steps, topk, draft_tokens, "draft-below-two", "one draft token verifies no drafted token")
    return Point(steps, topk, draft_tokens)


def _rejected(variable: str, rejections: list) -> SweepInputError:
    lines = "; ".join(str(rejection) for rejection in rejections)
    return SweepInputError(
        variable,
        f"has {len(rejections)} combination(s) SGLang 0.5.23 would reject or rewrite, so the sweep stops before "
        f"any host changes: {lines}",
        rejected=[rejection.as_dict() for rejection in rejections],
    )


def _product(steps: list, topks: list, drafts: list, variable: str) -> list:
    # In a grid that also has top-k > 1, the draft-token axis is for those; top-k 1 points use steps + 1.
    collapses = any(topk > 1 for topk in topks)
    points, rejections = [], []
    for step, topk, draft in itertools.product(steps, topks, drafts):
        try:
            point = resolve_point(step, topk, draft, topk_one_collapses=collapses)
        except Rejection as rejection:
            rejections.append(rejection)
            continue
        if point not in points:
            points.append(point)
    if rejections:
        raise _rejected(variable, rejections)
    return points


def _grid_entry(variable: str, entry) -> tuple:
    if not isinstance(entry, dict) or set(entry) - set(POINT_KEYS):
        raise SweepInputError(
            variable, f"must be a mapping with 'steps' and optionally 'topk', 'draft_tokens', got {entry!r}"
        )
    if "steps" not in entry:
        raise SweepInputError(
            variable,
            f"gives top-k or draft tokens without steps ({entry!r}); SGLang refuses that (an assertion in {HOOK})",
        )
    step = _int_list(f"{variable}.steps", entry["steps"])
    topk = _int_list(f"{variable}.topk", entry.get("topk", 1))
    draft = _int_list(f"{variable}.draft_tokens", entry.get("draft_tokens"), allow_none=True)
    if len(step) != 1 or len(topk) != 1 or len(draft) != 1:
        raise SweepInputError(variable, "must give one value per key; use the mapping form for a product")
    return step[0], topk[0], draft[0]


def _grid_points(grid) -> list:
    if isinstance(grid, dict):
        unknown = sorted(set(grid) - set(POINT_KEYS))
        if unknown:
            raise SweepInputError("sweep_grid", f"has unknown keys {unknown}; accepted: {', '.join(POINT_KEYS)}")
        if "steps" not in grid:
            raise SweepInputError(
                "sweep_grid",
                "needs a 'steps' list, e.g. {steps: [2, 3, 4], topk: [1]} (top-k or draft tokens without steps fail "
                f"an assertion in SGLang's {HOOK})",
            )
        return _product(
            _int_list("sweep_grid.steps", grid["steps"]),
            _int_list("sweep_grid.topk", grid.get("topk", 1)),
            _int_list("sweep_grid.draft_tokens", grid.get("draft_tokens"), allow_none=True),
            "sweep_grid",
        )
    if isinstance(grid, list) and grid:
        points, rejections = [], []
        for index, entry in enumerate(grid):
            variable = f"sweep_grid[{index}]"
            steps, topk, draft = _grid_entry(variable, entry)
            try:
                point = resolve_point(steps, topk, draft)
            except Rejection as rejection:
                rejections.append(rejection)
                continue
            if point in points:
                raise SweepInputError(variable, f"repeats the point {point.as_dict()} listed before it")
            points.append(point)
        if rejections:
            raise _rejected("sweep_grid", rejections)
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


def _flag_value(args: list, flag: str):
    """The value of ``--flag V`` or ``--flag=V`` in an argument list (the last one wins), or None."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def check_host_args(points: list, host_args: dict) -> None:
    """Reject points that the hosts' own SGLang arguments (``sglang_service_extra_args``) make invalid."""
    rejections = []
    for host, args in sorted((host_args or {}).items()):
        args = [str(arg) for arg in args or []]
        backend = _flag_value(args, "--attention-backend")
        page_size = _flag_value(args, "--page-size")
        rules = []
        if "--speculative-use-rejection-sampling" in args:
            rules.append(("rejection-sampling-topk", "--speculative-use-rejection-sampling requires top-k 1"))
        if backend == "trtllm_mha":
            rules.append(("trtllm-mha-topk", "the trtllm_mha attention backend only supports top-k 1"))
        if page_size is not None and page_size.isdigit() and int(page_size) > 1 and backend is not None:
            if backend not in PAGE_TREE_BACKENDS:
                rules.append(
                    (
                        "paged-tree-backend",
                        f"top-k > 1 with --page-size {page_size} needs one of {', '.join(PAGE_TREE_BACKENDS)}, "
                        f"not --attention-backend {backend}",
                    )
                )
        for point in points:
            if point.topk > 1:
                for rule, why in rules:
                    rejections.append(Rejection(point.steps, point.topk, point.draft_tokens, rule, f"{host}: {why}"))
    if rejections:
        raise _rejected("sweep_hosts' sglang_service_extra_args", rejections)


def check_levels(concurrency) -> list:
    """The load levels (``sweep_concurrency``): distinct integers >= 1, measured in ascending order."""
    return sorted(_int_list("sweep_concurrency", concurrency))


def check_slo(slo) -> dict:
    """``sweep_slo``: {latency statistic in ms: upper bound > 0}, e.g. {p99_tpot_ms: 30}; {} or None: no SLO."""
    if slo in (None, {}):
        return {}
    if not isinstance(slo, dict):
        raise SweepInputError("sweep_slo", f"must be a mapping such as {{p99_tpot_ms: 30}}, got {slo!r}")
    unknown = sorted(set(slo) - set(SLO_KEYS))
    if unknown:
        raise SweepInputError(
            "sweep_slo",
            f"has unknown keys {unknown}; accepted: <stat>_<latency>_ms with stat one of {', '.join(SLO_STATS)} and "
            f"latency one of {', '.join(SLO_LATENCIES)} (for example p99_tpot_ms, p99_ttft_ms)",
        )
    bad = {key: value for key, value in slo.items() if isinstance(value, bool) or not isinstance(value, (int, float))}
    bad.update({key: value for key, value in slo.items() if key not in bad and not value > 0})
    if bad:
        key = sorted(bad)[0]
        raise SweepInputError(f"sweep_slo.{key}", f"must be a number of milliseconds > 0, got {bad[key]!r}")
    return {key: float(value) for key, value in sorted(slo.items())}


def level_plan(levels: list, bench: dict, repeats: int, warmup_requests: int) -> list:
    """Each load level's benchmark and its time budget.

    A level at concurrency C sends max(num_prompts, C) requests (SGLang's bench_speculative.py sends
    max(num_prompts, batch size)), at most C in flight, ``repeats`` times; the first level a load measures is
    preceded by the warm-up. Its budget is the time those requests may take when each one runs for the whole
    ``request_timeout``: (ceil(warm-up / C) + repeats * ceil(requests / C)) * request_timeout, plus
    LEVEL_START_MARGIN_S for the module's start. sglang_bench ends the level at its budget, and the point's one
    benchmark task of all its levels may take the sum of theirs; a level that hangs ends sooner, one
    request_timeout after its first stuck request (sglang_bench's stop_on_failure).
    """
    timeout = float(bench["request_timeout"])
    plan = []
    for concurrency in levels:
        requests = max(bench["num_prompts"], concurrency)
        waves = math.ceil(warmup_requests / concurrency) + repeats * math.ceil(requests / concurrency)
        plan.append(
            {
                "concurrency": concurrency,
                "num_prompts": requests,
                "waves": waves,
                "budget_s": waves * timeout + LEVEL_START_MARGIN_S,
            }
        )
    return plan


def level_warnings(levels: list, host_args: dict) -> list:
    """Levels SGLang would not run at their nominal concurrency: above its speculative cap of running requests."""
    capped = [
        host
        for host, args in sorted((host_args or {}).items())
        if _flag_value([str(arg) for arg in args or []], "--max-running-requests") is None
    ]
    heavy = [level for level in levels if level > SPECULATIVE_MAX_RUNNING_REQUESTS]
    if not heavy or not capped:
        return []
    return [
        f"sweep_concurrency {heavy}: with speculative decoding SGLang runs at most "
        f"{SPECULATIVE_MAX_RUNNING_REQUESTS} requests at once unless --max-running-requests is set "
        f"({HOOK}); on {', '.join(capped)} the rest queue, so those levels measure queueing as well"
    ]


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
            f"is {algorithm}, for which SGLang fixes steps and top-k itself (srt/arg_groups/speculative_hook.py); "
            "sweep an EAGLE-family algorithm (EAGLE, EAGLE3, NEXTN, STANDALONE)",
        )
    return algorithm.strip()


def check_counts(**values) -> None:
    """Each keyword is a sweep variable name and (value, minimum)."""
    for variable, (value, minimum) in values.items():
        if not (is_int(value) and value >= minimum):
            raise SweepInputError(variable, f"must be an integer >= {minimum}, got {value!r}")


def assign(points: list, hosts: list, node_groups: dict | None = None) -> dict:
    """Point i of ``points`` to engine i mod N, in order: {host: [point, ...]} for every host (maybe empty).

    An engine is one host, or the hosts of a multi-node engine (``node_groups``: host -> its group's members), which
    restarts as one: each of its hosts gets the engine's points. A group swept only in part is an error."""
    if not hosts:
        raise SweepInputError("sweep_hosts", "matches no hosts; name an inventory group or pattern with hosts")
    units = engines(hosts, node_groups or {})
    for unit in units:
        missing = [member for member in (node_groups or {}).get(unit[0]) or [] if member not in unit]
        if missing:
            raise SweepInputError(
                "sweep_hosts",
                f"holds {', '.join(unit)} but not {', '.join(missing)} of the multi-node engine "
                f"{', '.join(node_groups[unit[0]])}: a point restarts the whole engine, so sweep all its hosts or none",
            )
    shares = [[] for _unit in units]
    for index, point in enumerate(points):
        shares[index % len(units)].append(point)
    return {host: share for unit, share in zip(units, shares) for host in unit}


# A point's load budget when the host's last load is known: LOAD_BUDGET_FACTOR x that load + LOAD_BUDGET_MARGIN_S,
# at least LOAD_BUDGET_FLOOR_S.
LOAD_BUDGET_FACTOR = 2.0
LOAD_BUDGET_MARGIN_S = 60.0
LOAD_BUDGET_FLOOR_S = 120.0


def last_load_s(unit_status: dict) -> float | None:
    """Seconds the unit's running engine took from its fork to turning active (systemd's own timestamps), or
    None when the unit is not active or systemd recorded no such start."""
    status = unit_status or {}
    if status.get("ActiveState") != "active":
        return None
    try:
        forked = int(status.get("ExecMainStartTimestampMonotonic") or 0)
        active = int(status.get("ActiveEnterTimestampMonotonic") or 0)
    except (TypeError, ValueError):
        return None
    if not forked or active < forked:
        return None
    return (active - forked) / 1e6


def load_budget(unit_status: dict, role_wait_s=None, fixed=None) -> dict:
    """How long a point's restart chain may take from its start until the gate passes (the probe gate's wait).

    ``fixed`` (``sweep_load_timeout``) wins. Otherwise, from the host's last load L (fork to active, as systemd
    recorded it for the engine running before the sweep): max(LOAD_BUDGET_FLOOR_S, LOAD_BUDGET_FACTOR x L +
    LOAD_BUDGET_MARGIN_S), never more than the role's own wait (``role_wait_s``, sglang_service_probe_wait_timeout).
    Without a known L the role's wait applies (``load_budget_s`` None: the role's default).
    """
    if fixed is not None:
        if isinstance(fixed, bool) or not isinstance(fixed, (int, float)) or fixed <= 0:
            raise SweepInputError("sweep_load_timeout", f"must be a number of seconds > 0, got {fixed!r}")
        return {"load_budget_s": float(fixed), "last_load_s": last_load_s(unit_status), "source": "sweep_load_timeout"}
    last = last_load_s(unit_status)
    if last is None:
        budget = float(role_wait_s) if role_wait_s else None
        return {"load_budget_s": budget, "last_load_s": None, "source": "the role's probe wait (no earlier load known)"}
    budget = max(LOAD_BUDGET_FLOOR_S, LOAD_BUDGET_FACTOR * last + LOAD_BUDGET_MARGIN_S)
    if role_wait_s:
        budget = min(budget, float(role_wait_s))
    return {
        "load_budget_s": budget,
        "last_load_s": last,
        "source": f"max({LOAD_BUDGET_FLOOR_S:g}, {LOAD_BUDGET_FACTOR:g} x the last load {last:.1f} s + "
        f"{LOAD_BUDGET_MARGIN_S:g}), at most the role's probe wait",
    }
