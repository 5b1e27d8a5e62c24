from __future__ import annotations

import os
import signal

import pytest
from fake_proc import PF_KTHREAD, FakeClock, FakeProc

from ansible_collections.llmops.inference.plugins.module_utils import procs


@pytest.fixture
def fake(tmp_path):
    return FakeProc(tmp_path / "proc")


def test_parse_stat_reads_fields_after_the_last_parenthesis():
    stat = procs.parse_stat("4242 (evil) name (x)) R 17 4242 4242 0 -1 4194560 " + "0 " * 12 + "987 0 0\n")
    assert (stat.pid, stat.comm, stat.state, stat.ppid) == (4242, "evil) name (x)", "R", 17)
    assert stat.flags == 4194560
    assert stat.start_time == 987


CGROUP_V1 = """12:pids:/system.slice/t-reap.service
11:memory:/system.slice/t-reap.service
1:name=systemd:/system.slice/t-reap.service
"""
CGROUP_V2 = "0::/system.slice/sglang-qwen.service\n"
CGROUP_HYBRID = """5:cpu,cpuacct:/
1:name=systemd:/system.slice/t-reap.service
0::/system.slice/other.service
"""


@pytest.mark.parametrize(
    ("text", "path", "unit"),
    [
        (CGROUP_V1, "/system.slice/t-reap.service", "t-reap.service"),
        (CGROUP_V2, "/system.slice/sglang-qwen.service", "sglang-qwen.service"),
        (CGROUP_HYBRID, "/system.slice/t-reap.service", "t-reap.service"),
        (
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "/user.slice/user-0.slice/session-3.scope",
            "session-3.scope",
        ),
        ("0::/system.slice/foo.service/payload\n", "/system.slice/foo.service/payload", "foo.service"),
        (
            "0::/machine.slice/lab.service/system.slice/x.service\n",
            "/machine.slice/lab.service/system.slice/x.service",
            "x.service",
        ),
        ("0::/\n", "/", None),
        ("", "", None),
        # A zombie whose cgroup was removed before it was reaped (kernel/cgroup/cgroup.c, proc_cgroup_show).
        ("0::/system.slice/sglang.service (deleted)\n", "/system.slice/sglang.service", "sglang.service"),
    ],
)
def test_unit_from_cgroup_file_handles_v1_v2_and_hybrid(text, path, unit):
    assert procs.unit_from_cgroup_file(text) == (path, unit)


def test_read_process_reports_title_cmdline_and_unit(fake):
    fake.add(300, ppid=1, argv=["sglang::scheduler_TP0", "", ""], comm="sglang::schedul", cgroup=CGROUP_V1)
    proc = procs.read_process(300, str(fake.root))
    assert proc.title == "sglang::scheduler_TP0"
    assert proc.cmdline == "sglang::scheduler_TP0"
    assert proc.comm == "sglang::schedul"
    assert proc.unit == "t-reap.service"
    assert proc.in_unit("t-reap.service")
    assert not proc.is_kernel_thread
    assert proc.is_alive


def test_read_process_joins_arguments_and_falls_back_to_comm(fake):
    fake.add(301, argv=["/opt/venv/bin/python", "-m", "srv", "--tp-size", "2"])
    fake.add(302, argv=[], comm="zombie", state="Z")
    assert procs.read_process(301, str(fake.root)).cmdline == "/opt/venv/bin/python -m srv --tp-size 2"
    zombie = procs.read_process(302, str(fake.root))
    assert zombie.title == "zombie"
    assert not zombie.is_alive
    assert not zombie.is_kernel_thread, "an empty cmdline alone (zombies) is no kernel thread"


@pytest.mark.parametrize(("pid", "ppid", "flags"), [(2, 0, 0), (40, 2, 0), (41, 0, PF_KTHREAD)])
def test_kernel_threads_are_recognised(fake, pid, ppid, flags):
    fake.add(pid, ppid=ppid, argv=[], comm="kworker/0:1", flags=flags)
    assert procs.read_process(pid, str(fake.root)).is_kernel_thread


def test_missing_process_reads_as_none(fake):
    assert procs.read_process(999, str(fake.root)) is None
    assert not procs.is_alive(999, str(fake.root))


def test_a_process_that_exits_after_its_stat_was_read_reads_as_none_not_as_outside_every_unit(fake):
    fake.add(303, argv=["sglang::scheduler_TP0"], cgroup="0::/system.slice/sglang.service\n")
    (fake.root / "303" / "cgroup").unlink()
    assert procs.read_process(303, str(fake.root)) is None


def test_list_processes_and_pids_of_unit(fake):
    fake.add(10, cgroup="0::/system.slice/a.service")
    fake.add(11, cgroup="0::/system.slice/a.service/worker")
    fake.add(12, cgroup="0::/system.slice/b.service")
    (fake.root / "self").mkdir()
    assert [p.pid for p in procs.list_processes(str(fake.root))] == [10, 11, 12]
    assert procs.pids_of_unit("a.service", str(fake.root)) == [10, 11]


def test_ancestors_walks_up_to_init(fake):
    fake.add(1, ppid=0, argv=["/sbin/init"])
    fake.add(50, ppid=1)
    fake.add(60, ppid=50)
    fake.add(70, ppid=60)
    assert procs.ancestors(70, str(fake.root)) == [60, 50, 1]


def test_is_orphan_for_init_and_systemd_user_parents(fake):
    fake.add(1, ppid=0, argv=["/sbin/init"])
    fake.add(20, ppid=1, argv=["/lib/systemd/systemd", "--user"])
    fake.add(21, ppid=1)
    fake.add(22, ppid=20)
    fake.add(23, ppid=22)
    root = str(fake.root)
    assert procs.is_orphan(procs.read_process(21, root), root)
    assert procs.is_orphan(procs.read_process(22, root), root)
    assert not procs.is_orphan(procs.read_process(23, root), root)


def test_is_alive_treats_a_reused_pid_as_gone(fake):
    fake.add(80, start_time=5)
    assert procs.is_alive(80, str(fake.root), start_time=5)
    assert not procs.is_alive(80, str(fake.root), start_time=6)


@pytest.mark.parametrize(("value", "number"), [("SIGTERM", 15), ("term", 15), ("SIGKILL", 9), (2, 2), ("15", 15)])
def test_signal_number_accepts_names_and_numbers(value, number):
    assert procs.signal_number(value) == number


@pytest.mark.parametrize("value", ["SIGNOPE", "999", "", "-1"])
def test_signal_number_rejects_unknown_signals(value):
    with pytest.raises(ValueError, match="signal"):
        procs.signal_number(value)


def test_send_signal_reports_a_missing_process():
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    assert procs.send_signal(child, signal.SIGTERM) is False
    assert procs.send_signal(os.getpid(), 0) is True


def test_wait_for_polls_until_true_with_capped_interval():
    clock = FakeClock()
    assert procs.wait_for(lambda: clock.now >= 1.0, timeout=5, interval=1.0, clock=clock, sleep=clock.sleep)
    assert max(clock.sleeps) <= procs.MAX_POLL_INTERVAL
    assert 1.0 <= clock.now <= 1.0 + procs.MAX_POLL_INTERVAL


def test_wait_for_gives_up_at_the_deadline_after_a_last_check():
    clock = FakeClock()
    checks = []
    assert not procs.wait_for(lambda: checks.append(clock.now) and False, timeout=1.0, clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(1.0)
    assert checks[-1] == pytest.approx(1.0)


def test_wait_for_with_zero_timeout_checks_once():
    clock = FakeClock()
    assert procs.wait_for(lambda: True, timeout=0, clock=clock, sleep=clock.sleep)
    assert not procs.wait_for(lambda: False, timeout=0, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []
