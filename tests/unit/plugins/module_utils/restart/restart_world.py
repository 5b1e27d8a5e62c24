"""The stand-ins the restart chain's tests drive it through (no host), and the worlds that wire them.

systemd is a scripted unit that moves with a fake clock (a start loads for a while, then turns active; faults
crash it, exit it with status 0, or keep it in a restart loop); the reaper, the probe, the snapshot store and the
lock are recording stand-ins.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from fake_proc import FakeClock

from ansible_collections.llmops.inference.plugins.module_utils.host_lock import LockBusy, LockError
from ansible_collections.llmops.inference.plugins.module_utils.in_flight import SOURCE_SCHEDULER, InFlight
from ansible_collections.llmops.inference.plugins.module_utils.restart.chain import RestartChain
from ansible_collections.llmops.inference.plugins.module_utils.restart.gate import GATE_TIERS, tier_list
from ansible_collections.llmops.inference.plugins.module_utils.restart.options import (
    ARGUMENT_SPEC,
    parse_chain_options,
)
from ansible_collections.llmops.inference.plugins.module_utils.restart.runners import Runners
from ansible_collections.llmops.inference.plugins.module_utils.sglang import SglangError

UNIT = "sglang-t.service"
KEY = "k3y-s3cret"
SERVER_ARGS = f"server_args=ServerArgs(model_path='Qwen/Qwen3-8B', api_key='{KEY}', port=30000)"


class Start:
    """What one start of the unit does: load for ``load`` s (activating), then active; optional faults."""

    def __init__(self, load=2.0, crash_at=None, exit0_after_ready=None):
        self.load = load
        self.crash_at = crash_at
        self.exit0_after_ready = exit0_after_ready
        self.started = None
        self.pid = None


@dataclass
class UnitSetup:
    """How a FakeUnit is set up: its start limit, whether systemd asks for a reload, its journal, whether it exists."""

    burst: int = 3
    need_reload: bool = False
    journal: list | None = None
    loaded: bool = True
    restart_always: bool = False  # a rank >= 1's unit: a clean exit waits to come back (SubState=auto-restart)


class FakeUnit:
    """systemctl and journalctl for one unit, answering from its state at the fake clock's time."""

    def __init__(self, clock, state="active", *, starts=(), **setup):
        setup = UnitSetup(**setup)
        self.clock = clock
        self.calls = []
        self.starts = list(starts)
        self.burst = setup.burst
        self.need_reload = setup.need_reload
        self.loaded = setup.loaded
        self.restart_always = setup.restart_always
        self.journal = (
            setup.journal if setup.journal is not None else [SERVER_ARGS, "The server is fired up and ready to roll!"]
        )
        self.invocation = 1
        self.inactive_exit = 1
        self.next_pid = 4000
        self.run = None
        self.fixed = None
        self.last_exit = {"ExecMainStatus": "0", "ExecMainCode": "0"}
        if state == "active":
            self.run = Start(load=0.0)
            self.run.started, self.run.pid = -10.0, 3999
        elif state == "loop":
            self.fixed = {"ActiveState": "activating", "SubState": "auto-restart", "MainPID": "0", "NRestarts": "4"}
        elif state == "restarted":  # active again after systemd restarted it twice
            self.fixed = {"ActiveState": "active", "SubState": "running", "MainPID": "3990", "NRestarts": "2"}
        elif state == "failed":
            self.fixed = {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "MainPID": "0"}

    # state ---------------------------------------------------------------------------------------

    def props(self) -> dict:
        props = {
            "Id": UNIT,
            "LoadState": "loaded" if self.loaded else "not-found",
            "Result": "success",
            "NRestarts": "0",
            "ControlGroup": f"/system.slice/{UNIT}",
            "InvocationID": f"inv{self.invocation}",
            "InactiveExitTimestampMonotonic": str(self.inactive_exit),
            "ActiveEnterTimestampMonotonic": "0",
            "KillMode": "control-group",
            "ExecStop": "{ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 gate drain ... }",
            "NeedDaemonReload": "yes" if self.need_reload else "no",
            "StartLimitBurst": str(self.burst),
            "StartLimitIntervalUSec": "1h 1min",
            **self.last_exit,
        }
        props.update(self.current())
        return props

    def current(self) -> dict:
        if self.fixed is not None:
            return dict(self.fixed)
        run = self.run
        if run is None:
            return {"ActiveState": "inactive", "SubState": "dead", "MainPID": "0"}
        now = self.clock()
        if run.crash_at is not None and now >= run.started + run.crash_at:
            return {"ActiveState": "activating", "SubState": "auto-restart", "MainPID": "0", "NRestarts": "1"}
        ready_at = run.started + run.load
        if now < ready_at:
            return {"ActiveState": "activating", "SubState": "start-post", "MainPID": str(run.pid)}
        if run.exit0_after_ready is not None and now >= ready_at + run.exit0_after_ready and self.restart_always:
            return {
                "ActiveState": "activating",
                "SubState": "auto-restart",
                "MainPID": "0",
                "NRestarts": "1",
                "ExecMainStatus": "0",
                "ExecMainCode": "1",
                "ExecMainPID": str(run.pid),
            }
        if run.exit0_after_ready is not None and now >= ready_at + run.exit0_after_ready:
            return {
                "ActiveState": "inactive",
                "SubState": "dead",
                "MainPID": "0",
                "ExecMainStatus": "0",
                "ExecMainCode": "1",
                "ExecMainPID": str(run.pid),
            }
        return {
            "ActiveState": "active",
            "SubState": "running",
            "MainPID": str(run.pid),
            "ActiveEnterTimestampMonotonic": str(int(ready_at * 1e6)),
        }

    # commands ------------------------------------------------------------------------------------

    def __call__(self, args) -> tuple:
        self.calls.append(list(args))
        if args[0] == "journalctl":
            return 0, "\n".join(self.journal) + "\n", ""
        verb = args[1]
        if verb == "show":
            wanted = args[3].split("=", 1)[1].split(",")
            props = self.props()
            return 0, "".join(f"{name}={props.get(name, '')}\n" for name in wanted), ""
        if verb == "stop":
            self.run, self.fixed = None, None
            return 0, "", ""
        if verb == "start":
            start = self.starts.pop(0) if self.starts else Start()
            start.started, start.pid = self.clock(), self.next_pid
            self.next_pid += 1
            self.run, self.fixed = start, None
            self.invocation += 1
            self.inactive_exit = int(self.clock() * 1e6) + 7
            return 0, "", ""
        if verb == "daemon-reload":
            self.need_reload = False
        return 0, "", ""

    def verbs(self) -> list:
        return [call[1] for call in self.calls if call[0] == "systemctl" and call[1] != "show"]


class FakeReaper:
    """Answers each scope (``unit`` leftovers, ``orphans``) from a list of results or exceptions, in turn."""

    def __init__(self, unit=None, orphans=None):
        self.answers = {"unit": list(unit or []), "orphans": list(orphans or [])}
        self.calls = []

    def __call__(self, params, check_mode):
        scope = "unit" if "unit" in params else "orphans"
        self.calls.append((scope, params, check_mode))
        queue = self.answers[scope]
        if not queue:
            return {"reaped": [], "unkillable": []}
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def holder(pid=7001, title="sglang::scheduler_TP0"):
    return {"pid": pid, "title": title, "unit": None, "gpus": [0], "used_mib": 44000, "signals": ["SIGTERM"]}


def healthy_probe(**extra) -> dict:
    tiers = [{"name": name, "status": "ok", "reason": "fine", "elapsed_s": 0.01} for name in GATE_TIERS]
    return {
        "healthy": True,
        "failed_tier": None,
        "reason": None,
        "tiers": tiers,
        "main_pid": 4000,
        "gpu_memory_mib": {"0": 69000, "1": 69000},
        "model": {"model_path": "Qwen/Qwen3-8B"},
        "speculative": {"algorithm": None},
        "generation": {"text": "2, 3, 5, 7, 11"},
        **extra,
    }


def failed_probe(tier="gpu", reason="unit active but its processes hold 0 MiB on GPU 0: model not loaded"):
    result = healthy_probe(healthy=False, failed_tier=tier, reason=reason)
    result["tiers"] = tier_list(tier, reason)
    return result


class FakeProbe:
    """Returns the given results in turn (the last one for ever); each call takes ``duration`` seconds."""

    def __init__(self, clock, *results, duration=1.5):
        self.clock = clock
        self.results = list(results) or [healthy_probe()]
        self.duration = duration
        self.calls = []

    def __call__(self, settings):
        self.calls.append(settings)
        self.clock.now += self.duration  # the probe's own time, not a sleep of the chain
        return self.results[min(len(self.calls), len(self.results)) - 1]


class FakeStore:
    def __init__(self, error=None):
        self.saves = []
        self.error = error

    def __call__(self, root):
        self.root = root
        return self

    def save(self, files, dropin_dir, meta, check_mode=False, sources=None):
        if self.error:
            raise self.error
        self.saves.append({"files": files, "dropin_dir": dropin_dir, "meta": meta, "sources": sources})
        return {"changed": True, "msg": "snapshot saved"}


class FakeLocks:
    LockError = LockError

    def __init__(self, busy=False, token="tok-1"):
        self.busy = busy
        self.token = token
        self.calls = []
        # The lock is lost (broken, or let go) once this many checks of it have answered that it is held.
        self.lost_after = None

    def acquire(self, path, owner, timeout, period, margin):
        self.calls.append(("acquire", path, owner, timeout))
        if self.busy:
            raise LockBusy(f"{path} is held by controller=other, play=deploy; gave up after waiting 2.0 s", {})
        return {"token": self.token, "msg": f"acquired {path} after 0.0 s", "waited_s": 0.0}

    def release(self, path, token):
        self.calls.append(("release", path, token))
        return {"released": True, "msg": f"released {path}"}

    def status(self, path):
        self.calls.append(("status", path))
        return {"held": self.busy, "msg": f"{path} is free"}

    def held_with(self, path, token):
        self.calls.append(("held_with", path, token))
        if self.lost_after is not None:
            if self.lost_after <= 0:
                return False
            self.lost_after -= 1
        return token == self.token

    def kinds(self):
        """The calls, by kind, without the checks the chain makes before each step."""
        return [call[0] for call in self.calls if call[0] != "held_with"]


def validated(params: dict) -> dict:
    """``params`` as AnsibleModule hands them to the module: checked against the argument spec, defaults applied."""
    checked = ArgumentSpecValidator(ARGUMENT_SPEC).validate(params)
    assert not checked.error_messages, checked.error_messages
    return checked.validated_parameters


PARAMS = {
    "unit": "sglang-t",
    "url": "http://127.0.0.1:30000",
    "api_key": KEY,
    "gpus": ["0", "1"],
    "ready_timeout": 120,
    "ready_when_active": True,
    "stability_window": 5,
    "soak": 3,
    "reap": {"grace": 10, "timeout": 60, "threshold_mib": 1024},
    "probe": {"expected_model": "Qwen/Qwen3-8B", "max_new_tokens": 32, "generate_timeout": 60},
    "lock": {
        "path": "/run/lock/llmops-sglang-t.lock",
        "owner": {"play": "test"},
        "timeout": 5,
        "renew_period": 30,
        "renew_margin": 60,
    },
    "known_good": {
        "root": "/var/lib/llmops/known-good/sglang-t",
        "files": {"unit": "/etc/systemd/system/sglang-t.service", "environment": "/etc/llmops/sglang-t.env"},
        "dropin_dir": "/etc/systemd/system/sglang-t.service.d",
        "patch_state_id": "pristine",
        "python": "/opt/sglang/venv/bin/python",
    },
    "journal_lines": 30,
    # The reference gate has tests of its own (test_restart_reference.py); here it stays out of the way.
    "reference": {"mode": "off"},
}


class World:
    def __init__(self, state="active", *, starts=(), probe=(), unit_reaps=None, orphan_reaps=None, **unit_kwargs):
        self.clock = FakeClock()
        self.unit = FakeUnit(self.clock, state, starts=starts, **unit_kwargs)
        self.reaper = FakeReaper(unit_reaps, orphan_reaps)
        self.probe = FakeProbe(self.clock, *probe)
        self.store = FakeStore()
        self.locks = FakeLocks()
        self.health_answers = []
        self.ready_answers = [200]
        self.runner = self.unit

    def health(self):
        return self.health_answers.pop(0) if len(self.health_answers) > 1 else self.health_answers[0]

    def ready(self):
        answer = self.ready_answers.pop(0) if len(self.ready_answers) > 1 else self.ready_answers[0]
        if isinstance(answer, int):
            return answer
        raise SglangError(str(answer))  # the refusal the test gave, as the client reports it

    def chain(self, **overrides) -> RestartChain:
        return self.build({**PARAMS, **overrides})

    def build(self, params: dict, **stand_ins) -> RestartChain:
        """The chain on this world's stand-ins (``stand_ins`` adds or replaces some)."""
        return RestartChain(
            parse_chain_options(validated(params)),
            Runners(
                self.runner,
                clock=self.clock,
                sleep=self.clock.sleep,
                reap=self.reaper,
                probe=self.probe,
                health=self.health,
                ready=self.ready,
                store=self.store,
                locks=self.locks,
                **stand_ins,
            ),
        )

    def run(self, check_mode=False, **overrides) -> dict:
        return self.chain(**overrides).run(check_mode=check_mode)


def step_names(result) -> list:
    return [step["name"] for step in result["steps"]]


# -- behind gateways ----------------------------------------------------------------------------------------

ME = "http://10.0.0.5:30000"
OTHERS = ["http://10.0.0.6:30000", "http://10.0.0.7:30000"]
MODEL = "Qwen/Qwen3-8B"
ADMIN_KEY = "gw-adm1n-s3cret"


class Scrapes:
    """The engine's in-flight counts, one per scrape (the last one for ever): (running, queued) of the scheduler's
    gauges (an engine without sglang:http_requests_active), an InFlight, or None when /metrics is down."""

    def __init__(self, *answers):
        self.answers = [self._reading(answer) for answer in answers] or [self._reading((0, 0))]
        self.calls = 0

    @staticmethod
    def _reading(answer):
        if isinstance(answer, tuple):
            running, queued = answer
            return InFlight(SOURCE_SCHEDULER, running + queued, running, queued)
        return answer

    def __call__(self):
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


def fleet(gateways, workers=(ME, *OTHERS)):
    for gateway in gateways:
        for worker in workers:
            gateway.register(worker)


class GatewayWorld(World):
    """A World whose unit records, at each systemctl stop and start, what every gateway listed then."""

    def __init__(self, gateways, scrapes=None, **kwargs):
        super().__init__(**kwargs)
        self.gateways = gateways
        self.scrapes = scrapes or Scrapes()
        self.listed_at = {}
        unit = self.unit

        def recording(args):
            if args[0] == "systemctl" and args[1] in ("stop", "start"):
                self.listed_at.setdefault(args[1], [gateway.listed() for gateway in gateways])
            return unit(args)

        self.runner = recording

    def chain(self, **overrides) -> RestartChain:
        params = {
            **PARAMS,
            "gateways": [gateway.url for gateway in self.gateways],
            "gateway_api_key": ADMIN_KEY,
            "gateway_worker_url": ME,
            "gateway_wait_timeout": 30,
            "drain_timeout": 5,
            **overrides,
        }
        return self.build(params, scrape=self.scrapes)
