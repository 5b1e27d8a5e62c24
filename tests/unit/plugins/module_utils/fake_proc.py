"""Test doubles for /proc, signals, a clock, GPUs and systemctl, shared by the module_utils unit tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ansible_collections.llmops.inference.plugins.module_utils.gpu import Gpu, GpuProcess

PF_KTHREAD = 0x00200000


class FakeProc:
    """A /proc tree in a directory: stat, cmdline, cgroup and fd links per PID."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        *,
        ppid: int = 1,
        argv=("python",),
        comm: str | None = None,
        state: str = "S",
        cgroup: str = "0::/",
        flags: int = 0,
        start_time: int = 1000,
        fds: dict | None = None,
    ) -> int:
        base = self.root / str(pid)
        (base / "fd").mkdir(parents=True, exist_ok=True)
        comm = comm if comm is not None else (os.path.basename(argv[0]) if argv else "kworker")[:15]
        self._write_stat(pid, comm, state=state, ppid=ppid, flags=flags, start_time=start_time)
        (base / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in argv))
        (base / "cgroup").write_text(cgroup if cgroup.endswith("\n") else cgroup + "\n")
        for fd, target in (fds or {}).items():
            os.symlink(target, base / "fd" / str(fd))
        return pid

    def _write_stat(self, pid, comm, *, state, ppid, flags, start_time):
        fields = [state, ppid, pid, pid, 0, -1, flags] + [0] * 12 + [start_time, 0, 0]
        (self.root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n")

    def stat_fields(self, pid: int) -> tuple:
        text = (self.root / str(pid) / "stat").read_text()
        comm = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 1 :].split()
        return comm, rest

    def set_state(self, pid: int, state: str) -> None:
        comm, rest = self.stat_fields(pid)
        self._write_stat(pid, comm, state=state, ppid=int(rest[1]), flags=int(rest[6]), start_time=int(rest[19]))

    def set_start_time(self, pid: int, start_time: int) -> None:
        comm, rest = self.stat_fields(pid)
        self._write_stat(pid, comm, state=rest[0], ppid=int(rest[1]), flags=int(rest[6]), start_time=start_time)

    def exists(self, pid: int) -> bool:
        return (self.root / str(pid)).exists()

    def state(self, pid: int) -> str:
        return self.stat_fields(pid)[1][0]

    def remove(self, pid: int) -> None:
        base = self.root / str(pid)
        for child in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if child.is_symlink() or child.is_file():
                child.unlink()
            else:
                child.rmdir()
        base.rmdir()


class FakeClock:
    """Monotonic time that only moves when the code under test sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeKernel:
    """Delivers signals to FakeProc processes: a process dies unless it ignores the signal or sits in D state."""

    def __init__(self, proc: FakeProc, clock: FakeClock):
        self.proc = proc
        self.clock = clock
        self.ignores = {}
        self.sent = []
        self.died_at = {}

    def ignore(self, pid: int, *signals) -> None:
        self.ignores[pid] = set(signals)

    def kill(self, pid: int, sig: int) -> bool:
        if not self.proc.exists(pid):
            return False
        self.sent.append((pid, signal.Signals(sig).name, self.clock()))
        if self.proc.state(pid) == "D" or sig in self.ignores.get(pid, set()):
            return True
        self.proc.remove(pid)
        self.died_at[pid] = self.clock()
        return True


class FakeGpus:
    """GPUs whose memory is claimed per PID, counted and listed while the PID is alive (like the driver).

    ``release_lag`` keeps a dead PID's claim counted as used for that many seconds after it died, without the PID
    in the process list (NVML lists live processes only). Claims of ``stuck`` PIDs count and are listed whatever
    their state, also when the PID is gone (a zombie stuck in the driver, or a PID of another namespace), and
    ``unlisted`` MiB per GPU are used without any process listed for them.
    """

    def __init__(self, proc: FakeProc, kernel: FakeKernel, count: int = 2, total_mib: int = 81559):
        self.proc = proc
        self.kernel = kernel
        self.count = count
        self.total_mib = total_mib
        self.claims = {}
        self.release_lag = 0.0
        self.backend = "nvml"
        self.queries = 0
        self.stuck = set()
        self.unlisted = {}
        # The driver's reservation (NVML v2's ``reserved``), counted in used; None: a driver that does not report it.
        self.reserved_mib = None

    def claim(self, pid: int, gpu: int, mib: int | None) -> None:
        self.claims[(pid, gpu)] = mib

    def _listed(self, pid: int) -> bool:
        if pid in self.stuck:
            return True
        return self.proc.exists(pid) and self.proc.state(pid) not in ("Z", "X")

    def _releasing(self, pid: int) -> bool:
        """Gone (or a zombie), and its memory not yet released by the driver."""
        died = self.kernel.died_at.get(pid)
        return died is not None and self.kernel.clock() - died < self.release_lag

    def __call__(self, backend="auto", run_command=None) -> tuple:
        self.queries += 1
        gpus = []
        for index in range(self.count):
            claims = [(pid, mib) for (pid, gpu), mib in sorted(self.claims.items()) if gpu == index]
            processes = [GpuProcess(pid, mib) for pid, mib in claims if self._listed(pid)]
            releasing = sum(mib or 0 for pid, mib in claims if not self._listed(pid) and self._releasing(pid))
            used = 1 + sum(p.used_mib or 0 for p in processes) + releasing + self.unlisted.get(index, 0)
            used += self.reserved_mib or 0
            uuid = f"GPU-00000000-0000-4000-8000-00000000000{index}"
            gpu = Gpu(index, uuid, "NVIDIA H100 80GB HBM3", self.total_mib, used, processes)
            gpu.reserved_mib = self.reserved_mib
            gpus.append(gpu)
        return self.backend, gpus


class FakeSystemctl:
    """Answers `systemctl list-units` and `systemctl show` from a {unit: ActiveState} table."""

    def __init__(self, units: dict | None = None):
        self.units = dict(units or {})
        self.calls = []

    def __call__(self, args) -> tuple:
        self.calls.append(list(args))
        if args[:2] == ["systemctl", "list-units"]:
            lines = [
                f"{name} loaded {state} {'running' if state == 'active' else 'dead'} {name}"
                for name, state in self.units.items()
            ]
            return 0, "\n".join(lines) + "\n", ""
        if args[:2] == ["systemctl", "show"]:
            name = args[2]
            state = self.units.get(name)
            load = "loaded" if state is not None else "not-found"
            text = (
                f"Id={name}\nLoadState={load}\nActiveState={state or 'inactive'}\nSubState=dead\nResult=success\n"
                f"MainPID=0\nNRestarts=0\nControlGroup=/system.slice/{name}\nExecMainStatus=0\n"
            )
            return 0, text, ""
        return 1, "", f"unexpected command {args}"
