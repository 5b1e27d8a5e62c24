"""Claim, release or hold simulated GPU memory in the simgpu state directory.

simgpu-claim --gpu N --mib M [--pid PID] [--force]   claim M MiB on GPU N for PID (default: the caller)
simgpu-claim --gpu N --release [--pid PID]            drop PID's claim on GPU N
simgpu-claim --hold --gpu N --mib M [--ignore-sigterm] claim for this process and sleep until signalled
simgpu-claim --gc                                      delete claim files of processes that are gone

State: $SIMGPU_STATE_DIR (default /var/lib/simgpu); see README.md next to this script.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import signal
import sys
import tempfile

DEFAULT_STATE_DIR = "/var/lib/simgpu"
DRIVER_RESERVED_MIB = 1
CLAIM_NAME = re.compile(r"gpu(\d+)\.pid(\d+)\Z")


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


def read_gpus(state_dir):
    """Return {index: total_mib} from the GPU list."""
    path = os.path.join(state_dir, "gpus")
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise ClaimError(
            f"cannot read the GPU list {path} (set SIMGPU_STATE_DIR or --state-dir): {exc.strerror}"
        ) from None
    gpus = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.rstrip().split("\t")
        if len(fields) != 4 or not fields[0].isdigit() or not fields[2].isdigit():
            raise ClaimError(f"{path} line {number}: expected 'index<TAB>uuid<TAB>total_mib<TAB>name'")
        gpus[int(fields[0])] = int(fields[2])
    return gpus


def pid_alive(pid):
    """True while /proc/PID exists and is neither a zombie nor dead."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return False
    # comm, in parentheses, may itself hold spaces and ')': the state follows the last ')'.
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] not in ("Z", "X", "x")


def claim_path(claims_dir, gpu, pid):
    return os.path.join(claims_dir, f"gpu{gpu}.pid{pid}")


def claims(claims_dir):
    """Yield (file name, gpu, pid, mib or None) for every claim file."""
    try:
        names = os.listdir(claims_dir)
    except FileNotFoundError:
        return
    for name in sorted(names):
        match = CLAIM_NAME.match(name)
        if not match:
            continue
        try:
            with open(os.path.join(claims_dir, name), encoding="utf-8") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        mib = int(text) if text.isdigit() else None
        yield name, int(match.group(1)), int(match.group(2)), mib


def used_mib(claims_dir, gpu, except_pid):
    """Memory in use on a GPU by live processes other than except_pid, plus the driver reservation."""
    live = (
        mib
        for _name, claim_gpu, pid, mib in claims(claims_dir)
        if claim_gpu == gpu and pid != except_pid and mib is not None and pid_alive(pid)
    )
    return DRIVER_RESERVED_MIB + sum(live)


@contextlib.contextmanager
def claims_lock(claims_dir):
    """Serialise check-then-write so two claimers cannot both take the last free MiB."""
    try:
        os.makedirs(claims_dir, exist_ok=True)
        fd = os.open(os.path.join(claims_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ClaimError(f"cannot use the claims directory {claims_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_atomically(path, text):
    directory = os.path.dirname(path)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def check_gpu(gpus, gpu, state_dir):
    if gpu not in gpus:
        known = ", ".join(str(index) for index in sorted(gpus)) or "none"
        raise ClaimError(f"--gpu {gpu}: no such GPU in {state_dir}/gpus (GPUs: {known})")


def claim(state_dir, gpu, mib, pid, force):
    gpus = read_gpus(state_dir)
    check_gpu(gpus, gpu, state_dir)
    if not pid_alive(pid):
        raise ClaimError(f"--pid {pid}: no such running process")
    claims_dir = os.path.join(state_dir, "claims")
    with claims_lock(claims_dir):
        free = gpus[gpu] - used_mib(claims_dir, gpu, except_pid=pid)
        if mib > free and not force:
            raise ClaimError(
                f"out of memory: --mib {mib} is more than the {max(free, 0)} MiB free on GPU {gpu} "
                f"(total {gpus[gpu]} MiB); --force claims it anyway"
            )
        write_atomically(claim_path(claims_dir, gpu, pid), f"{mib}\n")


def release(state_dir, gpu, pid):
    check_gpu(read_gpus(state_dir), gpu, state_dir)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(claim_path(os.path.join(state_dir, "claims"), gpu, pid))


def collect_garbage(state_dir):
    """Delete claim files whose process is gone; return their names."""
    claims_dir = os.path.join(state_dir, "claims")
    removed = []
    with claims_lock(claims_dir):
        for name, _gpu, pid, _mib in list(claims(claims_dir)):
            if not pid_alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(claims_dir, name))
                removed.append(name)
    return removed


def hold(state_dir, gpu, mib, force, ignore_sigterm):
    """Hold a claim as this process, like a GPU job, until SIGTERM/SIGINT (or SIGKILL)."""
    pid = os.getpid()
    claim(state_dir, gpu, mib, pid, force)

    def stop(_signum, _frame):
        release(state_dir, gpu, pid)
        sys.exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else stop)
    signal.signal(signal.SIGINT, stop)
    print(f"holding {mib} MiB on GPU {gpu} as PID {pid}", flush=True)
    while True:
        signal.pause()


def build_parser():
    parser = argparse.ArgumentParser(
        prog="simgpu-claim",
        description="Claim, release or hold simulated GPU memory (simgpu).",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--release", action="store_true", help="drop the claim of --pid on --gpu")
    mode.add_argument("--hold", action="store_true", help="claim for this process and sleep until signalled")
    mode.add_argument("--gc", action="store_true", help="delete claim files of processes that are gone")
    parser.add_argument("--gpu", type=non_negative_int, help="GPU index")
    parser.add_argument("--mib", type=non_negative_int, help="MiB to claim")
    parser.add_argument("--pid", type=positive_int, help="process that holds the claim (default: the caller)")
    parser.add_argument("--force", action="store_true", help="claim even beyond the free memory")
    parser.add_argument("--ignore-sigterm", action="store_true", help="with --hold: survive SIGTERM")
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("SIMGPU_STATE_DIR") or DEFAULT_STATE_DIR,
        help=f"state directory (default: $SIMGPU_STATE_DIR or {DEFAULT_STATE_DIR})",
    )
    return parser


def check_combination(parser, args):
    mode = "--release" if args.release else "--hold" if args.hold else "--gc" if args.gc else None
    needs_gpu = mode != "--gc"
    needs_mib = mode in (None, "--hold")
    if needs_gpu and args.gpu is None:
        parser.error(f"{mode or 'claiming'} needs --gpu")
    if needs_mib and args.mib is None:
        parser.error(f"{mode or 'claiming'} needs --mib")
    if not needs_gpu and args.gpu is not None:
        parser.error("--gc takes no --gpu")
    if not needs_mib and args.mib is not None:
        parser.error(f"{mode} takes no --mib")
    if args.pid is not None and mode in ("--hold", "--gc"):
        parser.error(f"{mode} takes no --pid")
    if args.force and mode in ("--release", "--gc"):
        parser.error(f"{mode} takes no --force")
    if args.ignore_sigterm and mode != "--hold":
        parser.error("--ignore-sigterm only applies to --hold")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_combination(parser, args)
    pid = args.pid if args.pid is not None else os.getppid()
    try:
        if args.gc:
            for name in collect_garbage(args.state_dir):
                print(f"removed {name}")
        elif args.release:
            release(args.state_dir, args.gpu, pid)
        elif args.hold:
            hold(args.state_dir, args.gpu, args.mib, args.force, args.ignore_sigterm)
        else:
            claim(args.state_dir, args.gpu, args.mib, pid, args.force)
    except ClaimError as exc:
        print(f"simgpu-claim: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
