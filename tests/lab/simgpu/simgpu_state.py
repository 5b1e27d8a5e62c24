"""The simgpu state directory: the one Python reading of the contract the C library (state.c) also implements.

Used by simgpu-claim and by the simulated engine (sglang_sim.gpu_claims). README.md next to this file
states the contract; tests/lab/tests/test_simgpu.py checks that this module, libnvidia-ml.so.1 and the
nvidia-smi stand-in agree on it. Standard library only (Python 3.9+).

A claim file ``claims/gpu<I>[.mig<K>].pid<P>`` holds ``MIB[ FLAG...]``. Whether it counts:

- while its holder is alive (``/proc/P`` exists, state not Z/X) it counts and P is listed as a process;
- flag ``zombie``: also while the holder is a zombie (its PID is listed then too);
- once the holder is gone, the first observer writes ``<claim>.exit`` with the time; the memory stays
  used, with no process listed, for the release lag after that time, then it is free;
- flag ``stuck``: once the holder is gone the memory stays used, with no process listed, until a GPU
  reset removes the claim.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import tempfile
import time
import uuid as uuid_mod
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/simgpu"
# What an idle device's NVML v2 ``used`` reads (nvidia-smi's "1MiB / 81559MiB").
IDLE_USED_MIB = 1
# The driver's reservation on each GPU (NVML v2 ``reserved``, part of v1 ``used``) without a reserved_mib file: what
# an idle H100 80GB HBM3 shows (README.md cites it).
DEFAULT_RESERVED_MIB = 454
RESERVED_FILE = "reserved_mib"
DEFAULT_RELEASE_LAG_MS = 400
LAG_ENV = "SIMGPU_RELEASE_LAG_MS"
LAG_FILE = "release_lag_ms"
# A container host (own PID namespace): the library lists each holder as its PID plus this file's number, a PID of
# the host's namespace that this one's /proc lacks (state.c `sim_host_pid_offset`).
HOST_PID_OFFSET_FILE = "host_pid_offset"
CONTAINER_HOST_PID_OFFSET = 1000000
FLAG_ZOMBIE = "zombie"
FLAG_STUCK = "stuck"
FLAGS = (FLAG_ZOMBIE, FLAG_STUCK)
EXIT_SUFFIX = ".exit"
MAX_MIG_DEVICES = 7
CLAIM_NAME = re.compile(r"gpu(\d+)(?:\.mig(\d+))?\.pid(\d+)\Z")

# H100 80GB MIG profiles the lab offers: (compute slices, memory slices, MiB, GPU instance IDs in placement order).
MIG_PROFILES = {
    "1g.10gb": (1, 1, 9984, (7, 8, 9, 10, 11, 12, 13)),
    "2g.20gb": (2, 2, 20096, (3, 4, 5)),
    "3g.40gb": (3, 4, 40320, (1, 2)),
    "4g.40gb": (4, 4, 40320, (5,)),
    "7g.80gb": (7, 8, 80384, (0,)),
}
MIG_EVEN_SPLITS = {1: "7g.80gb", 2: "3g.40gb", 3: "2g.20gb", 7: "1g.10gb"}
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


class StateError(Exception):
    """The state directory is missing, malformed, or refuses a change; the message names what."""


@dataclass(frozen=True)
class MigDevice:
    parent: int
    index: int
    uuid: str
    total_mib: int
    profile: str
    gpu_instance: int
    compute_instance: int
    parent_name: str = ""

    @property
    def name(self) -> str:
        return f"{self.parent_name} MIG {self.profile}"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    total_mib: int
    name: str
    mig: tuple = field(default_factory=tuple)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)

    def mig_device(self, index: int) -> MigDevice | None:
        return next((m for m in self.mig if m.index == index), None)


@dataclass(frozen=True)
class Claim:
    name: str
    gpu: int
    mig: int | None
    pid: int
    mib: int
    flags: frozenset

    def on(self, gpu: int, mig: int | None) -> bool:
        return self.gpu == gpu and self.mig == mig


def state_dir(explicit: str | os.PathLike | None = None) -> Path:
    return Path(explicit or os.environ.get("SIMGPU_STATE_DIR") or DEFAULT_STATE_DIR)


# -- the device list -----------------------------------------------------------------------------------------
def _fields(path: Path, number: int, line: str, count: int, shape: str) -> list[str]:
    fields = line.split("\t")
    if len(fields) != count:
        raise StateError(f"{path} line {number}: expected {shape}, got {line!r}")
    return fields


def _number(path: Path, number: int, text: str, what: str, positive: bool = False) -> int:
    if not text.isdigit() or (positive and int(text) == 0):
        raise StateError(f"{path} line {number}: {what} must be a {'positive ' if positive else ''}whole number")
    return int(text)


def _lines(path: Path):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.rstrip("\r\n ")
        if line.strip() and not line.lstrip().startswith("#"):
            yield number, line


def read_gpus(directory: Path | None = None) -> list[Gpu]:
    """The GPU list (`gpus`) with each GPU's MIG devices (`mig`), sorted by index."""
    directory = state_dir(directory)
    path = directory / "gpus"
    try:
        lines = list(_lines(path))
    except OSError as exc:
        raise StateError(f"cannot read the GPU list {path}: {exc.strerror}") from None
    gpus: dict[int, tuple] = {}
    for number, line in lines:
        index, gpu_uuid, total, name = _fields(path, number, line, 4, "index<TAB>uuid<TAB>total_mib<TAB>name")
        index_value = _number(path, number, index, "index")
        if index_value in gpus:
            raise StateError(f"{path} line {number}: duplicate index {index_value}")
        gpus[index_value] = (gpu_uuid, _number(path, number, total, "total_mib", positive=True), name)
    if sorted(gpus) != list(range(len(gpus))):
        raise StateError(f"{path}: indices must be 0 to count-1 without gaps")
    migs: dict[int, list] = {index: [] for index in gpus}
    mig_path = directory / "mig"
    if mig_path.exists():
        for number, line in _lines(mig_path):
            shape = "gpu<TAB>mig_index<TAB>uuid<TAB>total_mib<TAB>profile<TAB>gpu_instance<TAB>compute_instance"
            parent, index, mig_uuid, total, profile, gi, ci = _fields(mig_path, number, line, 7, shape)
            parent_value = _number(mig_path, number, parent, "gpu")
            if parent_value not in gpus:
                raise StateError(f"{mig_path} line {number}: no GPU {parent_value} in {path}")
            index_value = _number(mig_path, number, index, "mig_index")
            if index_value >= MAX_MIG_DEVICES or any(m.index == index_value for m in migs[parent_value]):
                raise StateError(f"{mig_path} line {number}: mig_index must be unique per GPU and below 7")
            migs[parent_value].append(
                MigDevice(
                    parent_value,
                    index_value,
                    mig_uuid,
                    _number(mig_path, number, total, "total_mib", positive=True),
                    profile,
                    _number(mig_path, number, gi, "gpu_instance"),
                    _number(mig_path, number, ci, "compute_instance"),
                    gpus[parent_value][2],
                )
            )
    return [Gpu(index, *gpus[index], tuple(sorted(migs[index], key=lambda m: m.index))) for index in sorted(gpus)]


# -- processes -----------------------------------------------------------------------------------------------
def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, Z, ...), or None when the PID does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # comm may hold spaces and ')': the state follows the last ')'.
    rest = data[data.rindex(b")") + 2 :] if b")" in data else b""
    return rest[:1].decode() or None


def pid_alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z", "X", "x")


# -- claims --------------------------------------------------------------------------------------------------
def claims_dir(directory: Path | None = None) -> Path:
    return state_dir(directory) / "claims"


def claim_name(gpu: int, mig: int | None, pid: int) -> str:
    return f"gpu{gpu}.pid{pid}" if mig is None else f"gpu{gpu}.mig{mig}.pid{pid}"


def _parse_content(text: str) -> tuple[int, frozenset] | None:
    words = text.split()
    if not words or not words[0].isdigit() or any(word not in FLAGS for word in words[1:]):
        return None
    return int(words[0]), frozenset(words[1:])


def read_claims(directory: Path | None = None) -> list[Claim]:
    """Every well-formed claim file (temporary files, markers and non-numeric contents are ignored)."""
    folder = claims_dir(directory)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names:
        match = CLAIM_NAME.match(name)
        if not match:
            continue
        try:
            parsed = _parse_content((folder / name).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if parsed is None:
            continue
        mig = None if match.group(2) is None else int(match.group(2))
        found.append(Claim(name, int(match.group(1)), mig, int(match.group(3)), parsed[0], parsed[1]))
    return found


def release_lag_s(directory: Path | None = None) -> float:
    """$SIMGPU_RELEASE_LAG_MS, else the state directory's release_lag_ms, else 400 ms; bad values use the default."""
    raw = os.environ.get(LAG_ENV)
    if raw is None:
        try:
            raw = (state_dir(directory) / LAG_FILE).read_text().strip()
        except OSError:
            raw = None
    if raw is not None and raw.strip().isdigit():
        return int(raw.strip()) / 1000.0
    return DEFAULT_RELEASE_LAG_MS / 1000.0


def _read_exit_time(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def mark_exit(directory: Path | None, claim_file: str, when: float | None = None) -> float | None:
    """Record when the holder went away (first writer wins); returns the recorded time, None if unwritable."""
    path = claims_dir(directory) / (claim_file + EXIT_SUFFIX)
    stamp = time.time() if when is None else when
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return _read_exit_time(path)
    except OSError:
        return None
    stamp = math.floor(stamp * 1000) / 1000  # milliseconds, rounded down: never in the future
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{stamp:.3f}\n")
    return stamp


def claim_status(claim: Claim, directory: Path | None = None, now: float | None = None, lag: float | None = None):
    """(counted, listed): does the claim's memory count as used, and is its PID listed as a GPU process.

    Observing a holder gone for the first time records the time (the release lag starts then).
    """
    directory = state_dir(directory)
    exit_path = claims_dir(directory) / (claim.name + EXIT_SUFFIX)
    exited = exit_path.exists()
    if not exited:
        status = process_state(claim.pid)
        holding = status not in (None, "Z", "X", "x") or (FLAG_ZOMBIE in claim.flags and status is not None)
        if holding:
            return True, True
    if FLAG_STUCK in claim.flags:
        return True, False
    released_at = _read_exit_time(exit_path) if exited else mark_exit(directory, claim.name)
    if released_at is None:
        return False, False
    now = time.time() if now is None else now
    lag = release_lag_s(directory) if lag is None else lag
    return now < released_at + lag, False


def reserved_mib(directory: Path | None = None) -> int:
    """The driver's reservation on each GPU: the state directory's reserved_mib, else DEFAULT_RESERVED_MIB."""
    try:
        raw = (state_dir(directory) / RESERVED_FILE).read_text().strip()
    except OSError:
        raw = ""
    return int(raw) if raw.isdigit() else DEFAULT_RESERVED_MIB


def used_mib(directory: Path | None, gpu: int, mig: int | None = None, exclude_pid: int | None = None) -> int:
    """NVML v1's used memory of one device (a GPU without MIG, or one MIG device): counted claims, the 1 MiB an
    idle device shows, and on a GPU the driver's reservation (a MIG device reports none of its own)."""
    directory = state_dir(directory)
    total = IDLE_USED_MIB + (reserved_mib(directory) if mig is None else 0)
    for claim in read_claims(directory):
        if claim.on(gpu, mig) and claim.pid != exclude_pid and claim_status(claim, directory)[0]:
            total += claim.mib
    return total


def listed_pids(directory: Path | None, gpu: int, mig: int | None = None) -> dict[int, int]:
    directory = state_dir(directory)
    return {c.pid: c.mib for c in read_claims(directory) if c.on(gpu, mig) and claim_status(c, directory)[1]}


def write_atomically(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(dir=str(path.parent), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def write_claim(directory: Path | None, gpu: int, mig: int | None, pid: int, mib: int, flags=()) -> None:
    """Set PID's claim on a device atomically (a stale exit marker of an earlier holder of the PID goes)."""
    folder = claims_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    name = claim_name(gpu, mig, pid)
    with contextlib.suppress(OSError):
        os.unlink(folder / (name + EXIT_SUFFIX))
    content = " ".join([str(int(mib)), *sorted(flags)])
    write_atomically(folder / name, content + "\n")


def remove_claim(directory: Path | None, gpu: int, mig: int | None, pid: int) -> None:
    folder = claims_dir(directory)
    for leaf in (claim_name(gpu, mig, pid), claim_name(gpu, mig, pid) + EXIT_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / leaf)


def mark_pid_exit(directory: Path | None, pid: int, when: float | None = None) -> None:
    """The holder is exiting (or was seen to exit): start the release lag of all its claims now."""
    for claim in read_claims(directory):
        if claim.pid == pid:
            mark_exit(directory, claim.name, when)


@contextlib.contextmanager
def locked(directory: Path | None = None):
    """Serialise check-then-write so two claimers cannot both take the last free MiB."""
    folder = claims_dir(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise StateError(f"cannot use the claims directory {folder}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def collect_garbage(directory: Path | None = None) -> list[str]:
    """Delete claims that no longer count (and their markers); return their names."""
    directory = state_dir(directory)
    folder = claims_dir(directory)
    removed = []
    with locked(directory):
        for claim in read_claims(directory):
            if not claim_status(claim, directory)[0]:
                for leaf in (claim.name, claim.name + EXIT_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(folder / leaf)
                removed.append(claim.name)
        for name in os.listdir(folder):
            if name.endswith(EXIT_SUFFIX) and not (folder / name[: -len(EXIT_SUFFIX)]).exists():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)
    return removed


def reset_gpu(directory: Path | None, gpu: int) -> list[str]:
    """A GPU reset: refused while a process is listed on the GPU (or its MIG devices), else every claim goes."""
    directory = state_dir(directory)
    folder = claims_dir(directory)
    with locked(directory):
        mine = [c for c in read_claims(directory) if c.gpu == gpu]
        busy = sorted({c.pid for c in mine if claim_status(c, directory)[1]})
        if busy:
            raise StateError(
                f"GPU {gpu} is in use by process(es) {', '.join(map(str, busy))}; a reset needs every process "
                "on the GPU gone (a zombie or a process stuck in the driver needs a reboot)"
            )
        for claim in mine:
            for leaf in (claim.name, claim.name + EXIT_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / leaf)
    return [c.name for c in mine]


# -- MIG configuration ---------------------------------------------------------------------------------------
def mig_profiles(spec: str) -> list[str]:
    """'2' (even split: 1, 2, 3 or 7 instances) or 'PROFILE,PROFILE,...'; raises StateError naming the problem."""
    spec = spec.strip()
    if spec.isdigit():
        count = int(spec)
        if count not in MIG_EVEN_SPLITS:
            raise StateError(f"MIG split {count}: accepted counts are 1, 2, 3 and 7 (or a list of profiles)")
        return [MIG_EVEN_SPLITS[count]] * count
    profiles = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in MIG_PROFILES]
    if not profiles or unknown:
        raise StateError(
            f"MIG profiles {spec!r}: unknown {', '.join(unknown) or 'empty list'}; accepted: {', '.join(MIG_PROFILES)}"
        )
    compute = sum(MIG_PROFILES[p][0] for p in profiles)
    memory = sum(MIG_PROFILES[p][1] for p in profiles)
    if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise StateError(
            f"MIG profiles {spec!r} need {compute} compute and {memory} memory slices; an H100 has "
            f"{MIG_COMPUTE_SLICES} and {MIG_MEMORY_SLICES}"
        )
    for profile in set(profiles):
        if profiles.count(profile) > len(MIG_PROFILES[profile][3]):
            raise StateError(f"MIG profiles {spec!r}: at most {len(MIG_PROFILES[profile][3])} x {profile}")
    return profiles


def mig_lines(gpu: Gpu, profiles: list[str]) -> list[str]:
    used: dict[str, int] = {}
    lines = []
    for index, profile in enumerate(profiles):
        _compute, _memory, mib, instances = MIG_PROFILES[profile]
        gi = instances[used.get(profile, 0)]
        used[profile] = used.get(profile, 0) + 1
        mig_uuid = f"MIG-{uuid_mod.uuid5(uuid_mod.NAMESPACE_OID, f'{gpu.uuid}/{gi}/0')}"
        lines.append(f"{gpu.index}\t{index}\t{mig_uuid}\t{mib}\t{profile}\t{gi}\t0")
    return lines


def set_mig(directory: Path | None, gpu_index: int, spec: str | None) -> list[str]:
    """Enable MIG on a GPU with the given instances (None: disable); refused while the GPU has counted memory."""
    directory = state_dir(directory)
    with locked(directory):
        gpus = read_gpus(directory)
        gpu = next((g for g in gpus if g.index == gpu_index), None)
        if gpu is None:
            raise StateError(
                f"no GPU {gpu_index} in {directory / 'gpus'} (GPUs: {', '.join(str(g.index) for g in gpus)})"
            )
        profiles = mig_profiles(spec) if spec is not None else []
        holders = [c for c in read_claims(directory) if c.gpu == gpu_index and claim_status(c, directory)[0]]
        if holders:
            raise StateError(
                f"GPU {gpu_index} has memory in use ({', '.join(c.name for c in holders)}); changing MIG mode "
                "needs an idle GPU"
            )
        path = directory / "mig"
        kept = []
        if path.exists():
            kept = [line for _n, line in _lines(path) if line.split("\t", 1)[0] != str(gpu_index)]
        new = mig_lines(gpu, profiles)
        header = "# gpu\tmig_index\tuuid\ttotal_mib\tprofile\tgpu_instance\tcompute_instance"
        write_atomically(path, "\n".join([header, *kept, *new]) + "\n")
        return new


def find_device(gpus: list[Gpu], text: str) -> tuple[Gpu, MigDevice | None] | None:
    """A device named as 'N', 'N:K' (MIG device K of GPU N), or by exact GPU-/MIG- UUID."""
    for gpu in gpus:
        if text in (str(gpu.index), gpu.uuid):
            return gpu, None
        for mig in gpu.mig:
            if text in (f"{gpu.index}:{mig.index}", mig.uuid):
                return gpu, mig
    return None
