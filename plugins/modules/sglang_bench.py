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
  - Best run on the server's host (the default O(url) is the loopback address), so the network does not distort
    the latencies.
author:
  - llmops.inference contributors (@llmops)
attributes:
  check_mode:
    support: full
    description:
      - A benchmark only sends generation requests, which change nothing on the server, so it runs unchanged in
        check mode and reports real numbers.
extends_documentation_fragment:
  - llmops.inference.read_only
  - llmops.inference.sglang_server
options:
  num_prompts:
    description:
      - Measured requests.
    type: int
    default: 32
  concurrency:
    description:
      - Requests in flight at most (bench_serving's C(--max-concurrency)).
    type: int
    default: 8
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
      - Requests sent, at the same concurrency, before the measured ones and left out of every metric.
    type: int
    default: 1
  repeats:
    description:
      - How many times to send the O(num_prompts) measured requests, one run after the other, after one warm-up.
        Each run's metrics are in RV(runs); the top-level metrics then combine them (see RV(runs)).
    type: int
    default: 1
  stop_on_failure:
    description:
      - Stop at the first failed request - a request that errors or exceeds O(request_timeout) - instead of sending
        the others; requests already in flight still run to their end or their timeout, so a server that hangs
        costs one O(request_timeout), not one per request. The requests not sent are counted in
        RV(unsent_requests).
    type: bool
    default: false
  unit:
    description:
      - The systemd unit of the engine being measured. When set, RV(engine) says which engine process served the
        benchmark, when systemd forked it and when it logged that it was ready (from the journal),
        RV(engine_restarted) whether another process served by the end, and RV(journal_tail) holds the unit's last
        journal lines when a request failed.
    type: str
  fail_on_errors:
    description:
      - Fail when any measured or warm-up request failed. With V(false) the module succeeds and reports
        RV(failed_requests) and RV(errors), so a caller such as a sweep can record them.
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
  returned: always
  type: int
failed_requests:
  description:
    - Measured requests that failed or timed out. (Not C(failed) as in bench_serving - Ansible would take a
      non-zero C(failed) for the task failing.)
  returned: always
  type: int
errors:
  description: The most frequent failure messages with their counts (at most 5).
  returned: always
  type: list
  elements: dict
  sample: [{"error": "no response from /generate within 120.0 s", "count": 2}]
duration:
  description: Seconds from the first measured request's start to the last one's end.
  returned: always
  type: float
total_input_tokens:
  description: Prompt tokens of the completed requests, as the server counted them (C(meta_info.prompt_tokens)).
  returned: always
  type: int
total_output_tokens:
  description: Completion tokens of the completed requests.
  returned: always
  type: int
output_throughput:
  description: Output tokens per second (RV(total_output_tokens) / RV(duration)).
  returned: always
  type: float
  sample: 1523.4
request_throughput:
  description: Completed requests per second.
  returned: always
  type: float
input_throughput:
  description: Input tokens per second.
  returned: always
  type: float
total_throughput:
  description: Input plus output tokens per second.
  returned: always
  type: float
concurrency:
  description: Mean requests in flight (sum of E2E latencies / RV(duration)).
  returned: always
  type: float
accept_length:
  description:
    - Speculative accept length of this run (tokens per verify step); null when the server reports none
      (speculative decoding off).
  returned: always
  type: float
  sample: 2.77
accept_length_requests:
  description: Completed requests whose C(meta_info) gave a verify count or accept length.
  returned: always
  type: int
mean_ttft_ms:
  description:
    - Time to first token, in milliseconds. The same statistics - C(mean_), C(median_), C(std_) (population),
      C(p90_), C(p95_) and C(p99_) - are returned for C(ttft), C(tpot) (time per output token after the first),
      C(itl) (inter-token latency) and C(e2e_latency) (end to end), for example RV(median_ttft_ms),
      C(p99_itl_ms), C(mean_e2e_latency_ms); null when no request completed.
  returned: always
  type: float
median_ttft_ms:
  description: Median time to first token, in milliseconds.
  returned: always
  type: float
p99_ttft_ms:
  description: 99th percentile of the time to first token, in milliseconds.
  returned: always
  type: float
mean_itl_ms:
  description: Mean inter-token latency, in milliseconds.
  returned: always
  type: float
max_itl_ms:
  description: Longest inter-token gap, in milliseconds.
  returned: always
  type: float
runs:
  description:
    - The metrics of each run, in order (one entry unless O(repeats) > 1). With several runs the top-level
      counts, token totals and RV(duration) are their sums, RV(errors) are merged, and every other top-level
      number is the median over the runs.
  returned: always
  type: list
  elements: dict
repeats:
  description: Measured runs.
  returned: always
  type: int
num_prompts:
  description: Measured requests sent per run.
  returned: always
  type: int
max_concurrency:
  description: The concurrency the run used.
  returned: always
  type: int
warmup:
  description: Warm-up requests sent, how many failed (with their most frequent errors), and their duration in seconds.
  returned: always
  type: dict
  sample: {"requests": 1, "failed_requests": 0, "duration": 0.41, "errors": []}
elapsed_s:
  description: Seconds the whole benchmark took, warm-up included.
  returned: always
  type: float
output_throughput_per_user:
  description:
    - Output tokens per second one user sees while its request runs - the mean over the completed requests of
      completion tokens / E2E latency (TTFT included).
  returned: always
  type: float
stopped_early:
  description: Whether O(stop_on_failure) ended the benchmark before every request was sent.
  returned: always
  type: bool
unsent_requests:
  description: Requests (warm-up and measured) not sent because O(stop_on_failure) stopped the benchmark.
  returned: always
  type: int
engine:
  description:
    - With O(unit), the engine when the benchmark started - C(main_pid), C(active_state), C(forked_at) (systemd's
      C(ExecMainStartTimestamp)), C(ready_at) (the journal entry of C(The server is fired up and ready to roll!),
      else when the unit turned active; C(ready_source) says which), C(fork_to_ready_s); times are seconds since
      the epoch on the host's clock.
  returned: when O(unit) is set
  type: dict
  sample: {"main_pid": 4242, "active_state": "active", "forked_at": 1764620000.12, "ready_at": 1764620031.9,
           "fork_to_ready_s": 31.78, "ready_source": "engine log"}
engine_restarted:
  description: With O(unit), whether another engine process (or none) served the unit when the benchmark ended.
  returned: when O(unit) is set
  type: bool
journal_tail:
  description: With O(unit), the unit's last 30 journal lines, when a request failed or the engine restarted.
  returned: when O(unit) is set and something failed
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.bench import (  # noqa: E402
    BenchInputError,
    BenchSettings,
    StreamingBenchClient,
    run_benchmark,
)
from ansible_collections.llmops.inference.plugins.module_utils.engine_times import (  # noqa: E402
    engine_times,
    journal_tail,
    same_engine,
)
from ansible_collections.llmops.inference.plugins.module_utils.module_support import (  # noqa: E402
    command_runner,
    fail_refused_option,
)
from ansible_collections.llmops.inference.plugins.module_utils.sglang import server_argument_spec  # noqa: E402

ARGUMENT_SPEC = {
    **server_argument_spec(),
    "num_prompts": {"type": "int", "default": 32},
    "concurrency": {"type": "int", "default": 8},
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
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        settings = BenchSettings(**{name: params[name] for name in BenchSettings.DEFAULTS}).validate()
    except BenchInputError as exc:
        fail_refused_option(module, exc)

    def client_factory():
        return StreamingBenchClient(
            settings.url,
            api_key=params["api_key"],
            timeout=settings.request_timeout,
            validate_certs=params["validate_certs"],
        )

    run_command = command_runner(module)
    engine = engine_times(run_command, params["unit"]) if params["unit"] else None
    result = run_benchmark(settings, client_factory)
    failed = result["failed_requests"] + result["warmup"]["failed_requests"]
    if engine is not None:
        result["engine"] = engine
        after = engine_times(run_command, params["unit"], ready=False)
        result["engine_restarted"] = not same_engine(engine, after)
        if failed or result["engine_restarted"]:
            result["journal_tail"] = journal_tail(run_command, params["unit"])
    summary = (
        f"sglang_bench: {result['completed']}/{result['num_prompts'] * settings.repeats} requests completed in "
        f"{result['duration']:.2f} s at concurrency {settings.concurrency}"
    )
    if failed and params["fail_on_errors"]:
        first = (result["errors"] or result["warmup"]["errors"])[0]["error"]
        module.fail_json(msg=f"{summary}; {failed} failed (first error: {first})", changed=False, **result)
    module.exit_json(msg=summary, changed=False, **result)


if __name__ == "__main__":
    main()
