#!/usr/bin/python
# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_restart
short_description: Restart an SGLang unit through the gated chain - gateway drain, stop, reap, start, gate, re-add
version_added: 0.2.0
description:
  - Restarts one systemd unit that runs an SGLang server, in one round trip, through a fixed chain whose steps are
    each timed and reported in RV(steps).
  - C(lock) - takes the host lock O(lock.path) (waits up to O(lock.timeout)), unless O(lock.token) says the caller
    holds it already. The lock is released at the end whatever happens.
  - C(unit) - reads the unit (ActiveState, SubState, MainPID, NRestarts, start limit, whether systemd needs a reload).
  - C(gateway_drain) - with O(gateways), reads every gateway replica first (one that cannot be used, or refuses
    O(gateway_api_key), fails the chain before anything is stopped), refuses - before anything is stopped - when
    removing the worker would leave a gateway with fewer than O(gateway_min_healthy) other healthy workers of its
    model (the message names the model and the healthy workers left), then removes the worker O(gateway_worker_url)
    from every replica and waits until none routes to it (replicas do not share a registry) - each lists it no
    more, or lists it as draining and unhealthy (smg 1.13.0 does so at once and drops it about 5 s later; the
    engine's own C(/metrics), next, tell what is still in flight). Skipped without O(gateways). A replica that cannot
    be reached stops the chain here, or with O(gateway_unreachable=warn) is left aside with a warning naming it; one
    that stops answering after it accepted the removal routes nothing to the worker and is left aside either way.
  - C(drain_wait) - waits while the engine's own C(/metrics) shows C(sglang:num_running_reqs) or
    C(sglang:num_queue_reqs) above 0, at most O(drain_timeout) seconds; a budget that ends first is the status
    C(expired) with the counts left. These gauges never prove the engine idle (SGLang publishes them every
    C(decode_log_interval) decode steps, without the batch just admitted or requests still being tokenized) - the
    stop that follows waits for SGLang's own drain, which counts every request.
  - C(stop) - a unit caught in a restart loop (waiting to restart, starting again after automatic restarts, or
    active again after them while its engine's C(/ready) does not answer 200) is killed with SIGKILL; it serves
    nothing, and a drain would only wait for processes that may ignore SIGTERM. A running unit is stopped with
    C(systemctl stop), which runs its C(ExecStop) drain (the sglang_service role's unit sends SIGTERM to the main
    process alone and waits until SGLang's own drain has answered every request and the process exited) within
    C(TimeoutStopSec).
  - C(reset_failed) - clears the failed state and the start counter; systemd counts the chain's own starts against
    C(StartLimitBurst).
  - C(reap) - reaps GPU holders left in the unit's cgroup, then processes titled C(^sglang::) that were orphaned on
    the unit's GPUs (SIGTERM, O(reap.grace), SIGKILL), and waits until every GPU of the unit uses at most
    O(reap.threshold_mib) (memory is released some time after its holder exits). When the reaper reports memory it
    cannot free (a holder that survives SIGKILL, memory held with no process), the chain fails with
    C(GPU n needs a reset or a reboot) and the evidence, and does not start the unit, which stays stopped.
  - C(daemon_reload) - only when systemd says the unit's files changed since it read them.
  - C(start) - C(systemctl start --no-block); the engine loads while the gate polls.
  - C(gate) - polls the unit (every 0.1 s) until the server is ready, failing at once when the unit dies or
    restarts; then runs the C(sglang_probe) tiers (unit, gpu, health, model, generate, floors). The stability window
    (O(stability_window)) starts when the server first answers C(/health) with 200 and overlaps the tiers; what is
    left of it after the tiers is polled, and the gate fails as soon as MainPID, NRestarts or ActiveState move. A unit
    that ends C(inactive) because its main process exited with status 0 is a failed gate with that reason. After an
    unclean stop (the reap found holders) the probe adds a soak of O(soak) short generations.
  - A gate that fails on the C(gpu) tier (the unit is active but its processes hold no model) is retried (stop, reap,
    start, gate) up to the unit's C(StartLimitBurst) starts (O(max_starts)); then the chain fails with the gpu tier's
    reason and leaves the last attempt running, so the host does not flap and its state and journal can be read.
  - C(gateway_add) - with O(gateways), on a pass, adds the worker to every replica that can be used (one still
    listing it as draining first drops that entry) and waits until each reports it healthy (at most
    O(gateway_wait_timeout)). A replica that cannot be used never keeps the worker out of the others - it is back in
    every one that works - and is named in RV(msg) and RV(gateway); one that cannot be reached then fails the step
    (O(gateway_unreachable=fail)) or is a warning (O(gateway_unreachable=warn)); one that answers but cannot be used
    fails it either way. A failed gate (or a failed stop, reap or start) leaves the worker out of every gateway, and
    RV(gateway) and RV(msg) say so.
  - C(snapshot) - on a pass, saves the known-good snapshot (O(known_good)).
  - On a failure, the result carries the failing step or tier, the probe's reason, the unit's state after
    (ActiveState, SubState, Result, NRestarts, and the start limit when it applies) and the journal's tail.
  - A multi-node engine (SGLang's C(--nnodes)) restarts as one - every member in lockstep, which the caller runs
    (the C(llmops.inference.sglang_service) role does) - through O(phase). V(stop) - C(lock), C(unit),
    C(gateway_drain), C(stop), C(reset_failed), C(reap); the unit stays stopped. Rank 0 first - its drain ends the
    ranks >= 1 with SGLang's C(ShutdownReq) - then the others. V(start) - C(daemon_reload), C(start) of a stopped unit
    (a running one fails the step). V(gate) - C(gate) of that start (one attempt, no soak), C(gateway_add),
    C(snapshot). V(all) - the whole chain on one host, as above.
  - With O(node_rank) >= 1 the member runs no API - SGLang starts only its schedulers and a dummy health server
    there - so its gate probes the C(unit), C(gpu) and C(health) tiers with the stability window, without the
    generation, and its stop does not drain - SGLang's rank >= 1 only logs a SIGTERM and stops on rank 0's
    C(ShutdownReq) - with O(phase=stop) the chain waits up to 30 s for it to end after rank 0's stop
    (step C(follow_rank0)), then kills it with SIGKILL.
  - "Everything returned is redacted - O(api_key), O(redact) and the C(api_key='...'), C(--api-key X),
    C(api-key: X) and C(Authorization: Bearer X) forms - so a journal line of the engine's arguments cannot leak it."
author:
  - llmops.inference contributors (@llmops)
requirements:
  - Linux with systemd; C(journalctl).
  - For the reap and the gpu tier, Python package C(nvidia-ml-py) (module C(pynvml)) or C(nvidia-smi).
attributes:
  check_mode:
    support: full
    description:
      - Reads the unit, the lock and the gateways and reports the plan in RV(plan) - the gateways the worker would
        be removed from and added back to, the stop mode, what the reaper would reap, the start, the gate - and
        changes nothing. C(changed) is true (a restart would run). A gateway that cannot be used or a removal that
        O(gateway_min_healthy) refuses fails as it would in a real run.
  diff_mode:
    support: full
    description: The unit's ActiveState, SubState and MainPID before and after (in check mode, the expected state).
  idempotent:
    support: none
    description: Every run restarts the unit; C(changed) is true whenever the chain ran.
extends_documentation_fragment:
  - llmops.inference.sglang_server
options:
  unit:
    description:
      - The systemd unit that runs the server (C(.service) is added to a name without a unit type).
    type: str
    required: true
  gpus:
    description:
      - The unit's GPUs, by index or UUID (C(GPU-...), C(MIG-...)), as its C(CUDA_VISIBLE_DEVICES) places the engine.
        The reaper, the GPU wait and the probe's C(gpu) tier use this set. Empty means every GPU of the host.
    type: list
    elements: str
    default: []
  ready_timeout:
    description:
      - Seconds the gate waits, after the start, for the server to be ready (weights and warm-up).
    type: float
    default: 1260
  ready_when_active:
    description:
      - The unit turns C(active) only once C(/health) answered 200 (an C(ExecStartPost) readiness gate, as the
        sglang_service role's unit has), so the gate takes the moment it turned active as the first 200 instead of
        asking C(/health) itself (which SGLang answers with a one-token generation).
    type: bool
    default: false
  stability_window:
    description:
      - Seconds after the first C(/health) 200 during which MainPID, NRestarts and ActiveState must not move. It
        overlaps the probe's tiers; each restart costs what is left of it after them.
      - The default catches an engine that exits a few seconds after it became ready, which would otherwise pass
        the gate and get a known-good snapshot while the host then sits stopped.
    type: float
    default: 5
  soak:
    description:
      - Short generations the probe runs one after the other after an unclean stop (the reap found holders). C(0)
        turns the soak off.
    type: int
    default: 3
  max_starts:
    description:
      - How many starts a gate that fails on the C(gpu) tier may take. Default is the unit's C(StartLimitBurst).
    type: int
  reap:
    description: How the leftovers and orphans are reaped.
    type: dict
    default: {}
    suboptions:
      grace:
        description: Seconds between SIGTERM and SIGKILL.
        type: float
        default: 10
      timeout:
        description: Seconds to wait, after the last signal, for the exits and for the memory to be released.
        type: float
        default: 60
      threshold_mib:
        description: The memory each GPU of the unit may still use before the start (the start gate's threshold).
        type: int
        default: 1024
  probe:
    description: The probe gate's checks (see M(llmops.inference.sglang_probe)).
    type: dict
    default: {}
    suboptions:
      expected_model:
        description: The model the server must serve.
        type: str
      min_gpu_memory_mib:
        description: MiB the unit's processes must hold on each of its GPUs.
        type: int
        default: 1024
      max_new_tokens:
        description: Tokens of the test generation.
        type: int
        default: 32
      generate_timeout:
        description: Seconds the test generation may take.
        type: float
        default: 60
      min_tokens_per_s:
        description: Floor for the generation's decode throughput.
        type: float
      min_accept_length:
        description: Floor for the speculative accept length.
        type: float
      tp_size:
        description: The server's C(--tp-size); the count of GPUs that must hold memory when O(gpus) is empty.
        type: int
  lock:
    description:
      - The host lock (see M(llmops.inference.host_lock)). Without O(lock.path) the chain takes no lock.
    type: dict
    default: {}
    suboptions:
      path:
        description: The lock file, such as C(/run/lock/llmops-NAME.lock).
        type: path
      token:
        description:
          - The token of a lock the caller holds (from M(llmops.inference.host_lock)); the chain checks that it is
            still held with it and neither takes nor releases it. The caller's run renews it.
          - Before each step the chain checks again that the lock is still held (with this token, or the one it took
            itself). A lock lost meanwhile (broken with O(llmops.inference.host_lock#module:force=true), or let go
            because its run stopped renewing it) stops the chain before that step with C(failed_step=lock_lost);
            nothing after it is done, and the result's C(service) fields say the state the unit was left in.
        type: str
      owner:
        description: Who takes the lock, recorded in it and shown to a run that has to wait.
        type: dict
        default: {}
      timeout:
        description: Seconds to wait for another holder.
        type: float
        default: 600
      renew_period:
        description:
          - How often the lock's run renews it, in seconds. A lock the chain takes itself is renewed by the module
            for as long as it runs.
        type: float
        default: 30
      renew_margin:
        description:
          - Seconds, beyond O(lock.renew_period), that the lock outlives its last renewal; a killed run blocks others
            at most O(lock.renew_period) + O(lock.renew_margin) seconds.
        type: float
        default: 60
      retake:
        description:
          - When O(lock.token) no longer holds the lock, take it anew at once (without waiting) for this run of the
            chain, and release it at its end; when another run holds it now, fail at the C(lock) step and change
            nothing. For the stop of a failed group restart, which must not need the lock it may have lost.
        type: bool
        default: false
  known_good:
    description:
      - Where the known-good snapshot is saved after a passing gate. Without O(known_good.root), none is saved.
    type: dict
    default: {}
    suboptions:
      root:
        description: The snapshot store of this unit.
        type: path
      files:
        description: The files to record, by name (C(unit), C(environment), C(config), ...).
        type: dict
        default: {}
      dropin_dir:
        description: The unit's drop-in directory; its C(*.conf) files are recorded too.
        type: path
      patch_state_id:
        description: The patch state of SGLang's sources, recorded in the manifest.
        type: str
        default: unknown
      python:
        description: The engine's interpreter, naming the SGLang installation whose sources the snapshot records.
        type: path
  journal_lines:
    description: Journal lines returned after a failure.
    type: int
    default: 30
  gateways:
    description:
      - The gateway replicas (SGLang Model Gateway C(smg), or C(sglang-router)) that route to this worker, as
        C(http://host:port) URLs. Each one is changed and checked on its own. Empty (the default) skips the gateway
        steps.
    type: list
    elements: str
    default: []
  gateway_api_key:
    description:
      - The gateways' admin API key (C(Authorization Bearer)), for listing, adding and removing workers. The worker is
        added with O(api_key) as its own key.
    type: str
  gateway_worker_url:
    description:
      - This worker's URL as the gateways reach it (not the loopback address the gate uses). Default is O(url).
    type: str
  gateway_min_healthy:
    description:
      - The healthy workers of the same model each gateway must keep besides this one; the chain refuses the
        restart before the stop otherwise. C(0) turns the check off.
    type: int
    default: 1
  gateway_wait_timeout:
    description: Seconds to wait until every gateway has removed the worker, and until every one reports it healthy.
    type: float
    default: 120
  gateway_unreachable:
    description:
      - What a gateway replica that cannot be reached (no connection, no answer in time) does to the chain.
      - V(fail) - before the removal, the chain fails before anything is stopped; after the gate, the worker is added
        back to every other replica first, then the C(gateway_add) step fails naming the replica.
      - V(warn) - the replica is left aside with a warning naming it, before the stop as after the gate, and the
        chain goes on with the others. Before the stop this trusts that a replica the host cannot reach routes
        nothing to it either.
    type: str
    choices: [fail, warn]
    default: fail
  drain_timeout:
    description:
      - Seconds to wait at most, after the removal from the gateways, while the engine's C(/metrics) shows requests
        in flight. It reads C(sglang:http_requests_active) (SGLang's live count of HTTP requests, until a stream's
        last byte), summed over every endpoint but C(/metrics), C(/health*), C(/ready) and C(/ping). Where the engine
        does not export it, it falls back to the scheduler's gauges C(sglang:num_running_reqs) and
        C(sglang:num_queue_reqs), which lag and never prove the engine idle. The step's detail and RV(gateway)
        say which it waited on. Either way the stop that follows waits for SGLang's own drain.
    type: float
    default: 120
  redact:
    description: More secrets to mask in everything returned, besides O(api_key) and O(gateway_api_key).
    type: list
    elements: str
    default: []
  fail_on_unhealthy:
    description:
      - Fail when the gate fails, with RV(msg). Set to V(false) to decide afterwards (RV(healthy)); a step that
        fails before the gate (lock, stop, reap, start) always fails the task.
    type: bool
    default: true
  phase:
    description:
      - Which part of the chain to run. V(all) - the whole chain on one host. V(stop), V(start), V(gate) - one step of
        a group restart of a multi-node engine, run on every member of the group together (see the description).
    type: str
    choices: [all, stop, start, gate]
    default: all
  node_rank:
    description:
      - This host's rank in a multi-node engine (SGLang's C(--node-rank)); V(0) for rank 0 and for an engine on one
        host. A rank >= 1 serves no API - its gate is the unit, its GPUs and its health server, its stop a kill - and
        takes no O(gateways).
    type: int
    default: 0
  reference:
    description:
      - The reference gate, after the probe's tiers pass - see the runbook "a deploy was rolled back by the reference
        gate". The known-good store under O(known_good.root) keeps a reference of how the known-good build behaved -
        golden outputs (greedy token ids and their logprobs for O(reference.prompts)) and a performance fingerprint
        (tok/s at each O(reference.concurrency), TTFT and ITL medians, the accept length when speculating; each the
        median of O(reference.repeats) runs with its spread).
      - A restart whose engine inputs (the unit's files, its environment file and drop-ins, the SGLang sources and
        version) differ from the current known-good snapshot's is held to it - the golden continuation scored
        teacher-forced (SGLang's C(/generate) with C(input_ids), C(return_logprob), C(logprob_start_len) and
        C(max_new_tokens) 0, or 1 with speculation) and free-running, and the fingerprint measured again. A failure
        is a failed gate on the C(reference) tier whose reason names each failed check, by how much, and the
        reference; RV(reference) has every figure.
      - A passing gate that saved a snapshot records a reference when there is none. Nothing else records one but
        O(reference.accept).
    type: dict
    default: {}
    version_added: 0.2.0
    suboptions:
      mode:
        description:
          - V(changed) checks restarts whose engine inputs changed; V(always) every restart; V(off) never (and
            records none).
        type: str
        choices: [changed, always, "off"]
        default: changed
      accept:
        description:
          - Accept an intended change (a new model, a deliberate numerics change) - after a passing gate the
            reference is measured and recorded anew, and the C(status) of RV(reference) says V(accepted); nothing is
            compared.
        type: bool
        default: false
      record_missing:
        description: Record a reference after a passing gate and snapshot when there is none yet.
        type: bool
        default: true
      prompts:
        description: The golden prompts, decoded greedily at batch size 1.
        type: list
        elements: str
        default:
          - Explain in three sentences why the sky is blue.
          - Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.
          - List the planets of the solar system in order from the sun, one per line.
      max_new_tokens:
        description: Tokens of each golden output (32 to 64 is enough to catch a drift without costing much).
        type: int
        default: 48
      logprob_tolerance:
        description:
          - The largest gap, in nats, between a golden token's teacher-forced logprob now and the recorded one. Run to
            run on one build at batch size 1 the gap is about 1e-3; a wrong numerics change moves whole nats. With
            SGLang's C(--enable-deterministic-inference) it can be tightened towards 0.
        type: float
        default: 0.1
      speed_tolerance:
        description:
          - How far a new median may fall below the reference's slowest repeat (throughput, accept length) or rise
            above its slowest (latencies), as a fraction; V(0.1) is 10 %.
        type: float
        default: 0.1
      latency_floor_ms:
        description: Milliseconds a latency median may add beyond O(reference.speed_tolerance) (noise on any machine).
        type: float
        default: 5.0
      concurrency:
        description: The concurrency levels of the fingerprint; TTFT, ITL and the accept length are taken at the lowest.
        type: list
        elements: int
        default: [1, 4]
      requests_per_user:
        description: Requests per concurrent user in each repeat of each level.
        type: int
        default: 2
      repeats:
        description: Repeats of each level; each figure is their median, with their spread.
        type: int
        default: 3
      perf_max_new_tokens:
        description: Tokens of each fingerprint request.
        type: int
        default: 64
      timeout:
        description: Seconds one reference request may take.
        type: float
        default: 120.0
notes:
  - The role C(llmops.inference.sglang_service) templates a unit this chain restarts (with the C(ExecStop) drain and
    the readiness gate) and calls the chain from C(tasks_from=restart).
  - The chain polls every 0.1 s and never sleeps a fixed time; its cost over the engine's own drain and load is
    what is left of O(stability_window) after the probe's tiers, and the probe itself.
seealso:
  - module: llmops.inference.sglang_probe
  - module: llmops.inference.nvidia_reap
  - module: llmops.inference.host_lock
"""

EXAMPLES = r"""
- name: Restart SGLang through the gated chain
  llmops.inference.sglang_restart:
    unit: sglang-qwen.service
    url: http://127.0.0.1:30000
    gpus: ["0", "1"]
    ready_when_active: true
    probe:
      expected_model: Qwen/Qwen3-8B
    lock:
      path: /run/lock/llmops-sglang-qwen.lock
      owner: {play: "{{ ansible_play_name }}"}
    known_good:
      root: /var/lib/llmops/known-good/sglang-qwen
      files:
        unit: /etc/systemd/system/sglang-qwen.service
        environment: /etc/llmops/sglang-qwen.env
      dropin_dir: /etc/systemd/system/sglang-qwen.service.d
      python: /opt/sglang/venv/bin/python
  register: gate

- name: A sweep point - record a failed gate and go on
  llmops.inference.sglang_restart:
    unit: sglang-qwen.service
    gpus: ["0", "1"]
    fail_on_unhealthy: false
  register: gate

- name: Restart a worker behind two gateway replicas without dropping a request
  llmops.inference.sglang_restart:
    unit: sglang-qwen.service
    ready_when_active: true
    gateways:
      - http://10.0.0.9:30080
      - http://10.0.0.10:30080
    gateway_api_key: "{{ vault_gateway_admin_key }}"
    gateway_worker_url: http://10.0.0.5:30000
    gateway_min_healthy: 1
    drain_timeout: 120
  register: gate

- name: One step of a group restart - the gate of rank 1 of a two-host engine, after every member was started
  llmops.inference.sglang_restart:
    unit: sglang-qwen.service
    phase: gate
    node_rank: 1
    gpus: ["0", "1", "2", "3", "4", "5", "6", "7"]
  register: rank_gate

- name: Show what a restart would do
  llmops.inference.sglang_restart:
    unit: sglang-qwen.service
  check_mode: true
  diff: true
"""

RETURN = r"""
reference:
  description:
    - The reference gate's result (O(reference)); null when O(reference.mode=off).
    - C(status) is V(passed), V(failed), V(skipped) (a routine restart, a rank >= 1, no store), V(missing) (none
      recorded, nothing compared), V(recorded) (the first reference, after the snapshot), V(accepted)
      (O(reference.accept) recorded it anew), or V(not_recorded). C(reason) says why; C(checks) lists each check
      (C(check), C(passed), C(detail) and its figures - C(token) and C(gap) for C(logprobs), C(first_difference)
      for C(greedy_tokens), C(ratio), C(median), C(spread), C(reference_median), C(reference_spread) for the speed
      figures); C(failed_checks) names the failed ones; C(reference) says which reference (C(recorded_at),
      C(snapshot_saved_at), C(why), C(settings)); C(fingerprint) the figures measured.
  returned: always
  type: dict
  version_added: 0.2.0
  sample: {"status": "failed", "failed_checks": ["tok_s_c1"], "reason": "against the reference recorded ..."}
msg:
  description:
    - One line when the gate passed; after a failure the failing step or tier with its reason, the unit's state
      and the journal's tail, one per line.
  returned: always
  type: str
  sample: "sglang-qwen.service failed its gate: gpu tier: unit active but its processes hold 0 MiB on GPU 0"
healthy:
  description: Whether the gate passed and the snapshot was saved (null in check mode).
  returned: always
  type: bool
  sample: true
gate:
  description: The chain's verdict and the gate's findings.
  returned: always
  type: dict
  version_added: 0.2.0
  contains:
    failed_step:
      description:
        - The step that failed before or after the gate (C(lock), C(unit), C(gateway_drain), C(follow_rank0),
          C(stop), C(reap), C(start), C(gateway_add), C(snapshot)), or null.
      type: str
      sample: reap
    failed_tier:
      description: The gate's failed tier (C(unit), C(gpu), C(health), C(model), C(generate), C(floors)), or null.
      type: str
      sample: gpu
    reason:
      description: Why the step or tier failed, or null.
      type: str
      sample: "GPU 1 needs a reset or a reboot: pid 7001 (state D) holds 44000 MiB after SIGKILL"
    tiers:
      description:
        - The gate's tiers, each with C(name), C(status), C(reason), C(elapsed_s) (as
          M(llmops.inference.sglang_probe)).
      type: list
      elements: dict
    attempts:
      description: Starts the chain made (more than one when the gpu tier failed and was retried).
      type: int
      sample: 1
    per_attempt:
      description: Each attempt's gate, with C(attempt), C(healthy), C(failed_tier), C(reason), C(main_pid).
      type: list
      elements: dict
    soak:
      description: Short generations the probe ran after an unclean stop (0 after a clean one).
      type: int
      sample: 0
    model:
      description: What the server serves (C(model_path), C(served_model_name), C(ids)).
      type: dict
    speculative:
      description: The server's speculative-decoding settings.
      type: dict
    generation:
      description: The gate's test generation.
      type: dict
service:
  description:
    - The unit and its state after the chain.
  returned: always
  type: dict
  version_added: 0.2.0
  contains:
    name:
      description: The unit.
      type: str
      sample: sglang-qwen.service
    active_state:
      description: ActiveState after the chain.
      type: str
      sample: active
    sub_state:
      description: SubState after the chain.
      type: str
    result:
      description: systemd's C(Result) of the unit after the chain (C(start-limit-hit) when systemd gave up).
      type: str
    main_pid:
      description: The unit's MainPID after the chain.
      type: int
      sample: 4121
    n_restarts:
      description: NRestarts after the chain.
      type: int
    start_limit:
      description: The unit's start limit in words.
      type: str
      sample: StartLimitBurst=3 starts within StartLimitIntervalSec=3630 s
    stop_mode:
      description:
        - C(kill) (a restart loop), C(drain) (a running unit), C(none) (nothing ran) or C(ended) (a member of
          O(node_rank) >= 1 that ended cleanly on rank 0's C(ShutdownReq) and waits for its automatic restart, which
          the stop cancels).
      type: str
      sample: drain
    start:
      description: C(queued) once the start job was queued, else null.
      type: str
    journal:
      description: The journal's last O(journal_lines) lines after a failure (redacted).
      type: list
      elements: str
    lock:
      description: The lock the chain used (C(path), C(taken)).
      type: dict
    snapshot:
      description: What the known-good snapshot step did, or null.
      type: str
      sample: snapshot saved
gpu:
  description: The unit's GPUs - what its processes hold, and what the reaper did.
  returned: always
  type: dict
  version_added: 0.2.0
  contains:
    memory_mib:
      description: MiB the unit's processes hold on each GPU (by index).
      type: dict
    reaped:
      description:
        - The processes the reaper signalled, with C(pid), C(title), C(unit), C(gpus), C(used_mib), C(signals),
          C(exited).
      type: list
      elements: dict
    unreapable:
      description: GPU memory the reaper could not free, with C(gpu), C(uuid), C(pid), C(state), C(mib), C(evidence).
      type: list
      elements: dict
steps:
  description:
    - Every step in order, each with C(name), C(attempt), C(status) (C(ok), C(failed), C(skipped), C(planned), and
      C(expired) for a C(drain_wait) whose budget ended), C(detail), C(elapsed_s).
  returned: always
  type: list
  elements: dict
  sample:
    - {name: stop, attempt: 1, status: ok, detail: "active (running): stopped through its ExecStop", elapsed_s: 0.61}
gateway:
  description:
    - With O(gateways), where the worker is - C(worker_url), C(gateways), C(min_healthy), C(removed_from) (the
      gateways that listed it and removed it, or would in check mode), C(draining_on) (those that still listed it
      as draining when the chain went on), C(drain) (C(idle), C(waited_s), C(source) - V(http_requests_active) or
      V(scheduler gauges), null when C(/metrics) did not answer - C(requests) (the count it waited on), C(running),
      C(queued) (the scheduler's gauges, null where not exported)), C(added_to), C(unreachable) (the replicas left
      aside because they could not be reached),
      C(left_out) (the replicas that do not have it back after a failure), C(in_gateways) (true once every gateway
      reports it healthy again - with O(gateway_unreachable=warn), every one it could reach - false when it is left
      out of one after a failure, null when nothing was changed) and C(detail). Null without O(gateways).
  returned: always
  type: dict
  sample:
    worker_url: http://10.0.0.5:30000
    gateways: [http://10.0.0.9:30080, http://10.0.0.10:30080]
    min_healthy: 1
    removed_from: [http://10.0.0.9:30080, http://10.0.0.10:30080]
    draining_on: [http://10.0.0.9:30080, http://10.0.0.10:30080]
    drain: {idle: true, waited_s: 2.4, source: http_requests_active, requests: 0, running: 0, queued: 0}
    added_to: [http://10.0.0.9:30080, http://10.0.0.10:30080]
    unreachable: []
    left_out: []
    in_gateways: true
    detail: "http://10.0.0.5:30000 healthy on all 2 gateway(s): http://10.0.0.9:30080, http://10.0.0.10:30080"
phase:
  description: The O(phase) that ran.
  returned: always
  type: str
  sample: all
node_rank:
  description: The O(node_rank) the chain ran as.
  returned: always
  type: int
  sample: 0
plan:
  description:
    - In check mode, what the chain would do (C(gateway), C(stop), C(reap), C(daemon_reload), C(start), C(gate),
      C(snapshot)).
  returned: check mode
  type: dict
elapsed_s:
  description: Seconds the whole chain took.
  returned: always
  type: float
  sample: 13.4
option:
  description: The option that was refused.
  returned: when an option is invalid
  type: str
  sample: stability_window
failed_step:
  description: Deprecated - use RV(gate.failed_step), the same value; removed in 2.0.0.
  returned: always
  type: str
failed_tier:
  description: Deprecated - use RV(gate.failed_tier), the same value; removed in 2.0.0.
  returned: always
  type: str
reason:
  description: Deprecated - use RV(gate.reason), the same value; removed in 2.0.0.
  returned: always
  type: str
tiers:
  description: Deprecated - use RV(gate.tiers), the same value; removed in 2.0.0.
  returned: always
  type: list
attempts:
  description: Deprecated - use RV(gate.attempts), the same value; removed in 2.0.0.
  returned: always
  type: int
gates:
  description: Deprecated - use RV(gate.per_attempt), the same value; removed in 2.0.0.
  returned: always
  type: list
soak:
  description: Deprecated - use RV(gate.soak), the same value; removed in 2.0.0.
  returned: always
  type: int
model:
  description: Deprecated - use RV(gate.model), the same value; removed in 2.0.0.
  returned: always
  type: dict
speculative:
  description: Deprecated - use RV(gate.speculative), the same value; removed in 2.0.0.
  returned: always
  type: dict
generation:
  description: Deprecated - use RV(gate.generation), the same value; removed in 2.0.0.
  returned: always
  type: dict
unit:
  description: Deprecated - use RV(service.name), the same value; removed in 2.0.0.
  returned: always
  type: str
  sample: sglang-qwen.service
active_state:
  description: Deprecated - use RV(service.active_state), the same value; removed in 2.0.0.
  returned: always
  type: str
sub_state:
  description: Deprecated - use RV(service.sub_state), the same value; removed in 2.0.0.
  returned: always
  type: str
result:
  description: Deprecated - use RV(service.result), the same value; removed in 2.0.0.
  returned: always
  type: str
main_pid:
  description: Deprecated - use RV(service.main_pid), the same value; removed in 2.0.0.
  returned: always
  type: int
n_restarts:
  description: Deprecated - use RV(service.n_restarts), the same value; removed in 2.0.0.
  returned: always
  type: int
start_limit:
  description: Deprecated - use RV(service.start_limit), the same value; removed in 2.0.0.
  returned: always
  type: str
stop_mode:
  description: Deprecated - use RV(service.stop_mode), the same value; removed in 2.0.0.
  returned: always
  type: str
start:
  description: Deprecated - use RV(service.start), the same value; removed in 2.0.0.
  returned: always
  type: str
journal:
  description: Deprecated - use RV(service.journal), the same value; removed in 2.0.0.
  returned: always
  type: list
lock:
  description: Deprecated - use RV(service.lock), the same value; removed in 2.0.0.
  returned: always
  type: dict
snapshot:
  description: Deprecated - use RV(service.snapshot), the same value; removed in 2.0.0.
  returned: always
  type: str
gpu_memory_mib:
  description: Deprecated - use RV(gpu.memory_mib), the same value; removed in 2.0.0.
  returned: always
  type: dict
reaped:
  description: Deprecated - use RV(gpu.reaped), the same value; removed in 2.0.0.
  returned: always
  type: list
unreapable:
  description: Deprecated - use RV(gpu.unreapable), the same value; removed in 2.0.0.
  returned: always
  type: list
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - Ansible modules import after their docs

from ansible_collections.llmops.inference.plugins.module_utils.module_support import (  # noqa: E402
    command_runner,
    fail_refused_option,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.chain import RestartChain  # noqa: E402
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (  # noqa: E402
    ARGUMENT_SPEC,
    ChainInputError,
    parse_chain_options,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.runners import Runners  # noqa: E402


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        options = parse_chain_options(module.params)
    except ChainInputError as exc:
        fail_refused_option(module, exc)
    result = RestartChain(options, Runners(command_runner(module))).run(check_mode=module.check_mode)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    if result["gate"]["failed_step"] or (result["healthy"] is False and module.params["fail_on_unhealthy"]):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
