#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_probe
short_description: Prove that an SGLang server serves, not just that its unit is active
version_added: 0.1.0
description:
  - Answers "does this host serve?" in tiers, in this order, each reported in RV(tiers) as C(ok), C(failed) or
    C(skipped) with a reason and its time. After a failed tier the later tiers are C(skipped) with the reason
    C(earlier tier failed).
  - C(unit) (with O(unit)) - the systemd unit is active, and its MainPID stays the same and NRestarts does not
    rise between the start and the end of the probe (at least O(stability_window) seconds); a restart loop fails
    here with both numbers.
  - C(gpu) - the processes in the unit's cgroup hold at least O(min_gpu_memory_mib) on each expected GPU
    (O(expected_gpus), else O(tp_size), else all GPUs; a MIG device counts as a GPU of its own), which catches a
    unit that is active while the model never loaded. Without O(unit), the GPUs' used memory is checked instead.
  - "C(progress) (with O(progress_window)) - C(/metrics) is scraped when the probe starts (so the C(unit) and
    C(gpu) tiers run inside the window), and again every 0.5 s until O(progress_window) seconds have passed;
    requests running or queued (C(sglang:num_running_reqs), C(sglang:num_queue_reqs)) at the first scrape and at
    the end of the window while the token counters (C(sglang:generation_tokens_total),
    C(sglang:realtime_tokens_total)) did not grow is a hang, reported as
    C(hung: 3 running, 5 queued, no token generated in 10 s). It passes at once on an idle engine, and as soon as
    tokens are generated or the requests are gone. It runs before the HTTP tiers, since a hung engine keeps
    C(/server_info) and C(/generate) waiting."
  - C(health) - the server is ready - C(/ready) answers HTTP 200 (warm-up done; not paused, draining or unhealthy),
    or C(/health) on a server that answers HTTP 404 on C(/ready) (SGLang before C(/ready) existed). See the notes
    for why not C(/health).
  - C(model) - C(/model_info) (C(/get_model_info) on older servers) and C(/v1/models) answer, and serve
    O(expected_model) when it is set. The speculative-decoding settings are read from C(/server_info).
  - C(generate) - a real streamed C(/generate) at temperature 0 with O(max_new_tokens) finishes within
    O(generate_timeout), with text that is not empty, not degenerate (one character or one short unit repeated,
    one word repeated, a loop of words over most of the text, or prose whose distinct-word ratio is below
    O(min_distinct_ratio); tables, truth tables, code and JSON pass) and matches O(expect_regex) if set.
  - C(floors) (with O(min_tokens_per_s) or O(min_accept_length)) - the generation's decode throughput and the
    speculative accept length reported in its C(meta_info) reach the floors.
  - C(soak) (with O(soak_requests)) - that many short generations (O(soak_max_new_tokens) tokens) one after
    another, each within O(generate_timeout) and not empty or degenerate; it fails on the first that does not, with
    its number (RV(soak.failed_request)), and reports each latency.
  - An unhealthy result is also checked for GPU memory that only a reset or a reboot frees on the expected GPUs
    (held by a zombie or by a PID that no longer exists, or used without any listed process above
    O(unaccounted_threshold_mib), for 2 s) - RV(state) is then C(needs_gpu_reset) and RV(unreapable) has the
    evidence.
  - With O(wait_timeout), probes again (every O(poll_interval) seconds at most) until every tier passes, and gives
    up at once when the unit is failed or inactive or has restarted since the wait began.
  - Optionally writes the result as a Prometheus textfile for node_exporter's textfile collector.
author:
  - llmops.inference contributors (@llmops)
requirements:
  - Linux; systemd for O(unit).
  - For the C(gpu) tier, Python package C(nvidia-ml-py) (module C(pynvml)) or C(nvidia-smi).
attributes:
  check_mode:
    support: full
    description: The probe only reads, so it runs unchanged in check mode; only O(textfile_path) is not written.
extends_documentation_fragment:
  - llmops.inference.read_only
  - llmops.inference.sglang_server
options:
  unit:
    description:
      - The systemd unit that runs the server (C(.service) is added to a name without a unit type).
      - Enables the C(unit) tier and attributes GPU memory to the processes in its cgroup.
    type: str
  tiers:
    description:
      - The tiers to run; the others are reported C(skipped) with the reason C(not requested).
      - C(floors) needs C(generate).
      - C(progress) needs O(progress_window) and C(soak) needs O(soak_requests); without them they are skipped.
    type: list
    elements: str
    choices: [unit, gpu, progress, health, model, generate, floors, soak]
    default: [unit, gpu, progress, health, model, generate, floors, soak]
  timeout:
    description:
      - Seconds each HTTP request other than the generation may take.
    type: float
    default: 10
  prompt:
    description:
      - The prompt of the test generation.
    type: str
    default: List the first five prime numbers.
  max_new_tokens:
    description:
      - Tokens the test generation asks for.
    type: int
    default: 32
  generate_timeout:
    description:
      - Seconds the whole test generation may take, from the request to the end of the stream.
    type: float
    default: 60
  expect_regex:
    description:
      - Python regular expression that the generated text must contain (C(re.search)).
    type: str
  min_distinct_ratio:
    description:
      - Generated prose of 12 words or more (numbers left out) whose distinct words make up less than this share of
        its last 100 words is degenerate. Structured text (tables, code, JSON, CSV; many symbol characters, or table
        rows) is not judged by this ratio, since it repeats its keys, digits and keywords by nature.
    type: float
    default: 0.25
  expected_model:
    description:
      - The model the server must serve, matched against C(model_path) and C(served_model_name) from
        C(/model_info) and the ids from C(/v1/models), exactly or as the last path components
        (C(Qwen/Qwen3-8B) matches C(/models/Qwen/Qwen3-8B)).
    type: str
  min_gpu_memory_mib:
    description:
      - MiB the unit's processes must hold on each expected GPU for the model to count as loaded (NVML's
        per-process figures; without O(unit), or where those are unavailable, the memory in use beyond the driver's
        reservation, so an idle board's reservation never reads as a loaded model).
    type: int
    default: 1024
  expected_gpus:
    description:
      - The GPUs the server must hold memory on. A count (the unit must hold O(min_gpu_memory_mib) on at least that
        many GPUs, whichever they are) or a list of GPU indices, C(GPU-) UUIDs or C(MIG-) UUIDs (each of them).
      - Default is O(tp_size) as a count when set, else all GPUs.
    type: raw
  tp_size:
    description:
      - The server's tensor-parallel size (C(--tp-size)); the default count for O(expected_gpus).
    type: int
    aliases: [tp]
  gpu_backend:
    description:
      - How to list GPU memory for the C(gpu) tier. C(auto) tries NVML through pynvml, then C(nvidia-smi).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  min_tokens_per_s:
    description:
      - Floor for the generation's decode throughput (tokens after the first, over the time after the first token).
    type: float
  min_accept_length:
    description:
      - Floor for the speculative accept length (C(spec_accept_length) in the generation's C(meta_info)). Fails when
        the server does not report one.
    type: float
  stability_window:
    description:
      - Seconds over which MainPID and NRestarts must stay the same, measured from the first look at the unit.
        The unit is sampled again at the end and polled until the window has passed. C(0) compares the start and
        the end of the probe only.
    type: float
    default: 0
  wait_timeout:
    description:
      - Keep probing until every tier passes or this many seconds have passed. C(0) probes once.
      - The wait ends early when the unit is failed, inactive or not found, or restarted (MainPID changed or
        NRestarts rose) since the wait began; waiting on a dead service would only burn the timeout.
      - An attempt that started before the deadline runs to its end.
    type: float
    default: 0
  poll_interval:
    description:
      - Seconds between the starts of two attempts while waiting, and between unit samples within
        O(stability_window). At most 0.5.
    type: float
    default: 0.5
  progress_window:
    description:
      - Turns the C(progress) tier on - the longest time, in seconds, that requests may be running or queued
        without a token generated (see the description). Leave it unset to turn the tier off; 0 or less is refused.
      - Needs the server's C(--enable-metrics). SGLang counts C(sglang:generation_tokens_total) when a request
        finishes and C(sglang:realtime_tokens_total) at every step; on a server without the latter, make the window
        longer than the longest request.
    type: float
  progress_require_metrics:
    description:
      - Fail the C(progress) tier when C(/metrics) answers 404 (the server runs without C(--enable-metrics)). By
        default the tier is then skipped, with that reason.
    type: bool
    default: false
  soak_requests:
    description:
      - Turns the C(soak) tier on with this many sequential short generations. C(0) is off; negative is refused.
    type: int
    default: 0
  soak_max_new_tokens:
    description:
      - Tokens each soak generation asks for.
    type: int
    default: 8
  unaccounted_threshold_mib:
    description:
      - On an unhealthy host, memory in use on an expected GPU beyond the driver's reservation (NVML v2's
        C(reserved), never counted) that no listed process accounts for counts as memory only a reset frees above
        this many MiB. Where the driver does not report its reservation apart, all used memory counts.
    type: int
    default: 1024
  fail_on_unhealthy:
    description:
      - "Fail when a tier fails, with the one-line message C(sglang_probe: <tier> failed: <reason>) and the full
        result."
      - Set to V(false) to collect results from a fleet and decide afterwards (RV(healthy)).
    type: bool
    default: true
  textfile_path:
    description:
      - Write the result to this file as Prometheus text exposition (metrics C(llmops_sglang_probe_*)), replacing it
        atomically, for node_exporter's C(--collector.textfile.directory). Must be an absolute path ending in
        C(.prom) in an existing directory. Not written in check mode.
    type: path
  journal_lines:
    description:
      - "With O(unit), when a tier fails, return the unit's last this many journal lines in RV(journal), redacted
        (O(api_key) and the C(api_key='...'), C(--api-key X), C(api-key: X) and C(Authorization: Bearer X) forms).
        C(0) reads no journal."
    type: int
    default: 0
notes:
  - "Readiness is read from C(/ready), not C(/health). In SGLang 0.5.23 C(/health) and C(/health_generate) are one
    handler (C(health_generate) in C(sglang/srt/entrypoints/http_server.py)) that sends a one-token generation and
    checks for its answer every second, so it takes 1 s or more, longer on a busy engine, and holds a request in
    the engine while it waits. C(/ready) (C(ready) in the same file) answers at once from
    C(TokenizerManager.is_ready) in C(sglang/srt/managers/tokenizer_manager.py) - not paused, not shutting down,
    and status Up, which the server reaches when its warm-up generation answered and leaves when a health check
    fails. The C(generate) tier is the proof that the engine generates. The probe asks C(/ready) first and, on an
    HTTP 404, C(/health) for the rest of the run. SGLang turns a server Up again only when a C(/health) check
    passes, so after a failed one C(/ready) stays 503 until the next passes (a gateway that checks C(/health)
    does that)."
  - SGLang's readiness and health can answer 200 while generation hangs and while the GPUs hold no model;
    this is why the C(gpu), C(progress) and C(generate) tiers exist.
  - A GPU whose NVML query fails for one field (C(Not Supported), C(Insufficient Permissions)) is still used; the
    field is unknown and listed in RV(gpu_errors). Without its process list, all of its used memory counts.
  - The progress tier reads SGLang 0.5.23's metric names from C(sglang/srt/observability/metrics_collector.py);
    the request gauges are refreshed at each stats log and when the scheduler goes idle.
  - "The degenerate-output check, on the labelled corpus of C(tests/unit/plugins/module_utils/degenerate_corpus.py)
    (answers - prose, lists, truth tables, tables, code, JSON, YAML, CSV, other scripts; broken output - a
    character, a word, a token or a phrase repeated, sentence loops, loops after a good start, word salad), flags
    27 of its 27 degenerate outputs and 0 of its 36 normal ones. Confusion table - degenerate outputs (27) - 27
    flagged, 0 passed; normal outputs (36) - 0 flagged, 36 passed."
  - Without O(unit), the C(gpu) tier counts all memory used on the GPUs, whoever holds it.
seealso:
  - name: SGLang native API
    description: The endpoints the probe calls.
    link: https://docs.sglang.ai/basic_usage/native_api.html
  - name: node_exporter textfile collector
    description: How node_exporter exposes C(*.prom) files.
    link: https://github.com/prometheus/node_exporter#textfile-collector
  - name: SGLang production metrics
    description: The C(/metrics) endpoint and C(--enable-metrics).
    link: https://docs.sglang.ai/references/production_metrics.html
  - module: llmops.inference.nvidia_reap
"""

EXAMPLES = r"""
- name: Readiness gate - wait until the restarted server really serves, stop early on a crash loop
  llmops.inference.sglang_probe:
    url: http://127.0.0.1:30000
    unit: sglang-qwen.service
    tp_size: 2
    expected_model: Qwen/Qwen3-8B
    wait_timeout: 900
    stability_window: 10
    generate_timeout: 30
  register: gate

- name: Fleet health report - probe every host without failing the play
  llmops.inference.sglang_probe:
    unit: sglang-qwen.service
    api_key: "{{ sglang_api_key }}"
    fail_on_unhealthy: false
  register: probe

- name: Fleet health report - summary
  ansible.builtin.debug:
    msg:
      serving: "{{ probes | dict2items | selectattr('value.healthy') | map(attribute='key') | list }}"
      unhealthy: "{{ dict(bad | map(attribute='key') | zip(bad | map(attribute='value.msg'))) }}"
  vars:
    probes: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'probe'))) }}"
    bad: "{{ probes | dict2items | rejectattr('value.healthy') }}"
  run_once: true

- name: Catch a hung engine - requests running or queued and no token generated for 10 s
  llmops.inference.sglang_probe:
    unit: sglang-qwen.service
    progress_window: 10
    fail_on_unhealthy: false
  register: probe

- name: After an unclean stop, twenty short generations in a row, each within 15 s
  llmops.inference.sglang_probe:
    unit: sglang-qwen.service
    expected_gpus: ["MIG-5c4a2d61-9a3e-5b35-8d2f-1a9a6c1e2f00"]
    soak_requests: 20
    generate_timeout: 15

- name: Floors for a speculative-decoding deployment
  llmops.inference.sglang_probe:
    unit: sglang-qwen.service
    max_new_tokens: 128
    min_tokens_per_s: 80
    min_accept_length: 2.5

- name: Export the result for node_exporter's textfile collector (run from a timer or cron)
  llmops.inference.sglang_probe:
    unit: sglang-qwen.service
    fail_on_unhealthy: false
    textfile_path: /var/lib/node_exporter/textfile_collector/sglang_probe.prom
"""

RETURN = r"""
msg:
  description:
    - "One line: C(sglang_probe: all tiers passed), or C(sglang_probe: <tier> failed: <reason>), followed by
      C(; GPU <n> needs a reset or a reboot: <evidence>) when RV(state) is C(needs_gpu_reset)."
  returned: always
  type: str
  sample: "sglang_probe: generate failed: generation timed out: no response from /generate within 60.0 s"
healthy:
  description: Whether every tier that ran passed.
  returned: always
  type: bool
  sample: false
state:
  description:
    - What the probe says about the host, most urgent first.
    - C(needs_gpu_reset) - unhealthy, and GPU memory that only a reset or a reboot frees is held (RV(unreapable)).
    - C(hung) - the C(progress) tier found requests running or queued and no token generated in the window.
    - C(not_serving) - any other failed tier. C(serving) - healthy.
  returned: always
  type: str
  choices: [serving, not_serving, hung, needs_gpu_reset]
  sample: hung
failed_tier:
  description: The first tier that failed, or null when healthy.
  returned: always
  type: str
  sample: gpu
reason:
  description: The failed tier's reason, or null when healthy.
  returned: always
  type: str
  sample: "unit active but its processes hold 0 MiB on GPU 0 (1 MiB used on the GPU in all): model not loaded"
tiers:
  description: Every tier, in order, with its outcome.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The tier (C(unit), C(gpu), C(progress), C(health), C(model), C(generate), C(floors), C(soak)).
      type: str
      sample: generate
    status:
      description: C(ok), C(failed) or C(skipped).
      type: str
      sample: failed
    reason:
      description: What was found (also for C(ok) tiers), or why the tier was skipped.
      type: str
      sample: "degenerate output: '!!!!!!!!' (one character repeated 8 times)"
    elapsed_s:
      description: Seconds the tier's checks took.
      type: float
      sample: 0.412
main_pid:
  description: The unit's MainPID at the end of the probe; null without O(unit).
  returned: always
  type: int
  sample: 4121
n_restarts:
  description: The unit's NRestarts at the end of the probe; null without O(unit).
  returned: always
  type: int
  sample: 0
active_state:
  description: The unit's ActiveState at the end of the probe; null without O(unit).
  returned: always
  type: str
  sample: active
gpu_memory_mib:
  description:
    - MiB held on each GPU (by index; a MIG device by its UUID) by the unit's processes, or used in all without
      O(unit).
  returned: when the C(gpu) tier listed the GPUs
  type: dict
  sample: {"0": 69324, "1": 69324}
gpu_errors:
  description: The NVML queries that failed, one entry per GPU and field; the field is unknown, the GPU still used.
  returned: always
  type: list
  elements: dict
  contains:
    gpu:
      description: The GPU's index (a MIG device's parent).
      type: int
    uuid:
      description: The GPU's or MIG device's UUID.
      type: str
    field:
      description: What could not be read (C(memory), C(processes), C(name), C(mig_mode), ...).
      type: str
      sample: processes
    error:
      description: NVML's error.
      type: str
      sample: Insufficient Permissions
progress:
  description: What the C(progress) tier saw; empty when it did not run.
  returned: always
  type: dict
  contains:
    window_s:
      description: O(progress_window).
      type: float
      sample: 10
    metrics:
      description: Whether C(/metrics) answered (false when the server runs without C(--enable-metrics)).
      type: bool
    verdict:
      description: C(idle), C(progressing), C(drained), C(hung) or C(reset) (the counters went backwards).
      type: str
      sample: hung
    running:
      description: Requests running at the last scrape.
      type: int
      sample: 3
    queued:
      description: Requests queued at the last scrape.
      type: int
      sample: 5
    generated_tokens:
      description: Growth of C(sglang:generation_tokens_total) (tokens of requests that finished) over the scrapes.
      type: float
      sample: 0
    processed_tokens:
      description: Growth of C(sglang:realtime_tokens_total) (tokens prefilled and decoded) over the scrapes.
      type: float
      sample: 0
    observed_s:
      description: Seconds between the first and the last scrape.
      type: float
      sample: 10.0
soak:
  description: What the C(soak) tier did; empty when it did not run.
  returned: always
  type: dict
  contains:
    requests:
      description: O(soak_requests).
      type: int
      sample: 20
    completed:
      description: Generations that passed.
      type: int
      sample: 6
    latencies_s:
      description: The latency of each generation that passed, in order.
      type: list
      elements: float
    failed_request:
      description: The number (from 1) of the generation that failed, or null.
      type: int
      sample: 7
unreapable:
  description:
    - On an unhealthy host, GPU memory on the expected GPUs that only a reset or a reboot frees, one entry per GPU
      and holder, in the form of RV(llmops.inference.nvidia_reap#module:unreapable) (C(gpu), C(uuid), C(pid),
      C(state), C(ppid), C(title), C(mib), C(evidence)).
  returned: always
  type: list
  elements: dict
reset_gpus:
  description: Indices of the GPUs in RV(unreapable).
  returned: always
  type: list
  elements: int
  sample: [0]
reset_message:
  description: The sentence C(GPU <n> needs a reset or a reboot) with the evidence of RV(unreapable), or null.
  returned: always
  type: str
  sample: >-
    GPU 0 needs a reset or a reboot: pid 4121 'sglang::scheduler_TP0' is a zombie (state Z, parent 1) holding 44000 MiB
model:
  description: What the server serves.
  returned: when the C(model) tier ran
  type: dict
  contains:
    model_path:
      description: C(model_path) from C(/model_info).
      type: str
      sample: /models/Qwen/Qwen3-8B
    served_model_name:
      description: C(served_model_name) from C(/model_info).
      type: str
      sample: Qwen/Qwen3-8B
    ids:
      description: Model ids from C(/v1/models).
      type: list
      elements: str
      sample: [Qwen/Qwen3-8B]
speculative:
  description: Speculative-decoding settings from C(/server_info); null values when it is off.
  returned: when the C(model) tier ran and C(/server_info) answered
  type: dict
  contains:
    algorithm:
      description: C(speculative_algorithm).
      type: str
      sample: EAGLE
    num_steps:
      description: C(speculative_num_steps).
      type: int
      sample: 3
    eagle_topk:
      description: C(speculative_eagle_topk).
      type: int
      sample: 1
    num_draft_tokens:
      description: C(speculative_num_draft_tokens).
      type: int
      sample: 4
generation:
  description: The test generation.
  returned: when the C(generate) tier got an answer
  type: dict
  contains:
    text:
      description: The generated text, cut to 200 characters.
      type: str
      sample: "2, 3, 5, 7, 11"
    completion_tokens:
      description: Tokens generated (C(meta_info.completion_tokens)).
      type: int
      sample: 32
    latency_s:
      description: Seconds from the request to the end of the stream.
      type: float
      sample: 0.61
    ttft_s:
      description: Seconds to the first streamed chunk (time to first token).
      type: float
      sample: 0.043
    tokens_per_s:
      description: Decode throughput, tokens after the first over the time after the first.
      type: float
      sample: 54.6
    accept_length:
      description: Speculative accept length (C(meta_info.spec_accept_length)); null without speculative decoding.
      type: float
      sample: 2.87
waited_s:
  description: Seconds waited before the deciding attempt began (0 without O(wait_timeout)).
  returned: always
  type: float
  sample: 41.5
elapsed_s:
  description: Seconds the whole probe took.
  returned: always
  type: float
  sample: 42.2
attempts:
  description: How many times the tiers were run.
  returned: always
  type: int
  sample: 84
url:
  description: The probed URL.
  returned: always
  type: str
  sample: http://127.0.0.1:30000
textfile_written:
  description: Whether O(textfile_path) was written (not in check mode).
  returned: when O(textfile_path) is set
  type: bool
  sample: true
journal:
  description: The unit's last O(journal_lines) journal lines after a failed tier, redacted.
  returned: when a tier failed, with O(unit) and O(journal_lines) above 0
  type: list
  elements: str
  sample: ["Dec 03 21:40:02 gw1 smg[812]: error: address already in use"]
option:
  description: The option that was refused.
  returned: when an option is invalid
  type: str
  sample: expect_regex
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.engine_times import journal_tail  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.module_support import (  # noqa: E402
    command_runner,
    fail_refused_option,
    refused_as,
)
from ansible_collections.llmops.inference.plugins.module_utils.probe import SglangProbe  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.probe_settings import (  # noqa: E402
    TIER_NAMES,
    ProbeInputError,
    ProbeSettings,
    gate_probe_spec,
)
from ansible_collections.llmops.inference.plugins.module_utils.redact import Redactor  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.sglang import (  # noqa: E402
    SglangClient,
    server_argument_spec,
)
from ansible_collections.llmops.inference.plugins.module_utils.textfile import (  # noqa: E402
    validate_textfile_path,
    write_probe_textfile,
)

ARGUMENT_SPEC = dict(
    server_argument_spec(),
    **dict(gate_probe_spec(), tp_size=dict(type="int", aliases=["tp"])),
    unit=dict(type="str"),
    tiers=dict(type="list", elements="str", choices=list(TIER_NAMES), default=list(TIER_NAMES)),
    timeout=dict(type="float", default=10),
    prompt=dict(type="str", default="List the first five prime numbers."),
    expect_regex=dict(type="str"),
    min_distinct_ratio=dict(type="float", default=0.25),
    expected_gpus=dict(type="raw"),
    gpu_backend=dict(type="str", choices=["auto", "nvml", "nvidia-smi"], default="auto"),
    stability_window=dict(type="float", default=0),
    wait_timeout=dict(type="float", default=0),
    poll_interval=dict(type="float", default=0.5),
    progress_window=dict(type="float"),
    progress_require_metrics=dict(type="bool", default=False),
    soak_requests=dict(type="int", default=0),
    soak_max_new_tokens=dict(type="int", default=8, no_log=False),
    unaccounted_threshold_mib=dict(type="int", default=1024),
    fail_on_unhealthy=dict(type="bool", default=True),
    textfile_path=dict(type="path"),
    journal_lines=dict(type="int", default=0),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        settings = ProbeSettings(**{name: params[name] for name in ProbeSettings.DEFAULTS}).validate()
        if params["textfile_path"]:
            with refused_as("textfile_path", ProbeInputError):
                validate_textfile_path(params["textfile_path"])
        with refused_as("journal_lines", ProbeInputError):
            if params["journal_lines"] < 0:
                raise ValueError(f"journal_lines must be 0 (no journal) or more, got {params['journal_lines']}")
    except ProbeInputError as exc:
        fail_refused_option(module, exc)

    client = SglangClient(
        settings.url, api_key=params["api_key"], timeout=settings.timeout, validate_certs=params["validate_certs"]
    )
    run_command = command_runner(module)
    probe = SglangProbe.for_host(settings, client, run_command, params["gpu_backend"])
    result = dict(probe.run(), url=settings.url, changed=False)
    if not result["healthy"] and settings.unit and params["journal_lines"] > 0:
        lines = journal_tail(run_command, settings.unit, params["journal_lines"])
        result["journal"] = Redactor([params["api_key"]]).value(lines)

    if params["textfile_path"]:
        result["textfile_written"] = not module.check_mode
        if not module.check_mode:
            write_probe_textfile(params["textfile_path"], result, settings.url, settings.unit)

    if result["healthy"]:
        module.exit_json(msg="sglang_probe: all tiers passed", **result)
    message = f"sglang_probe: {result['failed_tier']} failed: {result['reason']}"
    if result["reset_message"]:
        message += f"; {result['reset_message']}"
    if params["fail_on_unhealthy"]:
        module.fail_json(msg=message, **result)
    module.exit_json(msg=message, **result)


if __name__ == "__main__":
    main()
