#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sweep_report
short_description: Plan a speculative-decoding sweep, record its load levels and write its reports (controller side)
version_added: 0.1.0
description:
  - The controller-side half of C(llmops.inference.spec_sweep); run it on the controller (C(delegate_to localhost)
    or a play on C(localhost)). It keeps the sweep's results directory O(results_dir).
  - O(action=plan) validates the sweep before any host is touched - the points (O(steps) with O(topk) and
    O(draft_tokens), or O(grid)) against SGLang 0.5.23's own argument checks for the EAGLE family (each rejected
    combination is named with its rule and the SGLang source it follows, in RV(rejected)), the load levels
    O(concurrency), the SLO, the counts, the benchmark options, that the hosts are alike, and that O(results_dir)
    can be written - then starts a run in C(sweep.json), sizes each level's benchmark and time budget, skips the
    point and level pairs already recorded when O(resume) is set, and assigns the points with something left to
    measure to the engines in turn (point I{i} to engine I{i mod N}; an engine is a host, or the hosts of a
    multi-node engine, O(node_groups)). Errors name the playbook variable (C(sweep_*)).
  - O(action=budget) works out one host's load budget - how long a point's restart chain may take until its gate
    passes - from the engine the host runs before the sweep (O(unit_status)), or O(load_timeout).
  - O(action=record) writes one level (O(concurrency_level)) or several (O(levels)) to
    C(points/<point id>/c<concurrency>.json), atomically - several from one M(llmops.inference.sglang_bench) call
    that measured them all (O(benchmark), and O(bench_progress) when that call was cut short), or several failed
    the same way (the point's load failed, O(error), O(not_run)). Once a level failed, the point's heavier levels
    are recorded as not run; RV(stops_point) says why.
  - O(action=record_arm) records one arm of the proof (O(arm), O(round)) at every level (O(levels)), as
    O(action=record) records a point, to C(results-prove/<arm id>/r<round>-c<concurrency>.json).
  - With O(resume), O(action=plan) first records the levels that an interrupted run's benchmarks ended on the hosts
    but that never reached the controller (O(leftover_progress)), so they are not measured again.
  - O(action=report) writes C(results.json) (every level record with its raw runs and timestamps, the per-level
    summary, the best point per level with its margin and spread, the robust and SLA choices, the Pareto frontier,
    each rule in words, this run's timing), C(results.csv) (one row per raw run), C(results.md) (the same as
    tables) and, when matplotlib can be imported, C(results.png) (tok/s against steps per load level) and
    C(results-pareto.png) (tok/s per user against tok/s per GPU, frontier marked).
  - Every report carries the deployable configuration (RV(deployable)) - the static choice with its SGLang
    arguments, and an adaptive config for SGLang's C(--speculative-adaptive --speculative-adaptive-config FILE)
    written to C(results-adaptive-config.json) (keys the load levels, C(candidate_steps) the lossless top-k 1
    points within O(adaptive_margin) of each level's best, other knobs at SGLang's defaults), where each number
    came from in
    C(results-adaptive.csv), C(results.md) and C(results.json); refused with SGLang's reason (RV(adaptive_refused))
    when the swept engines could not run it.
  - Best per level - score = median tok/s - O(mad_penalty) x MAD over the repeat runs, points within O(tolerance)
    of the top score count as equal and the fewest steps (then the lowest top-k, the fewest draft tokens) wins.
    Robust choice - the point with the best worst case, over the load levels, of its median tok/s / that level's
    best. SLA choice - with an SLO, the point with the highest median tok/s at the heaviest level at which it (and
    every lighter level) meets every bound in every run.
author:
  - llmops.inference contributors (@llmops)
requirements:
  - matplotlib on the controller for the plots (optional).
attributes:
  check_mode:
    support: full
    description:
      - Validates and plans but writes nothing; O(action=record) and O(action=report) return what they would write.
  diff_mode:
    support: none
    description: Results are new files; there is no diff.
  idempotent:
    support: none
    description: Each O(action=plan) starts a new run in C(sweep.json).
options:
  action:
    description:
      - What to do; see the description.
    type: str
    required: true
    choices: [plan, budget, record, record_arm, report]
  results_dir:
    description:
      - The sweep's results directory on the controller (absolute path); created when missing.
    type: path
    required: true
  steps:
    description:
      - For O(action=plan). The speculative steps to sweep (an integer or a list), combined with every O(topk) and
        O(draft_tokens). Either this or O(grid).
    type: raw
  topk:
    description:
      - For O(action=plan). Top-k (C(--speculative-eagle-topk)), an integer or a list.
    type: raw
    default: 1
  draft_tokens:
    description:
      - For O(action=plan). Draft tokens (C(--speculative-num-draft-tokens)), an integer or a list. Unset, top-k 1
        points use steps + 1 as SGLang does; top-k > 1 needs it.
    type: raw
  grid:
    description:
      - For O(action=plan). Instead of O(steps) - a mapping of lists C({steps, topk, draft_tokens}) swept as their
        product (top-k 1 points use steps + 1 draft tokens when other top-k values are in the grid), or a list of
        points C({steps, topk, draft_tokens}).
    type: raw
  concurrency:
    description:
      - For O(action=plan). The load levels - requests in flight - at which every point is measured, an integer or
        a list (measured in ascending order on one load of the point). Unset, the single level is
        C(bench.concurrency) (default 8).
    type: raw
  slo:
    description:
      - For O(action=plan). Upper bounds in milliseconds for the SLA choice, keyed by a latency statistic of
        M(llmops.inference.sglang_bench) - C(<mean|median|p90|p95|p99>_<ttft|tpot|itl|e2e_latency>_ms), for
        example C(p99_tpot_ms=30). Empty - no SLA choice.
    type: dict
    default: {}
  algorithm:
    description:
      - For O(action=plan). The speculative algorithm the hosts run (recorded with the results, and checked to be
        one whose steps and top-k SGLang honours).
    type: str
  host_profiles:
    description:
      - For O(action=plan). Per host, the settings that must be alike across the swept hosts (for example model
        path, tensor-parallel size, algorithm, GPUs, C(nnodes)); hosts that differ are an error. The GPU list times
        C(nnodes) (else the TP size) gives the GPUs per engine for tok/s per GPU.
    type: dict
    default: {}
  host_args:
    description:
      - For O(action=plan). Per host, the extra SGLang arguments it launches with (C(sglang_service_extra_args)),
        checked against the points as SGLang would (C(--speculative-use-rejection-sampling),
        C(--attention-backend trtllm_mha) and C(--page-size) > 1 allow only some top-k values) and for
        C(--max-running-requests).
    type: dict
    default: {}
  hosts:
    description:
      - For O(action=plan). The hosts to spread the points over, in order.
    type: list
    elements: str
  node_groups:
    description:
      - For O(action=plan). Per host, the hosts of its multi-node engine (C(sglang_service_node_group)), empty for
        a single-node engine. A multi-node engine restarts as one, so it takes points as one engine and each of
        its hosts gets the engine's points; an engine whose hosts are not all in O(hosts) is an error.
    type: dict
    default: {}
  repeats:
    description:
      - For O(action=plan). Benchmark runs per point and level.
    type: int
    default: 3
  warmup_requests:
    description:
      - For O(action=plan). Warm-up requests before the first level each load measures.
    type: int
    default: 2
  stability_window:
    description:
      - For O(action=plan). Seconds the restart chain watches each point's engine after its first C(/health) 200
        before the point's first level (the chain's O(llmops.inference.sglang_restart#module:stability_window)),
        returned as RV(stability_window). The point's benchmark starts at once after the gate and records an
        engine that exits then as the level's failure, with the journal; a point never becomes the host's
        known-good, which is what the window guards. The final restore keeps the role's window.
    type: int
    default: 0
  bench:
    description:
      - For O(action=plan). Options of M(llmops.inference.sglang_bench) for every run (C(num_prompts) - the
        fewest requests per level and run, C(concurrency) - the level when O(concurrency) is unset,
        C(max_new_tokens), C(prompt_set), C(random_input_len), C(seed), C(request_timeout), C(ignore_eos),
        C(temperature)); recorded so a resumed sweep measures the same way.
    type: dict
    default: {}
  resume:
    description:
      - For O(action=plan). Skip the point and level pairs already recorded in O(results_dir) (which must come from
        a sweep measured the same way; points and levels may be added). Without it, earlier results are moved to
        C(replaced-<time>/) in O(results_dir).
    type: bool
    default: false
  leftover_progress:
    description:
      - For O(action=plan) with O(resume). The progress files (O(llmops.inference.sglang_bench#module:progress_path))
        that the benchmarks of an interrupted run left on the hosts, each as M(ansible.builtin.slurp) returns its
        C(content) (base64) or as JSON text; their C(context) holds the O(action=record) options of the point
        (O(run_id), O(point), O(host), O(point_started_at), O(apply_s), O(load_s), O(gate), O(first_failure)).
      - The levels they hold that ended, belong to an earlier run of O(results_dir), are planned and are not
        recorded yet are recorded first (RV(recovered)); a level cut short is measured again. Files of other
        sweeps are ignored.
    type: list
    elements: str
  retry_failed:
    description:
      - For O(action=plan) with O(resume). Measure the levels recorded as failed (or not run) again.
    type: bool
    default: false
  apply:
    description:
      - For O(action=plan). What the hosts run after the sweep, recorded in C(sweep.json).
    type: str
    choices: [original, best]
    default: original
  mad_penalty:
    description:
      - For O(action=plan); recorded in C(sweep.json), where O(action=report) reads it. How many MADs a point's
        median tok/s loses in its score.
    type: float
    default: 1.0
  tolerance:
    description:
      - For O(action=plan); recorded in C(sweep.json), where O(action=report) reads it. Points within this fraction
        of the top score (or worst ratio, or SLA throughput) count as equal, and the fewest steps wins among them.
    type: float
    default: 0.02
  prove_rounds:
    description:
      - For O(action=report). Rounds of the proof to plan (RV(prove_plan)) - after the grid, each round loads every
        arm once (the derived and SGLang's default adaptive config, the best static setting, no speculation, each
        level's best static point) and measures it at every level, the arms rotated by one each round. 0 plans none.
    type: int
    default: 0
  adaptive_config_path:
    description:
      - For O(action=report). Where the derived adaptive config is on the host that runs the proof; the derived
        arm's drop-in names it.
    type: str
  arm:
    description:
      - For O(action=record_arm). The arm, as RV(prove_plan) gives it (its C(id) names its records).
    type: dict
  round:
    description:
      - For O(action=record_arm). The round of the proof, from 1.
    type: int
  adaptive_margin:
    description:
      - For O(action=plan); recorded in C(sweep.json), where O(action=report) reads it. The adaptive config's
        C(candidate_steps) at each load level are the steps of the lossless top-k 1 points whose median output tok/s
        is within this fraction of that level's best median (a point whose record says C(lossless=false) is left
        out; one without the field counts as lossless).
    type: float
    default: 0.02
  unit_status:
    description:
      - For O(action=budget). The engine unit's properties as C(ansible.builtin.systemd_service) returns them in
        C(status) (C(ActiveState), C(ExecMainStartTimestampMonotonic), C(ActiveEnterTimestampMonotonic)).
    type: dict
  role_wait_s:
    description:
      - For O(action=budget). The role's own probe wait (C(sglang_service_probe_wait_timeout)), the most a budget
        may be.
    type: float
  load_timeout:
    description:
      - For O(action=budget). A fixed load budget in seconds (the playbook's C(sweep_load_timeout)).
    type: float
  run_id:
    description:
      - For O(action=record) and O(action=report). The run, as O(action=plan) returned it.
    type: str
  point:
    description:
      - For O(action=record). The point as O(action=plan) assigned it (C(id), C(steps), C(topk), C(draft_tokens)).
    type: dict
  concurrency_level:
    description:
      - For O(action=record). The load level measured in O(benchmark).
    type: int
  levels:
    description:
      - For O(action=record). Instead of O(concurrency_level) - the point's levels to record, in the order they were
        measured - from O(benchmark) (and O(bench_progress)) when given, else all failed the same way (the point's
        load failed, O(error) or O(not_run)).
    type: list
    elements: int
  host:
    description:
      - For O(action=record). The host that ran the point.
    type: str
  point_started_at:
    description:
      - For O(action=record). When the point's load started (seconds since the epoch, controller clock).
    type: float
  started_at:
    description:
      - For O(action=record). When the level started (seconds since the epoch, controller clock); with O(levels) and
        O(benchmark), when the benchmark's task started (a level that ended keeps its own times from the benchmark,
        on the host's clock).
    type: float
  finished_at:
    description:
      - For O(action=record). When the level ended (seconds since the epoch, controller clock); with O(levels) and
        O(benchmark), when the benchmark's task ended.
    type: float
  apply_s:
    description:
      - For O(action=record). Seconds writing the point's drop-in took.
    type: float
  load_s:
    description:
      - For O(action=record). Seconds the restart chain took for the point.
    type: float
  gate:
    description:
      - For O(action=record). The restart chain's verdict (C(sglang_service_gate) of the C(sglang_service) role).
    type: dict
  benchmark:
    description:
      - For O(action=record). The level's M(llmops.inference.sglang_bench) result (its C(runs) are the repeats).
      - With O(levels), the result of the one M(llmops.inference.sglang_bench) call with
        O(llmops.inference.sglang_bench#module:levels) that measured them, whose
        RV(llmops.inference.sglang_bench#module:levels) are recorded when it ended by itself; when its task failed or
        timed out, that failure is recorded for the first level without a result (the levels that ended before come
        from O(bench_progress)), and the later ones as not run.
    type: dict
  bench_progress:
    description:
      - For O(action=record) with O(levels) and O(benchmark). The progress file of that benchmark
        (O(llmops.inference.sglang_bench#module:progress_path)) as M(ansible.builtin.slurp) returns its C(content)
        (base64), or as JSON text - read when the benchmark's task did not return the levels itself (it timed out).
        The level under way then is recorded from the time the file says it started.
    type: str
  lossless:
    description:
      - For O(action=record). The point's losslessness as M(llmops.inference.sglang_reference) scored it
        (C(lossless) true, false or null, C(detail)). A point that is not lossless is shown as such in every report and
        plot and never chosen as best, robust or SLA point.
    type: dict
  first_failure:
    description:
      - For O(action=record). Why the point's first load failed, when it was loaded once more (the sweep's
        C(sweep_retry_failed_load)).
    type: str
  error:
    description:
      - For O(action=record). A task failure that ended the point (then its levels are recorded as failed with this
        reason).
    type: str
  not_run:
    description:
      - For O(action=record). Why the levels were not measured (the point failed at a lighter level).
    type: str
  journal:
    description:
      - For O(action=record). The unit's last journal lines, kept with a failed level.
    type: list
    elements: str
  api_key:
    description:
      - "For O(action=record). The server's API key; it is masked, with the API-key forms (C(api_key='...'),
        C(--api-key ...), C(api-key: ...), C(Authorization: Bearer ...)) whatever their value, in everything
        recorded (O(journal), O(error), O(gate), O(benchmark)) and returned."
    type: str
  plot:
    description:
      - For O(action=report). Write the plots when matplotlib can be imported.
    type: bool
    default: true
seealso:
  - module: llmops.inference.sglang_bench
"""

EXAMPLES = r"""
- name: Plan a sweep of steps 1 to 6 at three load levels over the group's hosts
  llmops.inference.sweep_report:
    action: plan
    results_dir: /srv/sweeps/qwen-eagle
    steps: [1, 2, 3, 4, 5, 6]
    concurrency: [1, 8, 32]
    slo: {p99_tpot_ms: 30}
    algorithm: EAGLE
    hosts: "{{ query('inventory_hostnames', 'sglang') }}"
    repeats: 3
    bench: {num_prompts: 32, max_new_tokens: 256}
    resume: true
  delegate_to: localhost
  run_once: true
  register: plan

- name: Write the reports
  llmops.inference.sweep_report:
    action: report
    results_dir: /srv/sweeps/qwen-eagle
    run_id: "{{ plan.run_id }}"
  delegate_to: localhost
  run_once: true
  register: report
"""

RETURN = r"""
run_id:
  description: The run's id (O(action=plan)); pass it to O(action=record) and O(action=report).
  returned: success
  type: str
points:
  description: Every point of the sweep, in order (O(action=plan)).
  returned: success
  type: list
  elements: dict
  sample: [{"id": "steps003-topk01-draft004", "steps": 3, "topk": 1, "draft_tokens": 4}]
levels:
  description:
    - The load levels with their benchmark size and budget (O(action=plan)) - C(concurrency), C(num_prompts) (per
      run), C(waves) and C(budget_s), the most the level's benchmark task may take.
  returned: success
  type: list
  elements: dict
  sample: [{"concurrency": 8, "num_prompts": 32, "waves": 13, "budget_s": 1590.0}]
done:
  description: Ids of the points skipped because every level is recorded (O(action=plan) with O(resume)).
  returned: success
  type: list
  elements: str
partial:
  description: Per point with some levels recorded, those levels; only the others are measured (O(action=plan)).
  returned: success
  type: dict
assignment:
  description:
    - Per host, the points it runs in this run (O(action=plan)), each with the C(levels) left to measure as
      M(llmops.inference.sglang_bench) takes them in O(llmops.inference.sglang_bench#module:levels) (C(concurrency),
      C(num_prompts), C(budget_s)) and C(budget_s), the sum of their budgets - the most the point's benchmark task may
      take. The hosts of a multi-node engine share its points.
  returned: success
  type: dict
definition:
  description: What is swept and how it is measured, as written to C(sweep.json) (O(action=plan)).
  returned: success
  type: dict
stability_window:
  description: The stability window of every point's restart chain, in seconds (O(action=plan)).
  returned: success
  type: int
  sample: 0
adaptive_refused:
  description:
    - Why SGLang would not run adaptive speculative decoding on the swept engines (O(action=plan)), in SGLang's words
      (C(adaptive_unsupported_reason) - only EAGLE/EAGLE3, top-k 1, no attention DP, no multi-layer EAGLE, no
      two-batch overlap, no PD multiplexing) - C(reason), and C(host) when a host's extra arguments are why; null
      when it would. The sweep still measures and reports the static choice.
  returned: success
  type: dict
deployable:
  description:
    - What a deploy takes from the sweep (O(action=report)) - C(static) (C(rule), C(point), C(args) - its SGLang
      arguments, C(source)) and C(adaptive) (C(config) - the adaptive config keyed by load level, written to
      C(results-adaptive-config.json), null when refused or nothing qualifies; C(entries) - per level the best point and
      every candidate with its median, ratio to the best and host, the points left out and why; C(margin),
      C(refused), C(reason), C(knobs), C(source)), and C(sglang_default_config) (SGLang's built-in default).
  returned: success
  type: dict
prove_plan:
  description:
    - The proof's measuring order (O(action=report) with O(prove_rounds)) - C(round) and C(arm) (C(id), C(kind),
      C(role), C(dropin) - the speculative point it is applied as).
  returned: success
  type: list
  elements: dict
proof:
  description:
    - The proof (O(action=report), null until arms are recorded) - per arm and level the median over the rounds of
      its output tok/s over the level's best static point's in the same round (C(ratio), C(low), C(high),
      C(rounds), C(target), C(verdict) - meets, misses or inconclusive when the spread crosses the target), and
      C(averaged) - the derived adaptive setting against the best static setting and against SGLang's default
      adaptive config, averaged over the levels.
  returned: success
  type: dict
level_warnings:
  description: Load levels that SGLang would not run at their nominal concurrency (O(action=plan)).
  returned: success
  type: list
  elements: str
rejected:
  description:
    - On failure of O(action=plan), the combinations SGLang would reject or rewrite - C(point), C(rule),
      C(reason) and C(source) (the file of the SGLang 0.5.23 wheel the rule follows).
  returned: failure
  type: list
  elements: dict
recovered:
  description:
    - Per point, the levels recorded from O(leftover_progress) (O(action=plan) with O(resume)); they count as
      recorded in RV(done) and RV(partial).
  returned: success
  type: dict
  sample: {"steps004-topk01-draft005": [1, 8]}
replaced:
  description: Where earlier results were moved (O(action=plan) without O(resume)), or null.
  returned: success
  type: str
load_budget_s:
  description: The host's load budget in seconds (O(action=budget)); null - the role's own probe wait.
  returned: success
  type: float
last_load_s:
  description: The host's last load, fork to active, in seconds (O(action=budget)), or null.
  returned: success
  type: float
source:
  description: How RV(load_budget_s) was worked out (O(action=budget)).
  returned: success
  type: str
records:
  description: The level records written (O(action=record)).
  returned: success
  type: list
  elements: dict
status:
  description: C(measured) or C(failed), of the (first) level recorded (O(action=record)).
  returned: success
  type: str
stops_point:
  description:
    - When a level failed - why the point's heavier levels are recorded as not run, their reason (O(action=record)).
  returned: success
  type: str
summary:
  description:
    - One row per point and level (O(action=report)) - medians and MAD of output tok/s, score, tok/s per user and
      per GPU, accept length, latency percentiles, status, stage, reason.
  returned: success
  type: list
  elements: dict
best_per_level:
  description:
    - Per load level (O(action=report)) - C(best) and C(runner_up) (point, median, MAD, runs, host), C(margin_tok_s),
      C(margin_pct), C(spread_source), C(clear) (the margin exceeds both MADs together).
  returned: success
  type: list
  elements: dict
robust_choice:
  description:
    - The robust choice (O(action=report)) - C(point) (with C(worst_ratio), C(worst_at), C(ratios) per level), every
      C(candidates) entry, C(reason) when there is none.
  returned: success
  type: dict
sla_choice:
  description:
    - The SLA choice (O(action=report)), null without an SLO - C(slo), C(point) (with C(heaviest_concurrency),
      C(output_throughput_median), C(values)), C(candidates), C(reason) when no point meets the SLO.
  returned: success
  type: dict
choice:
  description:
    - What C(sweep_apply=best) applies (O(action=report)) - C(rule) (C(sla) with an SLO, else C(robust)),
      C(point) (null - nothing qualifies) and C(reason).
  returned: success
  type: dict
pareto:
  description:
    - Every measured point and level as C(output_throughput_per_user) and C(output_throughput_per_gpu), with
      C(frontier) true on the Pareto frontier (O(action=report)).
  returned: success
  type: list
  elements: dict
timing:
  description:
    - This run's timing (O(action=report)) - C(sweep_wall_s) (first load start to last level end, all hosts),
      C(engine_time_s) (each load's fork-to-ready from the engine's log plus every level's benchmark) and
      C(engine_ratio) (their quotient, also C(per_host)), C(load_bench_sum_s) and C(overhead_ratio) (the same with
      the restart chains' time), C(engine_loads) and C(loads_per_point) (engine processes that served measured
      levels), C(run_wall_s) (plan to report).
  returned: success
  type: dict
files:
  description:
    - The report files written (O(action=report)), by kind (C(json), C(csv), C(markdown), C(png), C(pareto_png),
      C(adaptive_config) - C(results-adaptive-config.json), C(adaptive_csv) - C(results-adaptive.csv), where each
      candidate step came from, C(proof_csv) - C(results-proof.csv), the proof's figures).
  returned: success
  type: dict
plot_skipped:
  description: Why no plot was written, or null.
  returned: success
  type: str
"""

import json  # noqa: E402 - Ansible modules import after their docs
import os  # noqa: E402
import secrets  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.llmops.inference.plugins.module_utils.sweep_actions import (  # noqa: E402
    host_budget,
    plan_sweep,
    record_arm,
    record_levels,
    write_reports,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_adaptive import DEFAULT_ADAPTIVE_MARGIN  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError  # noqa: E402


def _optional(kind, *names):
    return {name: {"type": kind} for name in names}


ARGUMENT_SPEC = {
    "action": {"type": "str", "required": True, "choices": ["plan", "budget", "record", "record_arm", "report"]},
    "results_dir": {"type": "path", "required": True},
    "steps": {"type": "raw"},
    "topk": {"type": "raw", "default": 1},
    "draft_tokens": {"type": "raw", "no_log": False},
    "grid": {"type": "raw"},
    "concurrency": {"type": "raw"},
    "slo": {"type": "dict", "default": {}},
    "algorithm": {"type": "str"},
    "host_profiles": {"type": "dict", "default": {}},
    "host_args": {"type": "dict", "default": {}},
    "hosts": {"type": "list", "elements": "str"},
    "node_groups": {"type": "dict", "default": {}},
    "repeats": {"type": "int", "default": 3},
    "warmup_requests": {"type": "int", "default": 2},
    "stability_window": {"type": "int", "default": 0},
    "bench": {"type": "dict", "default": {}},
    "resume": {"type": "bool", "default": False},
    "retry_failed": {"type": "bool", "default": False},
    "apply": {"type": "str", "default": "original", "choices": ["original", "best"]},
    "mad_penalty": {"type": "float", "default": 1.0},
    "tolerance": {"type": "float", "default": 0.02},
    "adaptive_margin": {"type": "float", "default": DEFAULT_ADAPTIVE_MARGIN},
    "levels": {"type": "list", "elements": "int"},
    "journal": {"type": "list", "elements": "str"},
    "leftover_progress": {"type": "list", "elements": "str"},
    "concurrency_level": {"type": "int"},
    "arm": {"type": "dict"},
    "round": {"type": "int"},
    "prove_rounds": {"type": "int", "default": 0},
    "adaptive_config_path": {"type": "str"},
    # What one action reads about a host or a point, each optional and with no default.
    **_optional("dict", "unit_status", "point", "gate", "benchmark", "lossless"),
    **_optional("str", "run_id", "host", "error", "not_run", "first_failure", "bench_progress"),
    **_optional("float", "role_wait_s", "load_timeout", "apply_s", "load_s"),
    **_optional("float", "point_started_at", "started_at", "finished_at"),
    "api_key": {"type": "str", "no_log": True},
    "plot": {"type": "bool", "default": True},
}
REQUIRED_BY_ACTION = {
    "plan": ["hosts"],
    "budget": [],
    "record": ["run_id", "point", "host", "started_at", "finished_at"],
    "record_arm": ["run_id", "arm", "round", "host", "started_at", "finished_at"],
    "report": [],
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = dict(module.params)
    action = params["action"]
    missing = [name for name in REQUIRED_BY_ACTION[action] if params[name] is None]
    if missing:
        module.fail_json(msg=f"action={action} needs {', '.join(missing)}", changed=False)
    write = not module.check_mode and action != "budget"
    try:
        if action == "plan":
            run = {"run_id": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)}
            result = plan_sweep(params, run, time.time(), write=write)
            msg = (
                f"{len(result['points'])} point(s), {len(result['done'])} already recorded, "
                f"{sum(len(points) for points in result['assignment'].values())} to run on "
                f"{len(result['assignment'])} host(s)"
            )
        elif action == "budget":
            result = host_budget(params)
            shown = "the role's probe wait" if result["load_budget_s"] is None else f"{result['load_budget_s']:.0f} s"
            msg = f"load budget {shown} ({result['source']})"
        elif action == "record_arm":
            result = record_arm(params, write=write)
            outcomes = ", ".join(
                f"concurrency {record['concurrency']} {record['status']}" for record in result["records"]
            )
            msg = f"arm {params['arm'].get('id')}, round {params['round']}: {outcomes}"
        elif action == "record":
            result = record_levels(dict(params, concurrency=params["concurrency_level"]), write=write)
            outcomes = ", ".join(
                f"concurrency {record['concurrency']} {'not run' if record['stage'] == 'not run' else record['status']}"
                for record in result["records"]
            )
            msg = f"point {params['point'].get('id')}: {outcomes}"
        else:
            result = write_reports(params, time.time(), write=write)
            choice = result["choice"]
            picked = choice["point"]["id"] if choice["point"] else f"none ({choice['reason']})"
            msg = f"{choice['rule']} choice: {picked}"
    except SweepInputError as exc:
        module.fail_json(msg=str(exc), variable=exc.variable, rejected=exc.rejected, changed=False)
    except OSError as exc:
        module.fail_json(msg=f"results_dir {params['results_dir']}: {exc}", changed=False)
    result["results_dir"] = os.path.normpath(params["results_dir"])
    # JSON round trip: the result holds only plain data, and Ansible should see exactly what the files hold.
    module.exit_json(msg=msg, changed=write, **json.loads(json.dumps(result)))


if __name__ == "__main__":
    main()
