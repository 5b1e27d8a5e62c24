"""Write docs/performance.md from the raw benchmark data of one ``make bench`` run (docs/performance/<run>/*.json).

Every number on the page is computed here from those files and nothing else, so the page can be checked and
regenerated: ``python tests/bench/write_performance.py`` gives the same page, byte for byte, from the same files.
The newest run directory is used unless ``--run NAME`` names another. Targets and the explanation of what limits a
missed figure are kept here, apart from the code they measure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "performance"
OUTPUT = ROOT / "docs" / "performance.md"


# -- reading ---------------------------------------------------------------------------------------------------------
def load_run(run: str | None) -> tuple:
    runs = sorted(path.name for path in DATA.iterdir() if path.is_dir()) if DATA.is_dir() else []
    if not runs and run is None:
        return None, {}
    name = run or runs[-1]
    if name not in runs:
        sys.exit(f"no run {name!r} under {DATA} (runs: {', '.join(runs)})")
    files = {path.stem: json.loads(path.read_text()) for path in sorted((DATA / name).glob("*.json"))}
    return name, files


def mixed_or_dirty(run: str, files: dict) -> str:
    """Why the data files are not one ``make bench`` run at one clean commit; empty when they are."""
    problems = []
    runs = sorted({str(data.get("run")) for data in files.values()})
    if runs != [run]:
        problems.append(f"the files come from the runs {', '.join(runs)}")
    shas = sorted({(data.get("commit") or {}).get("sha") or "unknown" for data in files.values()})
    if len(shas) > 1:
        per_file = ", ".join(
            f"{name} at {(data.get('commit') or {}).get('sha', 'unknown')[:12]}" for name, data in files.items()
        )
        problems.append(f"they were measured at {len(shas)} commits ({per_file})")
    dirty = [name for name, data in files.items() if (data.get("commit") or {}).get("dirty", True)]
    if dirty:
        problems.append(f"{', '.join(dirty)} measured with uncommitted changes")
    return "; ".join(problems)


def samples(data: dict, **match) -> list:
    return [s for s in data["samples"] if all(s.get(key) == value for key, value in match.items())]


def by_round(data: dict, **match) -> dict:
    return {s["round"]: s for s in samples(data, **match)}


def paired(data: dict, numerator: dict, denominator: dict, value=None) -> list:
    """One value per round in which both sides succeeded: numerator seconds / denominator seconds unless ``value``
    says otherwise."""
    tops, bottoms = by_round(data, **numerator), by_round(data, **denominator)
    compute = value or (lambda top, bottom: top["seconds"] / bottom["seconds"])
    good = [r for r in sorted(tops) if r in bottoms and tops[r].get("ok", True) and bottoms[r].get("ok", True)]
    return [compute(tops[r], bottoms[r]) for r in good]


def failures(data: dict, **match) -> list:
    """Context lines for the samples of ``match`` that did not succeed."""
    failed = [s for s in samples(data, **match) if s.get("ok") is False]
    if not failed:
        return []
    errors = sorted({str(s.get("error") or "did not succeed")[:200] for s in failed})
    return [f"{len(failed)} run(s) of {', '.join(f'{k} {v}' for k, v in match.items())} failed: {'; '.join(errors)}"]


def spread(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    median = statistics.median(values)
    if all(isinstance(v, int) for v in values) and float(median).is_integer():
        median = int(median)  # a count: the median of an even number of runs is a float even when it is whole
    return {"min": min(values), "median": median, "max": max(values), "n": len(values)}


# -- formatting ------------------------------------------------------------------------------------------------------
def num(value: float, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{int(value)}{unit}"
    digits = 2 if abs(value) < 10 else 1
    return f"{value:.{digits}f}{unit}"


def show(stats: dict | None, unit: str = "") -> str:
    if stats is None:
        return "not measured"
    if stats["n"] == 1:
        return f"{num(stats['median'], unit)} (1 run)"
    return f"{num(stats['median'], unit)} [{num(stats['min'], unit)} to {num(stats['max'], unit)}], {stats['n']} runs"


def seconds(data: dict, **match) -> dict | None:
    return spread([s["seconds"] for s in samples(data, **match) if s.get("ok", True)])


class Figure:
    """One published figure: what it compares, how, its per-run values, its target and, when missed, why."""

    def __init__(self, key, title, compares, numerator, denominator, values, unit, target, met, context=(), limits=""):
        self.key, self.title, self.compares = key, title, compares
        self.numerator, self.denominator = numerator, denominator
        self.stats = spread(values)
        self.values = values
        self.unit, self.target = unit, target
        self.met = None if self.stats is None else met(self.stats, values)
        self.context = list(context)
        self.limits = limits


# A target is met when every run meets it, missed when none does; runs on both sides of it prove neither.
INCONCLUSIVE = "inconclusive"


def judged(every_run_meets: bool, no_run_meets: bool):
    return True if every_run_meets else False if no_run_meets else INCONCLUSIVE


def at_most(bound: float):
    return lambda stats, values: judged(stats["max"] <= bound, stats["min"] > bound)


def at_least(bound: float):
    return lambda stats, values: judged(stats["min"] >= bound, stats["max"] < bound)


no_worse = at_most(1.0)
NO_WORSE = "<= 1.0 (no worse than the baseline)"


# -- the figures -----------------------------------------------------------------------------------------------------
# The chain against the operator's script with the same checks, per simulated load (s).
RESTART_TARGETS = {5.0: 1.06, 60.0: 1.02}
SERVING_TARGET_S = 1.0
# Loads projected (labelled so) from the overheads measured at the longest measured load.
PROJECTED_LOADS_S = (120, 300)
# The runs whose median each target asks for.
MIN_RUNS = 5
# sglang_service_probe_stability_window's default, for runs whose data file does not record the window.
ROLE_STABILITY_WINDOW_S = 5.0


def chain_step_lines(data: dict, match: dict) -> list:
    """Where the chain's time goes: the median of each step of the module's result, over the runs that have them."""
    runs = [s["chain_steps"] for s in samples(data, **match) if s.get("ok", True) and s.get("chain_steps")]
    if not runs:
        return []
    names = list(dict.fromkeys(step["name"] for steps in runs for step in steps))
    totals = {
        name: [sum(step["elapsed_s"] for step in steps if step["name"] == name) for steps in runs] for name in names
    }
    shown = ", ".join(f"{name} {num(statistics.median(values), ' s')}" for name, values in totals.items())
    return [f"the chain's steps as the module timed them (medians of {len(runs)} runs): {shown}"]


def target_at_most(bound: float | None) -> tuple:
    """A Figure's target and verdict for an upper bound, or none where there is no bound."""
    return (f"<= {bound}", at_most(bound)) if bound else ("none", lambda stats, values: None)


def checked_restart_over_ssh(data, load, chain, same_gate, bound) -> list:
    """The chain against ``ssh host restart_checked.sh``: both timed on the controller; none in runs without it."""
    checked = {"side": "operator_checked_ssh", "load_s": load}
    if not samples(data, **checked):
        return []
    serving = paired(data, same_gate, checked, lambda a, b: a["seconds"] - (b["serving"] - b["start"]))
    return [
        Figure(
            f"restart_{load:g}s_checked_ssh",
            f"Restart at {load:g} s simulated load: the role's chain / `ssh host restart_checked.sh`",
            "the role's restart chain against the checked script run from the controller as an operator runs it, "
            "alternating in each run",
            "the chain's task wall time (as above)",
            "`ssh host restart_checked.sh`, process start to exit on the controller",
            paired(data, chain, checked),
            "",
            *target_at_most(bound),
            [f"over ssh {show(seconds(data, **checked), ' s')}", *failures(data, **checked)],
            "as above, less the SSH connection both sides now pay",
        ),
        Figure(
            f"restart_{load:g}s_serving_ssh",
            f"Restart at {load:g} s simulated load: time to serving, the role's chain minus `ssh host "
            "restart_checked.sh`",
            "the role's chain with window 0 s against the checked script over ssh up to its generation's answer",
            "the chain's task wall time with window 0 s",
            "from the start of `ssh host restart_checked.sh` on the controller to the end of its generation",
            serving,
            " s",
            f"<= {SERVING_TARGET_S:g} s",
            at_most(SERVING_TARGET_S),
            [],
            "as above: SGLang's own drain on the stop, which looks every 5 s",
        ),
    ]


def checked_restart_figures(data, load, chain, checked, same_gate, bound, window_s) -> list:
    """The chain against the operator's script with the chain's checks: the verdict (whole restart, window and all)
    and the time to serving (restart to the first good generation; the chain run with window 0 s)."""
    serving = paired(data, same_gate, checked, lambda a, b: a["seconds"] - (b["serving"] - b["start"]))
    overhead = spread(paired(data, chain, checked, lambda a, b: a["seconds"] - b["seconds"]))
    script = seconds(data, **checked)
    projections = []
    if overhead and script and load == max(data["settings"]["loads_s"]):
        # The chain's cost beyond the script does not grow with the load; the script's time grows with it.
        longer_script = {longer: script["median"] + longer - load for longer in PROJECTED_LOADS_S}
        shown = ", ".join(
            f"{longer:g} s: {num((took + overhead['median']) / took)}" for longer, took in longer_script.items()
        )
        projections = [
            f"projected, not measured, from the chain's {num(overhead['median'], ' s')} beyond the script at "
            f"{load:g} s: the ratio at loads of {shown}"
        ]
    return [
        Figure(
            f"restart_{load:g}s_checked",
            f"Restart at {load:g} s simulated load: the role's chain / the operator's script with the same checks",
            "the role's restart chain against tests/bench/operator/restart_checked.sh on the operator's plain unit: "
            "`systemctl restart`, /health every 0.1 s until 200, one generation, then a wait of the chain's "
            "stability window and MainPID and NRestarts compared, alternating in each run",
            "the chain's task wall time (as above)",
            "the checked script's wall time on the host",
            paired(data, chain, checked),
            "",
            *target_at_most(bound),
            [
                f"the stability window: {window_s:g} s on both sides",
                f"chain {show(seconds(data, **chain), ' s')}; checked script {show(script, ' s')}",
                *projections,
                *failures(data, **checked),
            ],
            "what the chain does beyond the checked script: the drain and SGLang's own drain on the stop (it looks "
            "every 5 s), the reaper's check, the known-good snapshot and Ansible's cost of the task",
        ),
        Figure(
            f"restart_{load:g}s_serving",
            f"Restart at {load:g} s simulated load: time to serving, the role's chain minus the operator's script",
            "the role's chain with the stability window set to 0 s, which ends right after its gate's generation, "
            "against the checked script up to its generation's answer, alternating in each run",
            "the chain's task wall time with window 0 s",
            "the checked script from `systemctl restart` to the end of its generation",
            serving,
            " s",
            f"<= {SERVING_TARGET_S:g} s",
            at_most(SERVING_TARGET_S),
            [],
            "the chain's stop lets SGLang finish its own drain, which looks every 5 s, where the plain unit's stop "
            "signals every process of the engine at once; and the reaper's check, the snapshot and Ansible's cost",
        ),
    ]


def restart_figures(data: dict) -> list:
    figures = []
    # Runs before the operator's scripts asked as often as the chain asked once a second.
    poll = data["settings"].get("operator_poll_s", 1)
    for load in data["settings"]["loads_s"]:
        chain = {"side": "collection", "load_s": load}
        operator = {"side": "operator", "load_s": load}
        checked = {"side": "operator_checked", "load_s": load}
        baseline = {"side": "baseline", "load_s": load}
        same_gate = {"side": "same_gate", "load_s": load}
        # Runs before the same-gate side was measured compare this commit's chain, window and all, with the baseline.
        window = spread(paired(data, chain, same_gate, lambda a, b: a["seconds"] - b["seconds"]))
        window_lines, own_gate_lines, same_gate_note, same_gate_numerator = [], [], "", ""
        if window:
            window_lines = [
                f"of which the probe gate's stability window (the same chain with window 0 s, run alongside): "
                f"{show(window, ' s')}"
            ]
            own_gate_lines = [
                f"this commit's chain with its own 5 s window / the baseline's: "
                f"{show(spread(paired(data, chain, baseline)))}"
            ]
            same_gate_note = (
                "; this commit's chain runs with the baseline's gate (stability window 0 s, that commit's default), "
                "on its own hosts, in the same rounds"
            )
            same_gate_numerator = ", with the probe gate's stability window set to 0 s as the baseline's was"
        bound = RESTART_TARGETS.get(float(load))
        fixed = spread(paired(data, chain, operator, lambda a, b: a["seconds"] - b["seconds"]))
        window_s = float(data["settings"].get("stability_window_s", ROLE_STABILITY_WINDOW_S))
        floor = spread(paired(data, operator, operator, lambda a, b, w=window_s: (a["seconds"] + w) / a["seconds"]))
        if window:
            without = spread(paired(data, same_gate, operator))
            window_lines.append(f"the same chain with window 0 s / the operator's script: {show(without)}")
        window_lines.append(
            f"the floor a {window_s:g} s stability window sets, (script + window) / script: the least any chain with "
            f"it can take against this script, since the window starts at the first /health 200, where the script "
            f"ends: {show(floor)}"
        )
        window_lines.extend(chain_step_lines(data, chain))
        ansible_share = spread(
            [s["seconds"] - s["gate_elapsed_s"] for s in samples(data, **chain) if s.get("gate_elapsed_s") is not None]
        )
        window_lines.append(
            "Ansible's share of the chain's task (its wall time minus the module's own elapsed time): "
            f"{show(ansible_share, ' s')}"
        )
        process = spread(paired(data, chain, chain, lambda a, b: a["process_stop"] - a["process_start"]))
        figures.append(
            Figure(
                f"restart_{load:g}s",
                f"Restart at {load:g} s simulated load: the role's chain / systemctl restart and a /health loop",
                "the role's restart chain (drain, reap, start, probe gate, snapshot) against an operator's script on "
                "the same engine (same command line and environment) in a plain unit, on hosts of their own, "
                "alternating in each run",
                "the chain's task wall time: from the start of the `include_role: sglang_service, tasks_from: restart` "
                "task to the start of the next task of tests/e2e/playbooks/bench_restart.yml (bench_timer callback); "
                "Ansible's process start-up and the playbook's end are not in it",
                "the wall time of tests/bench/operator/restart.sh on the host: `systemctl restart UNIT`, then /health "
                f"asked every {poll:g} s until 200",
                paired(data, chain, operator),
                "",
                "none: the script checks less (below, the same checks)",
                lambda stats, values: None,
                [
                    f"chain {show(seconds(data, **chain), ' s')}; "
                    f"operator's script {show(seconds(data, **operator), ' s')}",
                    f"the whole ansible-playbook run (process start to exit) {show(process, ' s')}",
                    f"the chain minus the operator's script: {show(fixed, ' s')}",
                    *window_lines,
                    *failures(data, **chain),
                    *failures(data, **operator),
                ],
            )
        )
        figures += checked_restart_figures(data, load, chain, checked, same_gate, bound, window_s)
        figures += checked_restart_over_ssh(data, load, chain, same_gate, bound)
        figures.append(
            Figure(
                f"restart_{load:g}s_baseline",
                f"Restart at {load:g} s simulated load: this commit's chain / the baseline commit's chain",
                f"the same restart through the role of this commit and of the baseline commit "
                f"{data['settings']['baseline_commit'][:10]}, on hosts of their own, alternating in each run"
                f"{same_gate_note}",
                f"this commit's chain task wall time (as above){same_gate_numerator}",
                "the baseline commit's chain task wall time, measured the same way with that commit's role",
                paired(data, same_gate if window else chain, baseline),
                "",
                NO_WORSE,
                no_worse,
                [
                    f"baseline chain {show(seconds(data, **baseline), ' s')}",
                    *own_gate_lines,
                    *failures(data, **baseline),
                    *failures(data, **same_gate),
                ],
                "this commit's chain takes longer than the baseline's in every run",
            )
        )
    return figures


def reap_figures(data: dict) -> list:
    grace = data["settings"]["grace_s"]
    collection, operator = {"side": "collection"}, {"side": "operator"}
    module = paired(data, collection, operator, lambda reap, script: reap.get("module_elapsed_s") - script["seconds"])
    beyond = paired(data, collection, operator, lambda reap, script: reap["seconds"] - grace - script["release_lag_s"])
    ansible = seconds(data, side="ansible_task")
    lag = spread([s["release_lag_s"] for s in samples(data, **operator)])
    script = (
        "an operator's script (tests/bench/operator/reap.sh: SIGTERM, sleep grace, SIGKILL, watch nvidia-smi every "
        "0.02 s until the memory is back)"
    )
    return [
        Figure(
            "reap_module",
            "Reap: the nvidia_reap module's own cost beyond the operator's script on the host",
            f"nvidia_reap on a holder of 2000 MiB that ignores SIGTERM, against {script} on the same kind of holder, "
            "in the same run",
            "the module's own elapsed_s (on the host, from its start to its result)",
            "the script's wall time on the host",
            module,
            " s",
            "<= 0.2 s",
            at_most(0.2),
            [
                f"the script {show(seconds(data, **operator), ' s')}, of which the GPU's release lag "
                f"{show(lag, ' s')} after `grace` ({grace:g} s)",
                f"the task beyond `grace` and the release lag: {show(spread(beyond), ' s')}",
            ],
            "the module lists the GPU's processes before and after, and checks each holder's identity before it "
            "signals it",
        ),
        Figure(
            "reap_task_vs_ssh",
            "Reap: the nvidia_reap task beyond `ssh host reap.sh`",
            f"the Ansible task against {script} run from the controller as `ssh host reap.sh`, in the same run",
            "the Reap task's wall time in a one-play playbook (tests/e2e/playbooks/bench_tasks.yml, bench_timer: "
            "start on the host to the result on the controller), after the module's first use in the same play",
            "`ssh host reap.sh`, process start to exit on the controller",
            paired(data, collection, {"side": "operator_ssh"}, lambda a, b: a["seconds"] - b["seconds"]),
            " s",
            "<= +0.3 s",
            at_most(0.3),
            [
                f"reap task {show(seconds(data, **collection), ' s')}; `ssh host reap.sh` "
                f"{show(seconds(data, side='operator_ssh'), ' s')}; Ansible's own cost of a task (a ping in the same "
                f"play) {show(ansible, ' s')}",
                *first_use_context(data, "nvidia_reap", "in check mode"),
            ],
            "Ansible's task start-up on the controller and its module transfer beyond one SSH command",
        ),
    ]


def first_use_context(data: dict, module: str, how: str) -> list:
    """A context line on the module's first use in the play, which the timed tasks come after (none in older runs)."""
    first = seconds(data, side="first_use")
    if first is None:
        return []
    return [
        f"the module's first use in the playbook run ({module} {how}, before the timed task) took "
        f"{show(first, ' s')}: Ansible builds a module's payload at its first use and reuses it for every later "
        "task and host of the run, so the timed task costs what each later use costs"
    ]


def probe_figures(data: dict) -> list:
    collection, operator = {"side": "collection"}, {"side": "operator"}
    module = paired(data, collection, operator, lambda probe, plain: probe.get("module_elapsed_s") - plain["seconds"])
    ansible = seconds(data, side="ansible_task")
    request = (
        "the probe's own generation request (its prompt, 32 tokens, streamed to `data: [DONE]`) sent by a plain client"
    )
    return [
        Figure(
            "probe_module",
            "Probe: the sglang_probe module's own cost beyond its generation request",
            f"the full probe (unit, GPU memory, health, model, a 32-token generation) against {request} on the host, "
            "in the same run",
            "the module's own elapsed_s (on the host)",
            "the plain client's request on the host",
            module,
            " s",
            "<= 0.2 s",
            at_most(0.2),
            [
                f"the task beyond the request on the host: "
                f"{show(spread(paired(data, collection, operator, lambda a, b: a['seconds'] - b['seconds'])), ' s')}; "
                f"plain generation {show(seconds(data, **operator), ' s')}",
            ],
            "the tiers before the generation: systemctl, the GPU listing, /health, /model_info",
        ),
        Figure(
            "probe_task_vs_ssh",
            "Probe: the sglang_probe task beyond `ssh host` and its generation request",
            f"the Ansible task against {request} as `ssh host python3 -` from the controller, in the same run",
            "the Probe task's wall time (tests/e2e/playbooks/bench_tasks.yml, bench_timer: start on the host to the "
            "result on the controller), after the module's first use in the same play",
            "`ssh host python3 -` with the request, process start to exit on the controller",
            paired(data, collection, {"side": "operator_ssh"}, lambda a, b: a["seconds"] - b["seconds"]),
            " s",
            "<= +0.3 s",
            at_most(0.3),
            [
                f"probe task {show(seconds(data, **collection), ' s')}; over ssh "
                f"{show(seconds(data, side='operator_ssh'), ' s')}; Ansible's own cost of a task (ping) "
                f"{show(ansible, ' s')}",
                *first_use_context(data, "sglang_probe", "with the unit tier alone"),
            ],
            "the probe's tiers before the generation, and Ansible's task start-up beyond one SSH command",
        ),
    ]


def progress_figures(data: dict) -> list:
    clients = data["settings"]["stuck_clients"]
    window = data["settings"]["window_s"]
    full = samples(data, side="collection")
    detection = [s["seconds"] if s.get("detected") else None for s in full]
    cost = paired(
        data,
        {"side": "tier"},
        {"side": "unit_tier"},
        lambda tier, unit: tier["seconds"] - unit["seconds"] - window if tier.get("detected") else None,
    )
    operator = samples(data, side="operator")
    statuses = sorted({str(s.get("status")) for s in operator})
    missed_rounds = sum(1 for s in full if not s.get("detected"))
    return [
        Figure(
            "progress_detection",
            "Progress tier: time to name a hung engine",
            f"the full probe with progress_window {window:g} s on an engine whose generation is stuck while /health "
            f"answers (lab fault {data['settings']['fault']}, {clients} clients whose requests never finish), "
            "against an operator's `curl -sf "
            "/health` on the same engine",
            "the Probe task's wall time (bench_timer: start on the host to the result on the controller) with the "
            "engine already hung, after the module's first use in the same play; a run in which the probe did not "
            "name the hang counts as not measured",
            f"none: the target is window + 1 s = {window + 1:g} s",
            detection,
            " s",
            f"<= {window + 1:g} s",
            lambda stats, values: None not in values and at_most(window + 1)(stats, values),
            [
                f"the operator's /health check answered {', '.join(statuses)} after "
                f"{show(seconds(data, side='operator'), ' s')}: "
                + (
                    "it does not see the hang" if statuses == ["200"] else "non-200 is its (late) detection of the hang"
                ),
                f"runs in which the probe did not name the hang: {missed_rounds}",
                *first_use_context(data, "sglang_probe", "with the unit tier alone"),
            ],
            "Ansible's per-task cost comes on top of the window",
        ),
        Figure(
            "progress_cost",
            "Progress tier: its cost beyond the window",
            "a probe of the progress tier alone against a probe of the unit tier alone, on the hung engine, in the "
            "same play",
            "the progress-only probe task's wall time minus the window",
            "the unit-only probe task's wall time (the same module's start-up and Ansible's per-task cost)",
            cost,
            " s",
            "<= 0.3 s",
            at_most(0.3),
            [
                f"progress-only task {show(seconds(data, side='tier'), ' s')}; unit-only task "
                f"{show(seconds(data, side='unit_tier'), ' s')}"
            ],
            "the scrapes of /metrics every 0.5 s and the last one after the window",
        ),
    ]


def progress_slow_figures(data: dict) -> list:
    settings = data["settings"]
    window, rate = settings["window_s"], settings["tokens_per_s"]
    probes = samples(data, side="collection") + samples(data, side="tier")
    rounds = sorted({s["round"] for s in probes})
    hung = [sum(1 for s in probes if s["round"] == r and s.get("hung")) for r in rounds]
    operator = samples(data, side="operator")
    statuses = ", ".join(sorted({str(s.get("status")) for s in operator})) or "none"
    other = sorted(
        {f"{s['failed_tier']}: {s.get('reason')}" for s in probes if s.get("failed_tier") not in (None, "progress")}
    )
    return [
        Figure(
            "progress_slow",
            "Progress tier: hang verdicts on a slow engine",
            f"the full probe and the progress tier alone (progress_window {window:g} s) on an engine that decodes "
            f"{rate:g} tokens per second while {settings['busy_clients']} long requests run: slow, but progressing",
            "the probes of each run that named the engine hung (failed tier progress)",
            "none: a slow engine that progresses is no hang, so the target is 0 in every run",
            hung,
            "",
            "0 in every run",
            lambda stats, values: max(values) == 0,
            [
                f"probes per run: {len(probes) // max(len(rounds), 1)}; full probe task "
                f"{show(seconds(data, side='collection'), ' s')}, progress tier alone "
                f"{show(seconds(data, side='tier'), ' s')}",
                f"the operator's `curl -m 5 /health_generate` on the same engine answered {statuses} after "
                f"{show(seconds(data, side='operator'), ' s')}",
                *(f"a probe failed another tier: {line}" for line in other),
            ],
            "a hang verdict on this engine would be a false alarm",
        ),
    ]


def fork_to_ready(one_host: dict) -> list:
    """Each engine start of a one-host sweep: systemd's fork of the main process to the engine's ready line."""
    return [load["ready"] - load["fork"] for load in one_host["loads"] if load.get("ready")]


def plain_bench_s(operator: dict) -> float:
    """The plain client's time for the requests of every point: warm-up start to the last run's end, summed."""
    total = 0.0
    for point in operator["points"]:
        if "bench" in point:
            first = point["bench"]["warmup"] or point["bench"]["levels"][0]["runs"][0]
            total += point["bench"]["levels"][-1]["runs"][-1]["stop"] - first["start"]
    return total


PER_LEVEL_TASKS = "playbooks/tasks/sweep_level.yml"


def benchmarked_per_level(one_host: list) -> bool:
    """Whether the sweep of these runs ran a module per load level and recorded each (tasks/sweep_level.yml), as
    sweeps did before one ``sglang_bench`` call per point."""
    return any(PER_LEVEL_TASKS in s.get("task_seconds_by_file", {}) for s in one_host)


def task_files(one_host: list) -> str:
    """The task files the one-host sweep spent most time in (median of the runs), engine loads included."""
    files = sorted({name for s in one_host for name in s.get("task_seconds_by_file", {})})
    medians = {
        name: statistics.median(s.get("task_seconds_by_file", {}).get(name, 0.0) for s in one_host) for name in files
    }
    top = sorted(medians.items(), key=lambda item: (-item[1], item[0]))[:6]
    return ", ".join(f"`{name}` {seconds:.1f} s" for name, seconds in top) or "not recorded"


def task_time_by_file(runs: list) -> list:
    """A context line: where the playbook's task time goes, per task file (bench_timer), median over the runs."""
    per_file = {}
    for run in runs:
        for path, spent in (run.get("task_seconds_by_file") or {}).items():
            per_file.setdefault(path, []).append(spent)
    if not per_file:
        return []
    medians = sorted(((statistics.median(spent), path) for path, spent in per_file.items()), reverse=True)
    listed = ", ".join(f"{path} {num(spent, ' s')}" for spent, path in medians)
    return [f"task time by file, median of the runs: {listed}"]


SCALING_SHARE = 0.85


def scaling_bound(points: int, hosts: int) -> float:
    """The speed-up of ``hosts`` hosts over one for ``points`` points plus each host's final restore, at zero
    overhead: (N + 1) / (N / H + 1)."""
    return (points + 1) / (points / hosts + 1)


def sweep_scaling_figures(data: dict) -> list:
    """The scaling pair: the same larger grid on one host and on three (not measured in runs without it)."""
    scaling = data["settings"].get("scaling") or {"steps": range(12), "hosts": 3, "forks": "(not measured)"}
    points, hosts = len(scaling["steps"]), scaling["hosts"]
    bound = scaling_bound(points, hosts)
    one, three = {"side": "scaling_one_host"}, {"side": "scaling_three_hosts"}
    speedups = paired(data, one, three)
    return [
        Figure(
            "sweep_scaling",
            f"Sweep scaling: {points} points on {hosts} hosts vs 1, share of the bound",
            f"spec_sweep.yml with {points} points on {hosts} hosts against the same grid on one host, in the same run, "
            f"forks {scaling['forks']}",
            "the one-host playbook's wall time / the three-host playbook's (process start to exit)",
            f"the bound (N + 1) / (N / H + 1) = {num(bound)}x: each host's points and its final restore, at zero "
            "overhead",
            [speedup / bound for speedup in speedups],
            "",
            f">= {SCALING_SHARE:g}",
            at_least(SCALING_SHARE),
            [
                f"speed-up {show(spread(speedups), 'x')}; one host {show(seconds(data, **one), ' s')}, {hosts} hosts "
                f"{show(seconds(data, **three), ' s')}"
            ],
            "the plan, the report and Ansible's per-task work on the controller's 2 cores for all hosts at once",
        )
    ]


def sweep_figures(data: dict) -> list:
    settings = data["settings"]
    points = len(settings["steps"])
    per_level = benchmarked_per_level(samples(data, side="one_host"))
    calls = (
        "a module run per level and per record" if per_level else "one benchmark run for all its levels and one record"
    )

    def over_engine(one, operator):
        return one["seconds"] / (sum(fork_to_ready(one)) + plain_bench_s(operator))

    def over_levels(one, operator):
        loads = fork_to_ready(one)
        if one.get("points_start") is None or not loads:
            return None
        return (one["points_stop"] - one["points_start"]) / (
            points * statistics.median(loads) + plain_bench_s(operator)
        )

    def overhead_per_point(one, operator):
        """The points phase beyond the loop's: the loop's first point to the start of its restore, per point."""
        restore = next((line for line in operator.get("points", []) if line.get("restore")), None)
        if one.get("points_start") is None or restore is None:
            return None
        loop = restore["start"] - operator["points"][0]["start"]
        return ((one["points_stop"] - one["points_start"]) - loop) / points

    one, op = {"side": "one_host"}, {"side": "operator"}
    faithful = {"side": "bench_speculative"}
    engine = spread(paired(data, one, op, lambda a, b: sum(fork_to_ready(a)) + plain_bench_s(b)))
    load_each = spread([statistics.median(fork_to_ready(s)) for s in samples(data, **one) if fork_to_ready(s)])
    # The loads of the playbook: one per point and the final restore's.
    forks = spread([(len(s["loads"]) - 1) / points for s in samples(data, **one)])
    # Runs before the points' window became 0 by default held the role's 5 s at every point.
    windows = settings.get("stability_window_s", {"points": 5, "final_restore": 5})
    grid = (
        f"steps {', '.join(map(str, settings['steps']))} x concurrency {', '.join(map(str, settings['levels']))}, "
        f"simulated load {settings['load_s']:g} s, per level {settings['sweep_repeats']} run(s) of "
        f"{'/'.join(map(str, settings['requests']['per_level']))} requests of {settings['bench']['max_new_tokens']} "
        f"tokens after {settings['requests']['warmup']} warm-up request(s), stability window {windows['points']:g} s "
        f"per point and {windows['final_restore']:g} s for the final restore"
    )
    whole = "the whole `ansible-playbook playbooks/spec_sweep.yml` run, process start to exit (plan, host set-up, " \
            "points, final restore and report)"  # fmt: skip
    levels = len(settings["levels"])
    at_load = f", {settings['load_s']:g} s loads"

    def projected(theirs: dict, their_loads: int) -> list:
        """The sweep against ``theirs`` at longer loads, from the absolute difference measured here: every engine
        start takes (longer - measured) s more on either side; the playbook loads each point once and restores once."""
        difference = spread(paired(data, one, theirs, lambda a, b: a["seconds"] - b["seconds"]))
        measured = seconds(data, **theirs)
        shown_loads = [longer for longer in (60, *PROJECTED_LOADS_S) if longer > settings["load_s"]]
        if not difference or not measured or not shown_loads:
            return []
        shown = ", ".join(
            f"{longer:g} s: "
            + num((measured["median"] + their_loads * (longer - settings["load_s"]) + difference["median"]
                   + (points + 1 - their_loads) * (longer - settings["load_s"]))
                  / (measured["median"] + their_loads * (longer - settings["load_s"])))
            for longer in shown_loads
        )  # fmt: skip
        return [f"projected, not measured, from the {num(difference['median'], ' s')} measured at "
                f"{settings['load_s']:g} s: the ratio at loads of {shown}"]  # fmt: skip

    return [
        Figure(
            "sweep_vs_loop",
            "Sweep playbook / a lean shell loop" + at_load,
            f"spec_sweep.yml on one host against tests/bench/operator/spec_loop.sh on a plain unit of the same "
            f"engine: the same grid ({grid}) and the same requests, alternating in each run",
            whole,
            "the loop's wall time: its first point's flag rewrite to the end of its final restore (restart, /health "
            f"every {settings.get('operator_poll_s', 1):g} s, the plain client's requests per point)",
            paired(data, one, op),
            "",
            "<= 1.05",
            at_most(1.05),
            [
                f"sweep playbook {show(seconds(data, **one), ' s')}; operator's loop {show(seconds(data, **op), ' s')}",
                *projected(op, points + 1),
                *task_time_by_file(samples(data, **one)),
            ],
            "per point the playbook writes the drop-in (the role's preflight and the point's validation "
            f"{settings.get('role_preflight', 'at every point')}), runs the restart chain (lock, "
            f"drain, reaper check, probe gate with its generation and a {windows['points']:g} s stability window; "
            f"the restart figures time each step) and {calls} (the task "
            "time by file above); the loop runs `systemctl restart` and its requests; the fixed cost per point "
            "weighs most at short loads",
        ),
        Figure(
            "sweep_point_overhead",
            "Sweep: cost per point beyond the lean loop's" + at_load,
            "the points phase of spec_sweep.yml on one host against the lean loop's points, in the same run",
            "from the start of the points play to the start of the host's final restore, bench_timer",
            f"the loop's first point to the start of its restore, the difference divided by the {points} points",
            [value for value in paired(data, one, op, overhead_per_point) if value is not None],
            " s",
            "<= 1.5 s",
            at_most(1.5),
            [],
            f"the restart chain's steps and {calls}, each an Ansible task",
        ),
        Figure(
            "sweep_vs_bench_speculative",
            "Sweep playbook / SGLang's bench_speculative.py, done as a script" + at_load,
            "spec_sweep.yml on one host against tests/bench/operator/bench_speculative.sh on a plain unit of the same "
            "engine: SGLang's scripts/playground/bench_speculative.py step for step (a server per batch size and "
            "point, /health_generate every 10 s, one warm-up batch, 5 s after each), the same grid and requests, "
            "alternating in each run",
            whole,
            "the script's wall time: its first launch to the end of its final restore",
            paired(data, one, faithful),
            "",
            "<= 0.7",
            at_most(0.7),
            [
                f"bench_speculative.py as a script {show(seconds(data, **faithful), ' s')}",
                *projected(faithful, points * levels + 1),
            ],
            "the playbook loads each point once for all its load levels, where the script loads it once per level",
        ),
        Figure(
            "sweep_vs_engine",
            "Sweep playbook / the engine's own time" + at_load,
            "spec_sweep.yml on one host against the time the engine itself needs for the same work",
            whole,
            "the sum over every engine start during the playbook of systemd's fork of the main process "
            "(ExecMainStartTimestamp) to the engine's `The server is fired up and ready to roll!` journal line, plus "
            "the plain client's time for the same benchmark requests (warm-up start to last run's end, per point, "
            "from the operator's loop of the same run)",
            paired(data, one, op, over_engine),
            "",
            "<= 1.25",
            at_most(1.25),
            [f"engine's own time {show(engine, ' s')}; one load (fork to ready) {show(load_each, ' s')}"],
            "the collection's work per point beyond the engine's load and the requests (as above), and the "
            "playbook's plan, set-up and report",
        ),
        *sweep_scaling_figures(data),
        Figure(
            "sweep_levels",
            "Sweep with load levels / (points x one load + benchmark time)" + at_load,
            "the points phase of spec_sweep.yml on one host against the engine time it cannot avoid",
            "from the start of the points play to the start of the host's final restore (tasks/sweep_finish.yml), "
            "bench_timer",
            f"{points} points x the median fork-to-ready of the sweep's loads + the plain client's time for the same "
            "requests",
            paired(data, one, op, over_levels),
            "",
            "<= 1.15",
            at_most(1.15),
            [f"engine starts per point during the points phase: {show(forks)} (1.0: no extra load for the levels)"],
            "the restart chain's fixed cost per point and the bench module's start-up per "
            + ("level" if per_level else "point"),
        ),
    ]


# What a sweep at a realistic load measures: the playbook against the lean loop, not the bench_speculative.py script
# (a load per level and point) or the scaling pair (12 points on one host), each an hour or more at such loads.
REALISTIC_SWEEP_FIGURES = ("sweep_vs_loop", "sweep_point_overhead", "sweep_vs_engine", "sweep_levels")


def sweep_realistic_figures(data: dict) -> list:
    return [figure for figure in sweep_figures(data) if figure.key in REALISTIC_SWEEP_FIGURES]


def slope(points: list) -> float:
    """Least-squares seconds per host over (hosts, seconds)."""
    xs, ys = [point[0] for point in points], [point[1] for point in points]
    mean_x, mean_y = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def noop_figures(data: dict) -> list:
    scaling = [s for s in data["samples"] if s["set"] == "this commit at 1, 6 and 12 hosts"]
    versus = [s for s in data["samples"] if s["set"] != "this commit at 1, 6 and 12 hosts"]
    scaled = {"samples": scaling}
    compared = {"samples": versus}
    not_noop = [s for s in data["samples"] if not s["up_to_date"]]
    rounds = sorted({s["round"] for s in scaling})

    def marginal_of(side: str) -> dict:
        """The least-squares seconds per host of each run that measured the side at more than one size."""
        per_round = {
            r: [(s["hosts"], s["seconds"]) for s in scaling if s["round"] == r and s["side"] == side] for r in rounds
        }
        return {r: slope(points) for r, points in per_round.items() if len({hosts for hosts, _s in points}) > 1}

    ours, floors = marginal_of("collection"), marginal_of("ping")
    marginal = list(ours.values())
    figures = []
    for size in (6, 12):
        bound = 2.5 if size == 12 else None
        figures.append(
            Figure(
                f"noop_{size}",
                f"No-op deploy: {size} hosts / 1 host",
                f"playbooks/deploy.yml on an up-to-date fleet of {size} hosts against 1 host, alternating in each run",
                f"the {size}-host run's wall time (ansible-playbook process start to exit)",
                "the 1-host run's wall time (the same)",
                paired(scaled, {"side": "collection", "hosts": size}, {"side": "collection", "hosts": 1}),
                "",
                f"<= {bound}" if bound else "none",
                at_most(bound) if bound else (lambda stats, values: None),
                [
                    f"{size} hosts {show(seconds(scaled, side='collection', hosts=size), ' s')}; "
                    f"1 host {show(seconds(scaled, side='collection', hosts=1), ' s')}"
                ]
                + ([f"runs that were not a no-op (deploy changed a host): {len(not_noop)}"] if not_noop else []),
                "each host costs its preflight probe and reads; the controller's 2 cores run every host's Ansible "
                "worker",
            )
        )
    largest = max(data["settings"]["sizes"])
    ping = {"side": "ping", "hosts": largest}
    figures += [
        Figure(
            "noop_marginal",
            "No-op deploy: seconds per additional host",
            "the no-op deploy at 1, 6 and 12 hosts",
            "the least-squares slope of wall time over the number of hosts, per run",
            "none",
            marginal,
            " s/host",
            "none",
            lambda stats, values: None,
        ),
        Figure(
            "noop_floor",
            f"No-op deploy on {largest} hosts / a play of one ping on them",
            "playbooks/deploy.yml on an up-to-date fleet against the least any playbook costs on the same hosts "
            "(tests/e2e/playbooks/bench_ping.yml: `ansible all -m ping` as a play), alternating in each run; forks "
            "at least the number of hosts",
            "the deploy's wall time (process start to exit)",
            "the ping play's wall time (the same)",
            paired(scaled, {"side": "collection", "hosts": largest}, ping),
            "",
            "<= 2",
            at_most(2.0),
            [f"the ping play {show(seconds(scaled, **ping), ' s')}"],
            "the deploy's preflight reads and fingerprints every host and the controller's 2 cores run every "
            "host's worker",
        ),
        Figure(
            "noop_marginal_floor",
            "No-op deploy: seconds per additional host / the ping play's",
            "the slopes over 1, 6 and 12 hosts of the deploy and of the ping play, in the same run",
            "the deploy's least-squares seconds per host",
            "the ping play's least-squares seconds per host",
            [ours[r] / floors[r] for r in ours if floors.get(r, 0) > 0],
            "x",
            "<= 1.5x",
            at_most(1.5),
            [f"the ping play: {show(spread(list(floors.values())), ' s/host')}"],
            "each host's own tasks in the deploy, where the ping play runs one",
        ),
    ]
    for size in (1, 6):
        figures.append(
            Figure(
                f"noop_{size}_baseline",
                f"No-op deploy on {size} host(s): this commit / the baseline commit",
                f"deploy.yml of this commit on its hosts against deploy.yml of the baseline commit "
                f"{data['settings']['baseline_commit'][:10]} on hosts it deployed, alternating in each run",
                "this commit's run wall time (process start to exit)",
                "the baseline commit's run wall time (the same)",
                paired(compared, {"side": "collection", "hosts": size}, {"side": "baseline", "hosts": size}),
                "",
                NO_WORSE,
                no_worse,
                [f"baseline {show(seconds(compared, side='baseline', hosts=size), ' s')}"],
                "this commit's no-op deploy takes longer than the baseline's in every run",
            )
        )
    return figures


def percentile(values: list, share: float):
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * share
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rolling_phases(sample: dict) -> dict:
    """Failed requests of the round, p99 latency of the steady phase and of the requests started during the deploy."""
    deploy_start = (sample["start"] - sample["load_start"]) * 1000
    deploy_stop = (sample["stop"] - sample["load_start"]) * 1000
    requests = [(int(start), int(end), outcome) for start, end, outcome in map(str.split, sample["requests"])]
    ok = [(start, end) for start, end, outcome in requests if outcome == "ok"]
    steady = [end - start for start, end in ok if end < deploy_start]
    during = [end - start for start, end in ok if deploy_start <= start <= deploy_stop]
    failed = sum(1 for _start, _end, outcome in requests if outcome != "ok")
    return {"failed": failed, "steady_p99": percentile(steady, 0.99), "deploy_p99": percentile(during, 0.99)}


def in_flight_at_stops(rounds: list) -> str:
    """The requests running on the engines when the deploy's stops began (their journals), per run; "" for data
    that does not hold them."""
    counts = [sum(sum(looks) for looks in s["in_flight_at_stop"].values()) for s in rounds if "in_flight_at_stop" in s]
    return f"; requests in flight at its stops, per run: {', '.join(map(str, counts))}" if counts else ""


def rolling_figures(data: dict) -> list:
    settings = data["settings"]
    tokens, latency = settings.get("max_new_tokens", 64), settings.get("token_latency_ms")
    requests = f"{tokens} tokens" + (f" at {latency} ms each" if latency else "")
    drained = samples(data, side="with_drain")
    phases = [rolling_phases(s) for s in drained]
    without = [rolling_phases(s) for s in samples(data, side="without_drain")]
    held = in_flight_at_stops(samples(data, side="without_drain"))
    return [
        Figure(
            "rolling_failed",
            "Rolling deploy under load: failed requests with drains",
            "deploy.yml (batch 1, 3 hosts) with the gateway list in the inventory while 16 streaming clients send "
            f"requests of {requests} through the real gateway (smg)",
            "client requests of the round that did not complete (not HTTP 200, no `data: [DONE]`, or short)",
            "none",
            [p["failed"] for p in phases],
            "",
            "0",
            lambda stats, values: stats["max"] == 0,
            [],
            "requests the gateway still sent to a host that was stopping",
        ),
        Figure(
            "rolling_control",
            "Rolling deploy under load: failed requests without drains (the control)",
            "the same deploy and load in the same run, without the gateway list and with a stop budget shorter than "
            "a request (the plain rolling restart): it shows the load can lose requests, so that the 0 above "
            "says what the drains buy" + held,
            "client requests of the round that did not complete",
            "none",
            [p["failed"] for p in without],
            "",
            "> 0 in every run",
            at_least(1),
            [],
            "requests that end before the stop: the load's requests must outlive the stop budget",
        ),
        Figure(
            "rolling_p99",
            "Rolling deploy under load: p99 latency during the deploy / steady state",
            "the clients' end-to-end latency during the deploy against the steady phase before it, in the same round",
            "p99 of the requests that started during the deploy",
            f"p99 of the requests of the steady phase before the deploy ({settings.get('steady_s', 10):g} s)",
            [p["deploy_p99"] / p["steady_p99"] for p in phases if p["deploy_p99"] and p["steady_p99"]],
            "",
            "<= 1.5",
            at_most(1.5),
            [],
            "two engines carry the load of three while one is drained and restarted",
        ),
        Figure(
            "rolling_wall",
            "Rolling deploy: wall time with drains / without",
            "the same deploy with drains (each host taken out of the gateway and its requests finished first) and "
            "without, under the same load, alternating in each run",
            "the deploy's wall time with drains (process start to exit)",
            "the deploy's wall time without them",
            paired(data, {"side": "with_drain"}, {"side": "without_drain"}),
            "",
            "none",
            lambda stats, values: None,
            [
                f"with drains {show(seconds(data, side='with_drain'), ' s')}; without "
                f"{show(seconds(data, side='without_drain'), ' s')}; a drain waits for the longest request in "
                "flight by design, so the ratio grows with the requests"
            ],
        ),
    ]


# What the reference check may add to a restart with the module's default settings (golden outputs and fingerprint).
REFERENCE_GATE_BOUND_S = 30.0


def reference_gate_figures(data: dict) -> list:
    """Per load: a restart with the reference check on (its default settings) minus the same restart with it off."""
    figures = []
    for load in data["settings"]["loads_s"]:
        on, off = {"side": "reference_on", "load_s": load}, {"side": "reference_off", "load_s": load}
        cost = paired(data, on, off, lambda a, b: a["seconds"] - b["seconds"])
        steps = spread(
            [step["elapsed_s"] for s in samples(data, **on) for step in s.get("chain_steps") or []
             if step["name"] == "reference"]
        )  # fmt: skip
        figures.append(
            Figure(
                f"reference_gate_{load:g}s",
                f"Reference gate: its cost per restart at a {load:g} s load",
                "the restart chain with the reference check on (reference.mode always, every other option at its "
                "default: 3 golden prompts of 48 tokens, a fingerprint of 3 repeats at concurrency 1 and 4) against "
                "the same chain with it off, on the same host, in alternating order",
                "the chain's task with the check on",
                "the chain's task with the check off",
                cost,
                " s",
                f"<= {REFERENCE_GATE_BOUND_S:g} s",
                at_most(REFERENCE_GATE_BOUND_S),
                [
                    f"on {show(seconds(data, **on), ' s')}, off {show(seconds(data, **off), ' s')}; the chain's "
                    f"reference step itself {show(steps, ' s')}",
                    *failures(data, **on),
                    *failures(data, **off),
                ],
                "the check's requests: 3 scored and 3 free-running golden outputs, then 3 repeats of 2 and of 8 "
                "streamed requests of 64 tokens; a restart whose engine inputs did not change skips it",
            )
        )
    return figures


BENCHMARKS = {
    "restart": ("Restart", restart_figures, "tests/e2e/test_bench.py -k restart"),
    "reference_gate": (
        "Reference gate",
        reference_gate_figures,
        "tests/e2e/test_bench_reference.py",
    ),
    "reap": ("Reap", reap_figures, "tests/e2e/test_bench.py -k reap"),
    "probe": ("Probe", probe_figures, "tests/e2e/test_bench.py -k probe"),
    "progress": ("Progress tier", progress_figures, "tests/e2e/test_bench.py -k hung_engine"),
    "progress_slow": (
        "Progress tier on a slow engine",
        progress_slow_figures,
        "tests/e2e/test_bench.py -k slow_engine",
    ),
    "sweep": ("Speculative sweep at a short load", sweep_figures, "tests/e2e/test_bench_sweep.py -k short_load"),
    "sweep_realistic": (
        "Speculative sweep at a realistic load",
        sweep_realistic_figures,
        "tests/e2e/test_bench_sweep.py -k realistic_load",
    ),
    "noop_deploy": ("No-op deploy", noop_figures, "tests/e2e/test_bench_fleet.py -k noop"),
    "rolling_deploy": ("Rolling deploy under load", rolling_figures, "tests/e2e/test_bench_fleet.py -k rolling"),
}


# -- the page --------------------------------------------------------------------------------------------------------
def utc(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(stamp))


def verdict(figure: Figure) -> str:
    if figure.met is None:
        return "no target" if figure.stats else "not measured"
    if figure.met == INCONCLUSIVE:
        return "inconclusive (the runs fall on both sides of the target)"
    return "met" if figure.met else "**missed**"


def benchmark_line(name: str, data: dict) -> str:
    lab = data["lab"]
    load = " ".join(map(str, data["machine"]["load_average_at_start"]))
    return (
        f"  - {name}: {lab['hosts']} host(s) with {lab['gpus_per_host']} simulated GPUs each "
        f"(lab `{lab['name']}`), load average {load}, started {utc(data['started'])}.\n"
    )


def header(run: str, files: dict) -> list:
    first = next(iter(files.values()))
    machine = first["machine"]
    spans = sittings(files)
    measured = (
        f"Measured {utc(spans[0][0])} to {utc(spans[0][1])}"
        if len(spans) == 1
        else f"Measured in {len(spans)} sittings ({'; '.join(f'{utc(a)} to {utc(b)}' for a, b in spans)}), each "
        "benchmark within one"
    )
    return [
        "# Performance\n\n",
        "Measured by `make bench` on lab hosts (systemd-nspawn containers with real systemd and SSH, simulated GPUs "
        "and a simulated SGLang engine; see tests/lab/README.md), and generated from the raw data of that run by "
        "`python tests/bench/write_performance.py`. Nothing here is asserted by the test suite: the machines are "
        "shared and noisy, so every figure is a measurement published with its spread: met (by every run), missed "
        "(by every run) or inconclusive.\n\n",
        "## How to read it\n\n",
        "- Each figure compares the collection with the way the job is done without it, measured **side by side in "
        "the same run** (the two sides alternate in every round, so a slow moment of the machine hits both), as a "
        "ratio or a difference; the absolute times below each figure are for context only, since they depend on the "
        "machine and the lab's simulated load times.\n",
        "- The denominators hold nothing of the collection: plain unit files, shell scripts "
        "(tests/bench/operator/), systemd's and the engine's own timestamps.\n",
        "- A value is the median of the runs, with the smallest and largest in brackets. A target comes from the "
        "issue that asked for the figure; a missed one says what limits it.\n",
        "- The ratios depend on the simulated load times: a fixed cost of the collection weighs more against a 1 s "
        "load than against a real model's minutes. The settings of each benchmark are in its data file.\n\n",
        "## The run\n\n",
        f"- Raw data: [`docs/performance/{run}/`](performance/{run}/) ({len(files)} files: one per benchmark, every "
        "sample with its start and stop time, the lab settings, the machine and the commit).\n",
        f"- {measured}, every benchmark at commit `{first['commit']['sha']}` with no "
        "uncommitted change (the page is written only from such a run).\n",
        f"- Machine: {machine['cores']} CPU cores, {machine['memory_gib']:g} GiB memory, Linux {machine['kernel']}, "
        f"Python {machine['python']}, {machine['ansible']}.\n",
        "- Per benchmark (its lab, the machine's load average when it started):\n",
        *(benchmark_line(name, data) for name, data in sorted(files.items(), key=lambda item: item[1]["started"])),
        runs_line(files),
        "- Regenerate this page from the committed data: `python tests/bench/write_performance.py` (add "
        f"`--run NAME` for another run under docs/performance/). Measure again: {measure_command(files)} as root.\n\n",
    ]


# A pause between benchmarks longer than this (a lab's start-up takes minutes) splits the run into sittings.
SITTING_GAP_S = 30 * 60


def sittings(files: dict) -> list:
    """(start, end) of each stretch of the run with no pause of SITTING_GAP_S between its benchmarks."""
    spans = []
    for start, end in sorted((d["started"], d["finished"] or d["started"]) for d in files.values()):
        if spans and start - spans[-1][1] <= SITTING_GAP_S:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return spans


def planned_runs(files: dict) -> list:
    return sorted({data["rounds"] for data in files.values()})


def runs_line(files: dict) -> str:
    planned = planned_runs(files)
    shown = " or ".join(map(str, planned))
    short = f"; the targets ask for the median of at least {MIN_RUNS}" if min(planned) < MIN_RUNS else ""
    return f"- Runs planned per benchmark: {shown}{short}.\n"


def measure_command(files: dict) -> str:
    """``make bench`` as this run was made: with its number of runs when every benchmark planned the same."""
    planned = planned_runs(files)
    return f"`LLMOPS_BENCH_RUNS={planned[0]} make bench`" if len(planned) == 1 else "`make bench`"


def summary(sections: list) -> list:
    lines = ["## Summary\n\n", "| figure | measured: median [min to max], runs | target | result |\n",
             "|---|---|---|---|\n"]  # fmt: skip
    for _title, figures, _data in sections:
        for figure in figures:
            lines.append(
                f"| {figure.title} | {show(figure.stats, figure.unit)} | {figure.target} | {verdict(figure)} |\n"
            )
    return [*lines, "\n"]


def details(title: str, figures: list, data: dict, command: str) -> list:
    lines = [f"## {title}\n\n", f"`{command}`; data: `{data['benchmark']}.json`"]
    rounds = len({s["round"] for s in data["samples"]}) if data["samples"] else 0
    lines.append(f", {rounds} run(s) of {data['rounds']} planned" + ("" if data["complete"] else ", **incomplete**"))
    lines.append(".\n\n")
    if data["settings"].get("harness_check_only"):
        lines.append(
            "**A check of the benchmark alone: the role has no gateway drain, both sides deployed alike.**\n\n"
        )
    for figure in figures:
        values = ", ".join(num(v) if v is not None else "n/a" for v in figure.values)
        lines += [
            f"### {figure.title}\n\n",
            f"- Compares: {figure.compares}.\n",
            f"- Numerator: {figure.numerator}.\n",
            f"- Denominator: {figure.denominator}.\n",
            f"- Measured: {show(figure.stats, figure.unit)}; per run: {values or 'none'}.\n",
            f"- Target: {figure.target}: {verdict(figure)}.\n" if figure.target != "none" else "- Target: none.\n",
        ]
        lines += [f"- Context: {item}.\n" for item in figure.context]
        if figure.met is False:
            lines.append(f"- What limits it: {figure.limits}.\n")
        lines.append("\n")
    return lines


def budget(files: dict) -> list:
    lines = ["## Run budget\n\n", "| benchmark | part | seconds |\n", "|---|---|---|\n"]
    total = 0.0
    for name, data in files.items():
        for part in data["parts"]:
            lines.append(f"| {name} | {part['name']} | {part['stop'] - part['start']:.0f} |\n")
        if data["finished"]:
            total += data["finished"] - data["started"]
    lines.append(f"\nBenchmarks: {total / 60:.1f} minutes in all (lab start-up and clean-up not included).\n")
    return lines


def refused(run: str, files: dict) -> str:
    """Why the run's files are not one run at one clean commit, as the page and the writer say it; empty when
    they are."""
    problems = mixed_or_dirty(run, files)
    return f"docs/performance/{run}/ is not one run at one clean commit: {problems}" if problems else ""


def unmeasured(refusal: str = "") -> str:
    """The page while no run at one clean commit is committed: what would be measured, and nothing that looks like
    a figure; ``refusal`` says why the newest run is not published."""
    opening = (
        f"**No figure is published.** {refusal}. Its raw data stays in the repository, but figures from several "
        "commits or a dirty tree would not compare, so this page publishes none of them. "
        if refusal
        else "No benchmark run is committed yet, so this page publishes no figure. "
    )
    lines = [
        "# Performance\n\n",
        opening + "`make bench` (as root, on lab hosts) "
        "writes every raw sample of a run under `docs/performance/<run>/` and regenerates this page from them with "
        "`python tests/bench/write_performance.py`; each figure is then a ratio against the way the job is done "
        "without the collection, measured side by side in the same run, with its runs and spread: met (by every "
        "run), missed (by every run) or inconclusive.\n\n",
        "| benchmark | measured by |\n",
        "|---|---|\n",
    ]
    lines += [f"| {title} | `{command}` |\n" for title, _compute, command in BENCHMARKS.values()]
    return "".join(lines)


def render(run: str | None, files: dict) -> str:
    if run is None:
        return unmeasured()
    if refused(run, files):
        return unmeasured(refused(run, files))
    sections, skipped = [], []
    for name, (title, compute, command) in BENCHMARKS.items():
        data = files.get(name)
        if data is None:
            skipped.append(f"- {title}: no data in this run ({command}).\n")
        elif data["skipped"]:
            skipped.append(f"- {title}: not measured: {data['skipped']}.\n")
        else:
            sections.append((title, compute(data), data))
    lines = header(run, files) + summary(sections)
    if skipped:
        lines += ["## Not measured in this run\n\n", *skipped, "\n"]
    for title, figures, data in sections:
        lines += details(title, figures, data, BENCHMARKS[data["benchmark"]][2])
    lines += budget(files)
    return "".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", help="run directory under docs/performance/ (default: the newest)")
    parser.add_argument("--check", action="store_true", help="fail when docs/performance.md differs from the data")
    args = parser.parse_args(argv)
    run, files = load_run(args.run)
    page = render(run, files)
    source = f"docs/performance/{run}/" if run else "no committed run"
    if args.check:
        if OUTPUT.read_text() != page:
            print(f"{OUTPUT} does not match {source}: regenerate it", file=sys.stderr)
            return 1
        print(f"{OUTPUT} matches {source}")
        return 0
    OUTPUT.write_text(page)
    refusal = refused(run, files) if run else ""
    if refusal:
        print(f"wrote {OUTPUT} with no figure: {refusal}", file=sys.stderr)
        return 1
    print(f"wrote {OUTPUT} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
