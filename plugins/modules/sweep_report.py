#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sweep_report
short_description: Plan a speculative-decoding sweep, record its points and write its reports (controller side)
version_added: 0.1.0
description:
  - The controller-side half of C(llmops.inference.spec_sweep); run it on the controller (C(delegate_to localhost)
    or a play on C(localhost)). It keeps the sweep's results directory O(results_dir).
  - O(action=plan) validates the sweep before any host is touched - the points (O(steps) with O(topk) and
    O(draft_tokens), or O(grid)) against SGLang's rules for the EAGLE family, the counts, the benchmark
    options, that the hosts are alike, and that O(results_dir) can be written - then starts a run in
    C(sweep.json), skips the points already recorded when O(resume) is set, and assigns the others to the
    hosts in turn (point I{i} to host I{i mod N}). Errors name the playbook variable (C(sweep_*)).
  - O(action=record) writes one finished point (measured, or failed with its reason and the journal's tail)
    to C(points/<id>.json), atomically, as soon as the point ends.
  - O(action=report) writes C(results.json) (every raw benchmark run, the per-point summary, the best point,
    this run's timing), C(results.csv) (one row per raw run), C(results.md) (a table with the median and MAD per
    point, the best marked, and the failed points with their reasons) and, when matplotlib can be imported,
    C(results.png) (tok/s and accept length against steps, failed points marked).
  - The best point has the highest score = median tok/s - O(mad_penalty) x MAD over its runs; points within
    O(tolerance) of the top score count as equal, and of those the one with the fewest steps (then the lowest
    top-k, the fewest draft tokens) wins.
author:
  - llmops.inference contributors (@llmops)
requirements:
  - matplotlib on the controller for the plot (optional).
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
    choices: [plan, record, report]
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
  algorithm:
    description:
      - For O(action=plan). The speculative algorithm the hosts run (recorded with the results, and checked to be
        one whose steps and top-k SGLang honours).
    type: str
  host_profiles:
    description:
      - For O(action=plan). Per host, the settings that must be alike across the swept hosts (for example model
        path, tensor-parallel size, algorithm, GPUs); hosts that differ are an error.
    type: dict
    default: {}
  hosts:
    description:
      - For O(action=plan). The hosts to spread the points over, in order.
    type: list
    elements: str
  repeats:
    description:
      - For O(action=plan). Benchmark runs per point.
    type: int
    default: 3
  warmup_requests:
    description:
      - For O(action=plan). Warm-up requests before a point's first benchmark run.
    type: int
    default: 2
  bench:
    description:
      - For O(action=plan). Options of M(llmops.inference.sglang_bench) for every run (C(num_prompts),
        C(concurrency), C(max_new_tokens), C(prompt_set), C(random_input_len), C(seed), C(request_timeout),
        C(ignore_eos), C(temperature)); recorded so a resumed sweep measures the same way.
    type: dict
    default: {}
  resume:
    description:
      - For O(action=plan). Skip the points already recorded in O(results_dir) (which must come from a sweep
        measured the same way). Without it, earlier results are moved to C(replaced-<time>/) in O(results_dir).
    type: bool
    default: false
  retry_failed:
    description:
      - For O(action=plan) with O(resume). Run the points recorded as failed again.
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
      - For O(action=plan); recorded in C(sweep.json), where O(action=report) reads it. Points scoring within this
        fraction of the top score count as equal, and the fewest steps wins among them.
    type: float
    default: 0.02
  run_id:
    description:
      - For O(action=record) and O(action=report). The run, as O(action=plan) returned it.
    type: str
  point:
    description:
      - For O(action=record). The point as O(action=plan) returned it (C(id), C(steps), C(topk), C(draft_tokens)).
    type: dict
  host:
    description:
      - For O(action=record). The host that ran the point.
    type: str
  started_at:
    description:
      - For O(action=record). When the point started (seconds since the epoch, controller clock).
    type: float
  finished_at:
    description:
      - For O(action=record). When the point ended (seconds since the epoch, controller clock).
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
      - For O(action=record). The point's M(llmops.inference.sglang_bench) result (its C(runs) are the repeats).
    type: dict
  first_failure:
    description:
      - For O(action=record). Why the point's first load failed, when it was loaded once more (the sweep's
        C(sweep_retry_failed_load)).
    type: str
  error:
    description:
      - For O(action=record). A task failure that ended the point (then it is recorded as failed with this reason).
    type: str
  journal:
    description:
      - For O(action=record). The unit's last journal lines, kept with a failed point.
    type: list
    elements: str
  plot:
    description:
      - For O(action=report). Write C(results.png) when matplotlib can be imported.
    type: bool
    default: true
seealso:
  - module: llmops.inference.sglang_bench
"""

EXAMPLES = r"""
- name: Plan a sweep of steps 1 to 8 over the group's hosts
  llmops.inference.sweep_report:
    action: plan
    results_dir: /srv/sweeps/qwen-eagle
    steps: [1, 2, 3, 4, 5, 6, 7, 8]
    algorithm: EAGLE
    hosts: "{{ query('inventory_hostnames', 'sglang') }}"
    repeats: 3
    bench: {num_prompts: 32, concurrency: 8, max_new_tokens: 256}
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
done:
  description: Ids of the points skipped because they are already recorded (O(action=plan) with O(resume)).
  returned: success
  type: list
  elements: str
assignment:
  description: Per host, the points it runs in this run (O(action=plan)).
  returned: success
  type: dict
definition:
  description: What is swept and how it is measured, as written to C(sweep.json) (O(action=plan)).
  returned: success
  type: dict
replaced:
  description: Where earlier results were moved (O(action=plan) without O(resume)), or null.
  returned: success
  type: str
record:
  description: The point's record (O(action=record)).
  returned: success
  type: dict
summary:
  description: One row per point - medians, MAD, score, accept length, status, reason (O(action=report)).
  returned: success
  type: list
  elements: dict
best:
  description: The best point's row (O(action=report)), or null when no point was measured.
  returned: success
  type: dict
timing:
  description:
    - This run's timing (O(action=report)) - C(sweep_wall_s) (first point start to last point end, all hosts),
      C(load_bench_sum_s) (sum of every point's restart-chain and benchmark time), C(overhead_ratio) (their
      quotient), C(run_wall_s) (plan to report).
  returned: success
  type: dict
files:
  description: The report files written (O(action=report)), by kind (C(json), C(csv), C(markdown), C(png)).
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
    plan_sweep,
    record_point,
    write_reports,
)
from ansible_collections.llmops.inference.plugins.module_utils.sweep_plan import SweepInputError  # noqa: E402

ARGUMENT_SPEC = {
    "action": {"type": "str", "required": True, "choices": ["plan", "record", "report"]},
    "results_dir": {"type": "path", "required": True},
    "steps": {"type": "raw"},
    "topk": {"type": "raw", "default": 1},
    "draft_tokens": {"type": "raw", "no_log": False},
    "grid": {"type": "raw"},
    "algorithm": {"type": "str"},
    "host_profiles": {"type": "dict", "default": {}},
    "hosts": {"type": "list", "elements": "str"},
    "repeats": {"type": "int", "default": 3},
    "warmup_requests": {"type": "int", "default": 2},
    "bench": {"type": "dict", "default": {}},
    "resume": {"type": "bool", "default": False},
    "retry_failed": {"type": "bool", "default": False},
    "apply": {"type": "str", "default": "original", "choices": ["original", "best"]},
    "mad_penalty": {"type": "float", "default": 1.0},
    "tolerance": {"type": "float", "default": 0.02},
    "run_id": {"type": "str"},
    "point": {"type": "dict"},
    "host": {"type": "str"},
    "started_at": {"type": "float"},
    "finished_at": {"type": "float"},
    "apply_s": {"type": "float"},
    "load_s": {"type": "float"},
    "gate": {"type": "dict"},
    "benchmark": {"type": "dict"},
    "error": {"type": "str"},
    "first_failure": {"type": "str"},
    "journal": {"type": "list", "elements": "str"},
    "plot": {"type": "bool", "default": True},
}
REQUIRED_BY_ACTION = {
    "plan": ["hosts"],
    "record": ["run_id", "point", "host", "started_at", "finished_at"],
    "report": [],
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = dict(module.params)
    action = params["action"]
    missing = [name for name in REQUIRED_BY_ACTION[action] if params[name] is None]
    if missing:
        module.fail_json(msg=f"action={action} needs {', '.join(missing)}", changed=False)
    write = not module.check_mode
    try:
        if action == "plan":
            run = {"run_id": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)}
            result = plan_sweep(params, run, time.time(), write=write)
            msg = (
                f"{len(result['points'])} point(s), {len(result['done'])} already recorded, "
                f"{sum(len(points) for points in result['assignment'].values())} to run on "
                f"{len(result['assignment'])} host(s)"
            )
        elif action == "record":
            result = record_point(params, write=write)
            msg = f"point {params['point'].get('id')}: {result['record']['status']}"
        else:
            result = write_reports(params, time.time(), write=write)
            best = result["best"]
            msg = f"best: {best['id']} at {best['output_throughput_median']:.1f} tok/s" if best else "no point measured"
    except SweepInputError as exc:
        module.fail_json(msg=str(exc), variable=exc.variable, changed=False)
    except OSError as exc:
        module.fail_json(msg=f"results_dir {params['results_dir']}: {exc}", changed=False)
    result["results_dir"] = os.path.normpath(params["results_dir"])
    # JSON round trip: the result holds only plain data, and Ansible should see exactly what the files hold.
    module.exit_json(msg=msg, changed=write, **json.loads(json.dumps(result)))


if __name__ == "__main__":
    main()
