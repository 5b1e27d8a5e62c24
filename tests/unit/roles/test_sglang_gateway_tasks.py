"""The sglang_gateway role reads the unit and its journal through modules, never by running systemctl or journalctl."""

from __future__ import annotations

from pathlib import Path

import yaml

TASKS = Path(__file__).resolve().parents[3] / "roles" / "sglang_gateway" / "tasks"
COMMAND_MODULES = {
    f"{prefix}{name}" for prefix in ("", "ansible.builtin.", "ansible.legacy.") for name in ("command", "shell", "raw")
}
SYSTEMD_TOOLS = ("systemctl", "journalctl")


def tasks(entries: list):
    """Every task in a task file, blocks walked."""
    for entry in entries or []:
        yield entry
        for section in ("block", "rescue", "always"):
            yield from tasks(entry.get(section))


def command_line(task: dict) -> str:
    """What a command, shell or raw task runs, as text ('' for any other task)."""
    for name in COMMAND_MODULES & task.keys():
        args = task[name]
        if isinstance(args, dict):
            return " ".join(str(part) for part in args.get("argv") or [args.get("cmd") or args.get("_raw_params")])
        return str(args)
    return ""


def test_no_task_runs_systemctl_or_journalctl():
    found = [
        f"{path.name}: {task.get('name')}"
        for path in sorted(TASKS.glob("*.yml"))
        for task in tasks(yaml.safe_load(path.read_text()))
        if any(tool in command_line(task) for tool in SYSTEMD_TOOLS)
    ]
    assert found == [], "use ansible.builtin.systemd_service and llmops.inference.sglang_probe's journal_lines"


def test_the_failure_message_takes_the_journal_from_the_probe_and_redacts_nothing_in_jinja():
    restart = (TASKS / "restart.yml").read_text()
    assert 'journal_lines: "{{ sglang_gateway_journal_lines }}"' in restart
    assert "map('replace'" not in restart, "the probe's journal is already redacted by the shared redactor"
