#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_bench
short_description: Benchmark an SGLang server with streamed requests at a fixed concurrency
version_added: 0.1.0
description:
  - Sends O(num_prompts) streamed C(/generate) requests, at most O(concurrency) at a time (one thread each), after
    O(warmup_requests) unmeasured ones, and returns throughput, latency statistics and the speculative accept
    length of this run.
  - Prompts are deterministic - the shipped prompt set (O(prompt_set=builtin)), or O(random_input_len) random words
    drawn with O(seed) (O(prompt_set=random)) - so runs on different hosts and settings compare like with like.
  - Metric names and definitions are those of SGLang's own C(sglang.bench_serving) where they mean the same thing
    (C(output_throughput), C(request_throughput), C(completed), C(duration), C(mean_ttft_ms), C(median_itl_ms),
    C(p99_e2e_latency_ms), ...). Percentiles interpolate linearly between the closest ranks, as numpy and
    bench_serving do.
  - RV(accept_length) is aggregated over this run's completed requests from their C(meta_info) - total completion
    tokens over total verify steps (C(spec_verify_ct), or completion tokens / C(spec_accept_length) where only that
    is reported) - not the server's lifetime average that C(/server_info) reports.
  - With O(levels), one call measures several load levels in turn on the same server - the warm-up before the first
    level only, O(repeats) runs per level, each level ended at its own C(budget_s) - and returns each level's result
    in RV(levels). With O(progress_path), each level's result is also written to that file on the host as soon as
    the level ends, so a benchmark cut short (its task timed out, or the controller went away) leaves the levels it
    finished there.
  - Best run on the server's host (the default O(url) is the loopback address), so the network does not distort
    the latencies.
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description:
      - A benchmark only sends generation requests, which change nothing on the server, so it runs unchanged in
        check mode and reports real numbers; O(progress_path) is not written in check mode.
  diff_mode:
    support: none
    description: The server is not changed, and the progress file is a new record of this run; there is no diff.
  idempotent:
    support: partial
    description:
      - Without O(progress_path) it changes nothing and C(changed) is always false; with it, every run writes the
        file anew and reports C(changed).
extends_documentation_fragment:
  - llmops.inference.sglang_server
options:
  num_prompts:
    description:
      - Measured requests per run (with O(levels), of each level that does not set its own).
    type: int
    default: 32
  concurrency:
    description:
      - Requests in flight at most (bench_serving's C(--max-concurrency)); V(8) when unset.
      - Mutually exclusive with O(levels), whose entries set it per level.
    type: int
  levels:
    description:
      - Load levels to measure one after the other in this one call, in the order given (for example ascending
        concurrency), instead of the single level of O(concurrency).
      - The warm-up (O(warmup_requests)) runs before the first level only; each level runs O(repeats) times.
      - With O(stop_on_failure), a level with a failed request - or whose engine process changed, with O(unit) -
        also ends the benchmark; the later levels are not run and are listed in RV(levels_not_run).
    type: list
    elements: dict
    suboptions:
      concurrency:
        description:
          - Requests in flight at most at this level; each level needs its own.
        type: int
        required: true
      num_prompts:
        description:
          - Measured requests per run at this level; O(num_prompts) when unset.
        type: int
      budget_s:
        description:
          - Seconds this level may take, warm-up included. Then no request is sent any more, a request still
            running fails with the budget as its error (so the level fails, and with O(stop_on_failure) the later
            levels are not run), and the level's C(out_of_budget) is true. Unset, the level has no budget.
        type: float
  progress_path:
    description:
      - With O(levels), a file on the host (absolute path) where the benchmark's progress is written as JSON -
        C(context) (O(progress_context)), C(planned) (the levels' concurrencies), C(levels) (the result of each level
        that ended, as in RV(levels)), C(running) (C(concurrency) and C(level_started_at) of the level under way, or
        null), C(not_run), C(finished) (true once the benchmark ended by itself) and C(updated_at).
      - The file is replaced atomically (mode C(0600)) when the benchmark starts and at each level's start and end;
        its directory is created (mode C(0700)) when missing. The API-key forms of O(api_key) are masked in it.
      - A caller whose task timed out reads the levels that ended back from it (for example with
        M(ansible.builtin.slurp)). The benchmark itself goes on on the host (a closed connection does not reach it
        while an SSH control master keeps the session); with O(stop_on_failure) it ends at the first request its
        server refuses, such as when the engine is restarted.
    type: path
  progress_context:
    description:
      - Data kept as given in O(progress_path), so that whoever reads the file back knows what was measured (a
        sweep keeps there what it needs to record the levels).
    type: dict
  max_new_tokens:
    description:
      - Tokens each request asks for (C(sampling_params.max_new_tokens)).
    type: int
    default: 128
    aliases: [random_output_len]
  prompt_set:
    description:
      - C(builtin) cycles through the collection's fixed set of 24 prompts of mixed kinds and lengths.
      - C(random) sends prompts of O(random_input_len) random common English words drawn with O(seed).
    type: str
    choices: [builtin, random]
    default: builtin
  random_input_len:
    description:
      - Words per prompt with O(prompt_set=random).
    type: int
    default: 256
  seed:
    description:
      - Seed of the random prompts.
    type: int
    default: 0
  temperature:
    description:
      - Sampling temperature of every request.
    type: float
    default: 0.0
  ignore_eos:
    description:
      - Ask the server to generate O(max_new_tokens) tokens even past an end-of-sequence token, so every request
        produces the same amount of work (bench_serving's default).
    type: bool
    default: true
  request_timeout:
    description:
      - Seconds one request may take from sending to the end of its stream; a slower one counts as failed.
    type: float
    default: 120
  warmup_requests:
    description:
      - Requests sent, at the same concurrency, before the measured ones and left out of every metric (with
        O(levels), before the first level only).
    type: int
    default: 1
  repeats:
    description:
      - How many times to send the O(num_prompts) measured requests, one run after the other, after one warm-up.
        Each run's metrics are in RV(runs); the top-level metrics then combine them (see RV(runs)). With O(levels),
        per level.
    type: int
    default: 1
  stop_on_failure:
    description:
      - Stop at the first failed request - a request that errors or exceeds O(request_timeout) - instead of sending
        the others; requests already in flight still run to their end or their timeout, so a server that hangs
        costs one O(request_timeout), not one per request. The requests not sent are counted in
        RV(unsent_requests). With O(levels), the later levels are not run either.
    type: bool
    default: false
  unit:
    description:
      - The systemd unit of the engine being measured. When set, RV(engine) says which engine process served the
        benchmark, when systemd forked it and when it logged that it was ready (from the journal),
        RV(engine_restarted) whether another process served by the end, and RV(journal_tail) holds the unit's last
        journal lines when a request failed. With O(levels), each level's result holds them.
    type: str
  fail_on_errors:
    description:
      - Fail when any measured or warm-up request failed (with O(levels), at any level). With V(false) the module
        succeeds and reports RV(failed_requests) and RV(errors), so a caller such as a sweep can record them.
    type: bool
    default: true
notes:
  - Requests run on Python threads; one process drives a few hundred streams at most. For larger loads run
    SGLang's own C(python -m sglang.bench_serving).
seealso:
  - name: SGLang bench_serving
    description: The benchmark whose metric names this module uses.
    link: https://docs.sglang.ai/developer_guide/bench_serving.html
  - module: llmops.inference.sglang_probe
"""

EXAMPLES = r"""
- name: Benchmark the local server with 64 requests, 16 at a time
  llmops.inference.sglang_bench:
    num_prompts: 64
    concurrency: 16
    max_new_tokens: 256
  register: bench

- name: Show throughput and accept length
  ansible.builtin.debug:
    msg: "{{ bench.output_throughput | round(1) }} tok/s, accept length {{ bench.accept_length }}"

- name: Three load levels on one server, each level kept on the host as soon as it ends
  llmops.inference.sglang_bench:
    levels:
      - {concurrency: 1, num_prompts: 16, budget_s: 900}
      - {concurrency: 8, budget_s: 600}
      - {concurrency: 32, budget_s: 600}
    num_prompts: 32
    repeats: 3
    stop_on_failure: true
    fail_on_errors: false
    progress_path: /var/lib/llmops/bench/levels.json
  timeout: 2100  # the sum of the levels' budgets
  register: bench_levels
  ignore_errors: true  # a timed-out task leaves the levels that ended in the progress file

- name: Show tok/s per level
  ansible.builtin.debug:
    msg: "concurrency {{ item.concurrency }}: {{ item.output_throughput | round(1) }} tok/s"
  loop: "{{ bench_levels.levels | default([]) }}"

- name: Read back the levels that ended when the benchmark timed out
  ansible.builtin.slurp:
    src: /var/lib/llmops/bench/levels.json
  register: bench_progress
  when: bench_levels.levels is not defined

- name: Random 512-word prompts, record failures instead of failing
  llmops.inference.sglang_bench:
    url: http://127.0.0.1:30000
    api_key: "{{ sglang_api_key }}"
    prompt_set: random
    random_input_len: 512
    random_output_len: 128
    seed: 7
    fail_on_errors: false
"""

RETURN = r"""
completed:
  description: Measured requests that finished.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
failed_requests:
  description:
    - Measured requests that failed or timed out. (Not C(failed) as in bench_serving - Ansible would take a
      non-zero C(failed) for the task failing.)
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
errors:
  description: The most frequent failure messages with their counts (at most 5).
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: list
  elements: dict
  sample: [{"error": "no response from /generate within 120.0 s", "count": 2}]
duration:
  description: Seconds from the first measured request's start to the last one's end.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
total_input_tokens:
  description: Prompt tokens of the completed requests, as the server counted them (C(meta_info.prompt_tokens)).
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
total_output_tokens:
  description: Completion tokens of the completed requests.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
output_throughput:
  description: Output tokens per second (RV(total_output_tokens) / RV(duration)).
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
  sample: 1523.4
request_throughput:
  description: Completed requests per second.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
input_throughput:
  description: Input tokens per second.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
total_throughput:
  description: Input plus output tokens per second.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
concurrency:
  description: Mean requests in flight (sum of E2E latencies / RV(duration)).
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
accept_length:
  description:
    - Speculative accept length of this run (tokens per verify step); null when the server reports none
      (speculative decoding off).
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
  sample: 2.77
accept_length_requests:
  description: Completed requests whose C(meta_info) gave a verify count or accept length.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
mean_ttft_ms:
  description:
    - Time to first token, in milliseconds. The same statistics - C(mean_), C(median_), C(std_) (population),
      C(p90_), C(p95_) and C(p99_) - are returned for C(ttft), C(tpot) (time per output token after the first),
      C(itl) (inter-token latency) and C(e2e_latency) (end to end), for example RV(median_ttft_ms),
      C(p99_itl_ms), C(mean_e2e_latency_ms); null when no request completed.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
median_ttft_ms:
  description: Median time to first token, in milliseconds.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
p99_ttft_ms:
  description: 99th percentile of the time to first token, in milliseconds.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
mean_itl_ms:
  description: Mean inter-token latency, in milliseconds.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
max_itl_ms:
  description: Longest inter-token gap, in milliseconds.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
runs:
  description:
    - The metrics of each run, in order (one entry unless O(repeats) > 1). With several runs the top-level
      counts, token totals and RV(duration) are their sums, RV(errors) are merged, and every other top-level
      number is the median over the runs.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: list
  elements: dict
repeats:
  description: Measured runs.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
num_prompts:
  description: Measured requests sent per run.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
max_concurrency:
  description: The concurrency the run used.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
warmup:
  description: Warm-up requests sent, how many failed (with their most frequent errors), and their duration in seconds.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: dict
  sample: {"requests": 1, "failed_requests": 0, "duration": 0.41, "errors": []}
elapsed_s:
  description: Seconds the whole benchmark took, warm-up included.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
output_throughput_per_user:
  description:
    - Output tokens per second one user sees while its request runs - the mean over the completed requests of
      completion tokens / E2E latency (TTFT included).
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: float
stopped_early:
  description: Whether O(stop_on_failure) ended the benchmark before every request was sent.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: bool
unsent_requests:
  description: Requests (warm-up and measured) not sent because O(stop_on_failure) stopped the benchmark.
  returned: without O(levels) (with it, in each entry of RV(levels))
  type: int
engine:
  description:
    - With O(unit), the engine when the benchmark started - C(main_pid), C(active_state), C(forked_at) (systemd's
      C(ExecMainStartTimestamp)), C(ready_at) (the journal entry of C(The server is fired up and ready to roll!),
      else when the unit turned active; C(ready_source) says which), C(fork_to_ready_s); times are seconds since
      the epoch on the host's clock.
  returned: when O(unit) is set (with O(levels), in each entry of RV(levels))
  type: dict
  sample: {"main_pid": 4242, "active_state": "active", "forked_at": 1764620000.12, "ready_at": 1764620031.9,
           "fork_to_ready_s": 31.78, "ready_source": "engine log"}
engine_restarted:
  description: With O(unit), whether another engine process (or none) served the unit when the benchmark ended.
  returned: when O(unit) is set (with O(levels), in each entry of RV(levels))
  type: bool
journal_tail:
  description: With O(unit), the unit's last 30 journal lines, when a request failed or the engine restarted.
  returned: when O(unit) is set and something failed (with O(levels), in the entry of that level)
  type: list
  elements: str
levels:
  description:
    - With O(levels), the result of each level that ran, in order - every key documented here for a single level
      (RV(completed), RV(output_throughput), RV(runs), RV(warmup), RV(engine), ...) plus C(concurrency),
      C(level_started_at) and C(level_ended_at) (seconds since the epoch, this host's clock), C(budget_s) and
      C(out_of_budget) (whether the level's budget cut it short).
  returned: with O(levels)
  type: list
  elements: dict
  sample: [{"concurrency": 1, "completed": 96, "failed_requests": 0, "output_throughput": 151.2,
            "level_started_at": 1764620040.1, "level_ended_at": 1764620101.7, "budget_s": 900.0,
            "out_of_budget": false}]
levels_not_run:
  description:
    - With O(levels) and O(stop_on_failure), the concurrencies of the levels not run because an earlier one failed.
  returned: with O(levels)
  type: list
  elements: int
  sample: [32]
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.bench import (  # noqa: E402
    BenchInputError,
    BenchSettings,
    StreamingBenchClient,
)
from ansible_collections.llmops.inference.plugins.module_utils.bench_levels import (  # noqa: E402
    BenchProgress,
    EngineWatch,
    check_progress_path,
    measure,
    parse_levels,
    run_levels,
)
from ansible_collections.llmops.inference.plugins.module_utils.module_support import (  # noqa: E402
    command_runner,
    fail_refused_option,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang import server_argument_spec  # noqa: E402

ARGUMENT_SPEC = {
    **server_argument_spec(),
    "num_prompts": {"type": "int", "default": 32},
    # No default here: it would always be set, and levels could not refuse it. BenchSettings holds the default.
    "concurrency": {"type": "int"},
    "levels": {
        "type": "list",
        "elements": "dict",
        "options": {
            "concurrency": {"type": "int", "required": True},
            "num_prompts": {"type": "int"},
            "budget_s": {"type": "float"},
        },
    },
    "max_new_tokens": {"type": "int", "default": 128, "aliases": ["random_output_len"], "no_log": False},
    "prompt_set": {"type": "str", "default": "builtin", "choices": ["builtin", "random"]},
    "random_input_len": {"type": "int", "default": 256},
    "seed": {"type": "int", "default": 0},
    "temperature": {"type": "float", "default": 0.0},
    "ignore_eos": {"type": "bool", "default": True},
    "request_timeout": {"type": "float", "default": 120},
    "warmup_requests": {"type": "int", "default": 1},
    "repeats": {"type": "int", "default": 1},
    "stop_on_failure": {"type": "bool", "default": False},
    "unit": {"type": "str"},
    "fail_on_errors": {"type": "bool", "default": True},
    "progress_path": {"type": "path"},
    "progress_context": {"type": "dict"},
}


def failed_requests(result: dict) -> int:
    return result["failed_requests"] + result["warmup"]["failed_requests"]


def first_error(result: dict) -> str:
    return (result["errors"] or result["warmup"]["errors"] or [{"error": "unknown error"}])[0]["error"]


def level_summary(result: dict, concurrency: int, repeats: int) -> str:
    return (
        f"{result['completed']}/{result['num_prompts'] * repeats} requests completed in "
        f"{result['duration']:.2f} s at concurrency {concurrency}"
    )


def one_level(module, settings, client_factory, watch) -> None:
    result = measure(settings, client_factory, watch)
    summary = f"sglang_bench: {level_summary(result, settings.concurrency, settings.repeats)}"
    failed = failed_requests(result)
    if failed and module.params["fail_on_errors"]:
        message = f"{summary}; {failed} failed (first error: {first_error(result)})"
        module.fail_json(msg=message, changed=False, **result)
    module.exit_json(msg=summary, changed=False, **result)


def several_levels(module, settings, levels, client_factory, watch) -> None:
    params = module.params
    progress = None
    if params["progress_path"]:
        progress = BenchProgress(
            params["progress_path"],
            params["progress_context"],
            [level.concurrency for level in levels],
            secrets=[params["api_key"]],
            write=not module.check_mode,
        )
        try:
            progress.start()
        except OSError as exc:
            module.fail_json(
                msg=f"progress_path: cannot write {params['progress_path']}: {exc.strerror or exc}",
                option="progress_path",
                changed=False,
            )
    result = run_levels(settings, levels, client_factory, watch, progress)
    changed = progress is not None
    parts = [level_summary(level, level["concurrency"], settings.repeats) for level in result["levels"]]
    if result["levels_not_run"]:
        parts.append(f"not run after a failed level: concurrency {', '.join(map(str, result['levels_not_run']))}")
    summary = f"sglang_bench: {len(result['levels'])} of {len(levels)} level(s) run; " + "; ".join(parts)
    if progress is not None and progress.error:
        module.warn(f"progress_path: a level could not be written: {progress.error}")
    failing = [level for level in result["levels"] if failed_requests(level)]
    if failing and params["fail_on_errors"]:
        first = failing[0]
        module.fail_json(
            msg=f"{summary}; {failed_requests(first)} failed at concurrency {first['concurrency']} "
            f"(first error: {first_error(first)})",
            changed=changed,
            **result,
        )
    module.exit_json(msg=summary, changed=changed, **result)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
        mutually_exclusive=[("concurrency", "levels")],
        required_by={"progress_path": "levels", "progress_context": "progress_path"},
    )
    params = module.params
    try:
        given = {name: params[name] for name in BenchSettings.DEFAULTS if params[name] is not None}
        settings = BenchSettings(**given).validate()
        levels = None if params["levels"] is None else parse_levels(params["levels"], settings.num_prompts)
        if params["progress_path"] is not None:
            params["progress_path"] = check_progress_path(params["progress_path"])
    except BenchInputError as exc:
        fail_refused_option(module, exc)

    def client_factory():
        return StreamingBenchClient(
            settings.url,
            api_key=params["api_key"],
            timeout=settings.request_timeout,
            validate_certs=params["validate_certs"],
        )

    watch = EngineWatch(command_runner(module), params["unit"]) if params["unit"] else None
    if levels is None:
        one_level(module, settings, client_factory, watch)
    else:
        several_levels(module, settings, levels, client_factory, watch)


if __name__ == "__main__":
    main()
