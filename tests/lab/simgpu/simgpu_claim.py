"""Claim, release or hold simulated GPU memory; build the unreapable cases; reset a GPU; switch MIG mode.

simgpu-claim --gpu DEV --mib M [--pid PID] [--force] [--stuck]  claim M MiB on DEV for PID (default: the caller)
simgpu-claim --gpu DEV --release [--pid PID]                   free PID's claim on DEV at once
simgpu-claim --hold --gpu DEV --mib M [--ignore-sigterm]        claim for this process and sleep until signalled
simgpu-claim --zombie --gpu DEV --mib M                         a zombie child holds M MiB, never reaped by us
simgpu-claim --stuck --gpu DEV --mib M                          M MiB held by a PID that no longer exists
simgpu-claim --reset-gpu N                                      GPU reset: frees GPU N when no process uses it
simgpu-claim --mig N:SPEC | --mig-off N                         MIG mode on GPU N (SPEC: 1, 2, 3, 7 or PROFILES)
simgpu-claim --gc                                               delete claims that no longer count

DEV is a GPU index, N:K for MIG device K of GPU N, or a GPU-/MIG- UUID. State: $SIMGPU_STATE_DIR
(default /var/lib/simgpu); see README.md next to this script.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

# Installed as /usr/local/bin/simgpu-claim with its module in /usr/local/lib/simgpu; in the source tree
# (and the build directory) the two sit side by side.
_HERE = Path(os.path.realpath(__file__)).parent
for _candidate in (_HERE, _HERE.parent / "lib" / "simgpu"):
    if (_candidate / "simgpu_state.py").exists() and str(_candidate) not in sys.path:
        sys.path.insert(0, str(_candidate))

import simgpu_state as state  # noqa: E402


class ClaimError(Exception):
    """A request refused before anything changed; the message names the offending input."""


def non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number 0 or more")
    return value


def positive_int(text):
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not a process ID")
    return value


def mig_spec(text):
    gpu, sep, spec = text.partition(":")
    if not sep or not gpu.isdigit() or not spec:
        raise argparse.ArgumentTypeError(f"{text!r} is not GPU:SPEC (e.g. 0:2 or 0:3g.40gb,2g.20gb)")
    return int(gpu), spec


def _gpus(state_dir):
    try:
        return state.read_gpus(state_dir)
    except state.StateError as exc:
        raise ClaimError(f"{exc} (set SIMGPU_STATE_DIR or --state-dir)") from None


def resolve_device(state_dir, text, for_claim=True):
    """(gpu, mig device or None, total MiB) for --gpu; a MIG-mode GPU takes claims only on its MIG devices."""
    gpus = _gpus(state_dir)
    found = state.find_device(gpus, text)
    if found is None:
        known = ", ".join(str(g.index) for g in gpus) or "none"
        raise ClaimError(f"--gpu {text}: no such GPU in {state_dir}/gpus (GPUs: {known})")
    gpu, mig = found
    if for_claim and mig is None and gpu.mig_enabled:
        devices = ", ".join(f"{gpu.index}:{m.index}" for m in gpu.mig)
        raise ClaimError(f"--gpu {text}: GPU {gpu.index} is in MIG mode; claim on one of its MIG devices: {devices}")
    return gpu, mig, (mig.total_mib if mig else gpu.total_mib)


def claim(state_dir, device, mib, pid, force, flags=()):
    gpu, mig, total = resolve_device(state_dir, device)
    if not state.pid_alive(pid):
        raise ClaimError(f"--pid {pid}: no such running process")
    mig_index = mig.index if mig else None
    with state.locked(state_dir):
        free = total - state.used_mib(state_dir, gpu.index, mig_index, exclude_pid=pid)
        if mib > free and not force:
            raise ClaimError(
                f"out of memory: --mib {mib} is more than the {max(free, 0)} MiB free on GPU {device} "
                f"(total {total} MiB); --force claims it anyway"
            )
        state.write_claim(state_dir, gpu.index, mig_index, pid, mib, flags)
    return gpu, mig_index


def release(state_dir, device, pid):
    gpu, mig, _total = resolve_device(state_dir, device, for_claim=False)
    state.remove_claim(state_dir, gpu.index, mig.index if mig else None, pid)


def hold(state_dir, device, mib, force, ignore_sigterm):
    """Hold a claim as this process, like a GPU job, until SIGTERM/SIGINT (or SIGKILL).

    Exiting records the exit, which starts the driver's release lag.
    """
    pid = os.getpid()
    claim(state_dir, device, mib, pid, force)

    def stop(_signum, _frame):
        state.mark_pid_exit(state_dir, pid)
        sys.exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else stop)
    signal.signal(signal.SIGINT, stop)
    print(f"holding {mib} MiB on GPU {device} as PID {pid}", flush=True)
    while True:
        signal.pause()


def _child_holder(state_dir, device, mib, force, flags):
    """Fork a child that claims for itself and exits at once; returns its PID (the child never returns)."""
    resolve_device(state_dir, device)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        status = 0
        try:
            claim(state_dir, device, mib, os.getpid(), force, flags)
        except ClaimError as exc:
            print(f"simgpu-claim: error: {exc}", file=sys.stderr, flush=True)
            status = 1
        os.write(ready_w, bytes([status]))
        os._exit(status)
    os.close(ready_w)
    status = os.read(ready_r, 1)
    os.close(ready_r)
    if status != b"\0":
        os.waitpid(pid, 0)
        raise ClaimError("the holder could not claim the memory (see above)")
    return pid


def zombie(state_dir, device, mib, force):
    """A claim held by a zombie: the child exits, this process (its parent) never reaps it and stays."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # SIG_IGN would make the kernel reap it at once
    child = _child_holder(state_dir, device, mib, force, [state.FLAG_ZOMBIE])
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # wait until it has exited, without reaping it
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(0))
    print(
        f"zombie PID {child} holds {mib} MiB on GPU {device}; its parent PID {os.getpid()} never reaps it",
        flush=True,
    )
    while True:
        signal.pause()


def stuck(state_dir, device, mib, force):
    """A claim that outlives its PID: the child claims and exits, and is reaped; only a GPU reset frees it."""
    child = _child_holder(state_dir, device, mib, force, [state.FLAG_STUCK])
    os.waitpid(child, 0)
    gpu, _mig, _total = resolve_device(state_dir, device)
    print(
        f"stuck: {mib} MiB on GPU {device} held by PID {child}, which no longer exists; "
        f"only `simgpu-claim --reset-gpu {gpu.index}` frees it",
        flush=True,
    )


def build_parser():
    parser = argparse.ArgumentParser(
        prog="simgpu-claim",
        description="Claim, release or hold simulated GPU memory (simgpu).",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--release", action="store_true", help="free the claim of --pid on --gpu at once")
    mode.add_argument("--hold", action="store_true", help="claim for this process and sleep until signalled")
    mode.add_argument("--zombie", action="store_true", help="a zombie child of this process holds the memory")
    mode.add_argument("--gc", action="store_true", help="delete claims that no longer count")
    mode.add_argument("--reset-gpu", type=non_negative_int, metavar="N", help="reset GPU N")
    mode.add_argument("--mig", type=mig_spec, metavar="N:SPEC", help="enable MIG on GPU N with these instances")
    mode.add_argument("--mig-off", type=non_negative_int, metavar="N", help="disable MIG on GPU N")
    parser.add_argument("--gpu", help="GPU index, N:K for a MIG device, or a GPU-/MIG- UUID")
    parser.add_argument("--mib", type=non_negative_int, help="MiB to claim")
    parser.add_argument("--pid", type=positive_int, help="process that holds the claim (default: the caller)")
    parser.add_argument("--force", action="store_true", help="claim even beyond the free memory")
    parser.add_argument("--stuck", action="store_true", help="the memory stays used after the holder is gone")
    parser.add_argument("--ignore-sigterm", action="store_true", help="with --hold: survive SIGTERM")
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("SIMGPU_STATE_DIR") or state.DEFAULT_STATE_DIR,
        help=f"state directory (default: $SIMGPU_STATE_DIR or {state.DEFAULT_STATE_DIR})",
    )
    return parser


def mode_of(args):
    for name in ("release", "hold", "zombie", "gc"):
        if getattr(args, name):
            return f"--{name}"
    if args.reset_gpu is not None:
        return "--reset-gpu"
    if args.mig is not None:
        return "--mig"
    if args.mig_off is not None:
        return "--mig-off"
    return None


def check_combination(parser, args):
    mode = mode_of(args)
    device_modes = (None, "--release", "--hold", "--zombie")
    needs_gpu = mode in device_modes
    needs_mib = mode in (None, "--hold", "--zombie")
    if needs_gpu and args.gpu is None:
        parser.error(f"{mode or 'claiming'} needs --gpu")
    if needs_mib and args.mib is None:
        parser.error(f"{mode or 'claiming'} needs --mib")
    if not needs_gpu and args.gpu is not None:
        parser.error(f"{mode} takes no --gpu")
    if not needs_mib and args.mib is not None:
        parser.error(f"{mode} takes no --mib")
    if args.pid is not None and mode not in (None, "--release"):
        parser.error(f"{mode} takes no --pid")
    if args.force and mode not in (None, "--hold", "--zombie"):
        parser.error(f"{mode} takes no --force")
    if args.stuck and mode is not None:
        parser.error(f"--stuck does not go with {mode}")
    if args.ignore_sigterm and mode != "--hold":
        parser.error("--ignore-sigterm only applies to --hold")


def run(args):
    state_dir = Path(args.state_dir)
    mode = mode_of(args)
    if mode == "--gc":
        for name in state.collect_garbage(state_dir):
            print(f"removed {name}")
    elif mode == "--reset-gpu":
        _gpu, _mig, _total = resolve_device(state_dir, str(args.reset_gpu), for_claim=False)
        removed = state.reset_gpu(state_dir, args.reset_gpu)
        print(f"GPU {args.reset_gpu} reset; freed {len(removed)} claim(s)")
    elif mode in ("--mig", "--mig-off"):
        gpu, spec = args.mig if mode == "--mig" else (args.mig_off, None)
        for line in state.set_mig(state_dir, gpu, spec):
            fields = line.split("\t")
            print(f"GPU {gpu} MIG device {fields[1]}: {fields[4]} ({fields[3]} MiB, {fields[2]})")
        if spec is None:
            print(f"GPU {gpu}: MIG disabled")
    elif mode == "--release":
        release(state_dir, args.gpu, args.pid if args.pid is not None else os.getppid())
    elif mode == "--hold":
        hold(state_dir, args.gpu, args.mib, args.force, args.ignore_sigterm)
    elif mode == "--zombie":
        zombie(state_dir, args.gpu, args.mib, args.force)
    elif args.stuck and args.pid is None:
        stuck(state_dir, args.gpu, args.mib, args.force)
    else:
        flags = [state.FLAG_STUCK] if args.stuck else []
        claim(state_dir, args.gpu, args.mib, args.pid if args.pid is not None else os.getppid(), args.force, flags)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_combination(parser, args)
    try:
        run(args)
    except (ClaimError, state.StateError) as exc:
        print(f"simgpu-claim: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
