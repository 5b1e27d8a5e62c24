"""Command line: ``lab image | up | down | status | exec``."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from . import hosts, image, inventory, payload
from .state import MAX_HOSTS, NAME_RE, LabState, addresses, allocate_subnet, global_lock
from .system import LabError, require_root, require_tools, run

MAX_GPUS = 16
HOST_ENV = [
    "env",
    "-i",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "TERM=dumb",
]


class Interrupted(Exception):
    """A signal arrived while the lab was changing the machine."""


# What a test lab adds to `lab up` (make e2e, make molecule): the compiled code of Ansible's modules cached on its
# hosts, and SGLang's SIGTERM watchdog looking every second instead of every 5 s, as the lab's engines load in a
# second instead of minutes. A benchmark's lab has neither: our modules pay the CPU a real host pays, and stops wait
# SGLang's real ticks. The tests about the drain's timing pin the 5 s tick in their units' environment.
TEST_LAB_OPTIONS = ("--cache-module-code", "--sim-env", "SGLANG_SIM_SIGTERM_POLL=1")


def _raise_interrupted(signum, _frame):
    raise Interrupted(f"interrupted by signal {signum}")


def _bounded_int(flag: str, low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer from {low} to {high}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be from {low} to {high}, got {value}")
        return value

    return parse


def _mig(text: str) -> tuple[int, str]:
    gpu, sep, spec = text.partition(":")
    if not sep or not gpu.isdigit():
        raise argparse.ArgumentTypeError(f"--mig must be GPU:SPEC (e.g. 0:2 or 1:3g.40gb,2g.20gb), got {text!r}")
    try:
        payload.simgpu_state.mig_profiles(spec)
    except payload.simgpu_state.StateError as exc:
        raise argparse.ArgumentTypeError(f"--mig {text}: {exc}") from None
    return int(gpu), spec


def _sim_env(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not payload.SIM_ENV_RE.match(name) or not value or any(c.isspace() or c in '"\\' for c in value):
        raise argparse.ArgumentTypeError(
            f"--sim-env must be SGLANG_SIM_NAME=VALUE (a knob of the simulated engine, a value without spaces or "
            f"quotes), got {text!r}"
        )
    return name, value


def _lab_name(text: str) -> str:
    if not NAME_RE.match(text):
        raise argparse.ArgumentTypeError(
            f"--name must be 1-6 lowercase letters or digits, starting and ending with a letter, got {text!r}"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lab",
        description="Lab hosts for llmops.inference: Debian bookworm booted with systemd-nspawn "
        "(real systemd, real sshd), simulated GPUs and a simulated SGLang engine. Run as root.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    img = sub.add_parser("image", help="build the cached rootfs (once per recipe) and print its path")
    img.add_argument("--rebuild", action="store_true", help="rebuild even when a cached rootfs exists")

    for name, text in (
        ("up", "boot hosts and write an inventory (cleans a stale lab of the same name first)"),
        ("down", "stop the hosts and remove every mount, link, process and file the lab made"),
        ("status", "show the lab's hosts"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--name", type=_lab_name, default="lab", help="lab instance name (default: lab)")
        if name == "up":
            cmd.add_argument(
                "--hosts",
                type=_bounded_int("--hosts", 1, MAX_HOSTS),
                default=1,
                help=f"number of hosts, 1 to {MAX_HOSTS} (default 1)",
            )
            cmd.add_argument(
                "--gpus",
                type=_bounded_int("--gpus", 1, MAX_GPUS),
                default=2,
                help=f"simulated GPUs per host, 1 to {MAX_GPUS} (default 2)",
            )
            cmd.add_argument(
                "--mig",
                type=_mig,
                action="append",
                default=[],
                metavar="GPU:SPEC",
                help="put GPU in MIG mode on every host: SPEC is 1, 2, 3 or 7 equal instances, or profiles "
                "(1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb) joined by commas; repeatable",
            )
            cmd.add_argument(
                "--cache-module-code",
                action="store_true",
                help="cache the compiled code of the modules Ansible runs on the hosts (test labs: each task then "
                "costs a host about 60 %% less CPU; off for benchmarks, where our modules pay what a real host does)",
            )
            cmd.add_argument(
                "--sim-env",
                type=_sim_env,
                action="append",
                default=[],
                metavar="SGLANG_SIM_NAME=VALUE",
                help="a default of the simulated engine's knobs for every unit the hosts start (systemd's "
                "DefaultEnvironment; a unit's own Environment= wins), e.g. SGLANG_SIM_SIGTERM_POLL=1; repeatable",
            )
            cmd.add_argument(
                "--gpu-reserved-mib",
                type=_bounded_int("--gpu-reserved-mib", 0, payload.GPU_TOTAL_MIB - 1),
                default=payload.simgpu_state.DEFAULT_RESERVED_MIB,
                help="the driver's reservation on each GPU in MiB: part of NVML's v1 used, v2's reserved "
                f"(default {payload.simgpu_state.DEFAULT_RESERVED_MIB}, an idle {payload.GPU_NAME}'s)",
            )

            cmd.add_argument(
                "--gpu-host-pids",
                action="store_true",
                help="the simulated GPUs list holders by PIDs of the outer host's namespace, as a real driver does on "
                f"a container host (each PID plus {payload.simgpu_state.CONTAINER_HOST_PID_OFFSET}, absent from the "
                "host's /proc); off by default",
            )

    ex = sub.add_parser("exec", help="run a command inside a host (no SSH), e.g. lab exec lab1 -- systemctl status")
    ex.add_argument("--name", type=_lab_name, default="lab")
    ex.add_argument("host")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    return parser


def cmd_image(args) -> int:
    require_root()
    require_tools(["debootstrap", "systemd-nspawn"])
    print(image.ensure_image(rebuild=args.rebuild, log=_log))
    return 0


def cmd_up(args) -> int:
    mig = dict(args.mig)
    if any(gpu >= args.gpus for gpu in mig):
        _log(f"error: --mig names GPU {max(mig)} but hosts have {args.gpus} GPU(s) (0 to {args.gpus - 1})")
        return 2
    require_root()
    require_tools()
    rootfs = image.ensure_image(log=_log)
    simgpu_build = payload.build_simgpu()
    state = LabState(args.name)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_interrupted)
    try:
        with global_lock():
            hosts.teardown(state)
            data = {
                "name": args.name,
                "subnet": allocate_subnet(args.name),
                "gpus": args.gpus,
                "mig": {str(gpu): spec for gpu, spec in mig.items()},
                "gpu_reserved_mib": args.gpu_reserved_mib,
                "gpu_host_pids": args.gpu_host_pids,
                "hosts": [],
                "status": "starting",
                "rootfs": str(rootfs),
            }
            state.save(data)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"llmops-lab-{args.name}", "-f", str(state.key)])
        public_key = state.key.with_suffix(".pub").read_text()
        for index in range(1, args.hosts + 1):
            host = state.host_name(index)
            host_side, container_side = addresses(data["subnet"], index)
            host_dir = state.host_dir(host)
            merged = hosts.mount_overlay(rootfs, host_dir)
            payload.install(
                merged,
                host,
                container_side,
                host_side,
                public_key,
                args.gpus,
                simgpu_build,
                mig,
                reserved_mib=args.gpu_reserved_mib,
                host_pids=args.gpu_host_pids,
                cache_module_code=args.cache_module_code,
                sim_env=dict(args.sim_env),
            )
            log_path = state.run_dir / f"{host}.console.log"
            pid = hosts.start_container(host, merged, log_path, hosts.host_cgroups(state, host))
            data["hosts"].append(
                {
                    "name": host,
                    "address": container_side,
                    "host_address": host_side,
                    "nspawn_pid": pid,
                    "log": str(log_path),
                    "mig_uuids": payload.mig_uuids(host, args.gpus, mig),
                }
            )
            state.save(data)
        for entry in data["hosts"]:
            hosts.configure_host_link(entry["name"], entry["host_address"], entry["address"])
        for entry in data["hosts"]:
            entry["init_pid"] = hosts.wait_booted(
                entry["name"], entry["nspawn_pid"], entry["address"], state.run_dir / f"{entry['name']}.console.log"
            )
        state.inventory.write_text(inventory.render(data["hosts"], state.key, args.gpus, args.gpu_host_pids))
        data["status"] = "up"
        state.save(data)
    except BaseException as exc:
        _log(f"lab up failed ({exc}); cleaning up")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        hosts.teardown(state)
        raise
    _log(f"{len(data['hosts'])} host(s) up: " + ", ".join(f"{h['name']}={h['address']}" for h in data["hosts"]))
    print(state.inventory)
    return 0


def cmd_down(args) -> int:
    require_root()
    state = LabState(args.name)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    leftovers = hosts.teardown(state)
    if leftovers:
        raise LabError("could not remove: " + "; ".join(leftovers))
    _log(f"lab {args.name} is down")
    return 0


def cmd_status(args) -> int:
    state = LabState(args.name)
    data = state.load()
    if not data:
        print(f"lab {args.name}: not up")
        leftovers = hosts.leftover_report(state)
        for item in leftovers:
            print(f"  stale: {item}")
        return 1 if leftovers else 0
    mig = ", ".join(f"GPU {gpu} MIG {spec}" for gpu, spec in sorted(data.get("mig", {}).items()))
    print(
        f"lab {args.name}: {data.get('status')}, subnet 10.213.{data['subnet']}.0/24, {data['gpus']} GPU(s) per host"
        + (f" ({mig})" if mig else "")
    )
    for entry in data["hosts"]:
        init_pid = hosts.container_init(entry["nspawn_pid"])
        system = hosts.system_state(init_pid) if init_pid else "stopped"
        print(f"  {entry['name']}: {entry['address']} nspawn={entry['nspawn_pid']} system={system}")
    if data.get("status") == "up":
        print(f"  inventory: {state.inventory}")
    return 0


def exec_argv(name: str, host: str, argv: list) -> list:
    """The command line that runs ``argv`` inside a lab host (what ``lab exec`` runs), for callers that run many
    commands and would rather not start this CLI for each."""
    data = LabState(name).load()
    entry = next((h for h in data.get("hosts", []) if h["name"] == host), None)
    if entry is None:
        known = ", ".join(h["name"] for h in data.get("hosts", [])) or "none"
        raise LabError(f"no host {host!r} in lab {name} (hosts: {known})")
    init_pid = hosts.container_init(entry["nspawn_pid"])
    if init_pid is None:
        raise LabError(f"host {host} is not running")
    return ["nsenter", "-t", str(init_pid), "-a", "--", *HOST_ENV, *argv]


def cmd_exec(args) -> int:
    require_root()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise LabError("exec needs a command after --")
    os.execvp("nsenter", exec_argv(args.name, args.host, argv))
    return 127


def _log(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


COMMANDS = {"image": cmd_image, "up": cmd_up, "down": cmd_down, "status": cmd_status, "exec": cmd_exec}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except LabError as exc:
        _log(f"error: {exc}")
        return 1
    except Interrupted as exc:
        _log(str(exc))
        return 130
