# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The deploy record of an SGLang unit, and the verdicts the fleet playbooks take from a host's state.

Private to the llmops.inference collection; not a public API. Standard library only.

Layout: ``<root>/<unit name>.json`` (root mode 0700, file 0600), what the last successful deploy step
left on the host: ``fingerprint`` (the deploy's inputs), ``unit_sha256``, ``env_sha256``, ``patch_state``,
``sglang_version``, ``known_good_saved_at`` and ``backups_digest`` (source_backup's digest of the sglang_patch
backups: any apply, restore or interrupted run since changes it).

A host's state (``read_state``) is that record with the live checksums of the unit and environment files,
both known-good manifests (known_good owns them) and the backups' digest now. From it:

- ``verdicts``: the sources are as deployed (no backup made or undone since the record, which names the
  snapshot the run returns to and its patch state), and the host is up to date (serving, and inputs, files,
  snapshot and sources all as the record says: a deploy leaves it alone);
- ``way_back``: where a host goes when a run must return it: which snapshot's unit files, where its sources
  go, and whether the gated chain restarts it or, with no known-good state to return to, it is stopped.
"""

from __future__ import annotations

import json
import os

from ansible_collections.llmops.inference.plugins.module_utils.atomic_file import atomic_write, read_bytes, sha256_file
from ansible_collections.llmops.inference.plugins.module_utils.known_good import (
    SNAPSHOTS,
    KnownGoodStore,
    SnapshotError,
)
from ansible_collections.llmops.inference.plugins.module_utils.source_backup import BackupError, BackupStore

DEFAULT_ROOT = "/var/lib/llmops/deploy"
RECORD_KEYS = (
    "fingerprint",
    "unit_sha256",
    "env_sha256",
    "patch_state",
    "sglang_version",
    "known_good_saved_at",
    "backups_digest",
)
UNKNOWN_STATE = "unknown"
# Where a run returns a host: for a deploy (if it fails), for rollback.yml, after a deploy failed, and for a
# host of a failed batch that had succeeded.
WAYS_BACK = ("deploy", "rollback", "deploy_failed", "batch_revert")
RESTART, RESTART_IF_CHANGED, STOP = "restart", "restart_if_changed", "stop"


class RecordError(Exception):
    """A request the host's state cannot answer; the message says what is missing."""


# Every error a request can end with; each message names what is at fault.
REQUEST_ERRORS = (RecordError, SnapshotError, BackupError, ValueError, OSError)


class DeployRecordStore:
    """The record of unit ``name`` under ``root``."""

    def __init__(self, root: str, name: str):
        if not name or "/" in name or name.startswith("."):
            raise RecordError(f"name {name!r} is not a unit name: give the service name, like sglang")
        self.root = root
        self.path = os.path.join(root, f"{name}.json")

    def read(self) -> dict | None:
        data = read_bytes(self.path)
        if data is None:
            return None
        try:
            record = json.loads(data)
        except ValueError:
            return None  # an unreadable record is no record: the host gets the full deploy step
        return record if isinstance(record, dict) else None

    def write(self, record: dict, check_mode: bool = False) -> bool:
        """Replace the record; True when its content changed."""
        record = {key: record.get(key) for key in RECORD_KEYS}
        if self.read() == record:
            return False
        if not check_mode:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            atomic_write(self.path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), mode=0o600)
        return True


def snapshot_summary(manifest: dict | None) -> dict | None:
    """What the playbooks use of a known-good manifest: when, which patch state, whether it holds its sources,
    and whether the files those sources changed still have the content it recorded (``sources_in_place``; None
    when it recorded none). Checking only those few files is cheap and catches sources reinstalled from the wheel
    behind the collection's back; a full comparison is source_patch's."""
    if manifest is None:
        return None
    sources = manifest.get("sources") or {}
    in_place = None
    if sources:
        in_place = all(
            sha256_file(os.path.join(sources["base_dir"], rel)) == entry["sha256"]
            for rel, entry in sources["files"].items()
        )
    return {
        "saved_at": manifest.get("saved_at"),
        "verified_at": manifest.get("verified_at"),
        "patch_state_id": manifest.get("patch_state_id"),
        "sources_recorded": bool(sources),
        "sources_digest": sources.get("digest"),
        "sources_in_place": in_place,
        "files": {key: entry.get("sha256") for key, entry in (manifest.get("files") or {}).items()},
    }


def read_state(record: DeployRecordStore, unit_path: str, env_path: str, known_good: KnownGoodStore, backups) -> dict:
    """The host's state in one read: file checksums, snapshots, the record and the digest of ``backups`` (the
    sglang_patch BackupStore)."""
    return {
        "unit_sha256": sha256_file(unit_path),
        "env_sha256": sha256_file(env_path),
        "known_good": {which: snapshot_summary(manifest) for which, manifest in known_good.info().items()},
        "record": record.read(),
        "backups_digest": backups.digest(),
    }


def verdicts(state: dict, snapshot: str, fingerprint: str | None, serving: bool) -> dict:
    """Whether the sources are as the last deploy left them (no backup made or undone since, at ``snapshot``'s
    patch state, the files it changed in place), and whether the host is up to date: serving, with inputs
    (``fingerprint``), files, snapshot and sources as recorded."""
    record = state["record"] or {}
    target = state["known_good"].get(snapshot) or {}
    sources_as_deployed = bool(record) and (
        record.get("backups_digest") == state["backups_digest"]
        and record.get("known_good_saved_at") == target.get("saved_at")
        and record.get("patch_state") == target.get("patch_state_id")
        and target.get("sources_in_place") is not False
    )
    up_to_date = (
        bool(serving)
        and sources_as_deployed
        and record.get("unit_sha256") == state["unit_sha256"]
        and record.get("env_sha256") == state["env_sha256"]
        and bool(fingerprint)
        and record.get("fingerprint") == fingerprint
    )
    return {"sources_as_deployed": sources_as_deployed, "up_to_date": up_to_date}


def _returns_sources(summary: dict | None) -> bool:
    """Whether a snapshot can take the sources somewhere: it holds them, or names a patch state."""
    if not summary:
        return False
    return summary["sources_recorded"] or summary.get("patch_state_id") not in (None, "", UNKNOWN_STATE)


def _sources_label(snapshot: str, summary: dict | None) -> str:
    if summary and summary["sources_recorded"]:
        return f"the sources recorded by the {snapshot} known-good snapshot"
    return f"patch state {summary['patch_state_id']} of the {snapshot} known-good snapshot"


def way_back(
    kind: str,
    known_good: dict,
    snapshot: str = "current",
    backup_id: str = "",
    before: dict | None = None,
) -> dict:
    """Where a run returns a host, as {needed, snapshot, sources_target, sources_label, action}.

    ``snapshot``: the snapshot a rollback targets (or, for ``deploy``, the one a failed deploy returns to);
    ``known_good``: the snapshots now; ``before``: the host's state before the run, as the preflight recorded it
    (``known_good``, ``patch_state``, ``sources_cannot_return``). ``sources_target`` holds source_patch's
    restore options ({} leaves the sources); ``snapshot`` '' puts back no unit files.
    """
    if kind not in WAYS_BACK:
        raise RecordError(f"way_back {kind!r} is not one of {', '.join(WAYS_BACK)}")
    if kind in ("deploy", "rollback"):
        return _run_target(kind, known_good, snapshot, backup_id)
    before = before or {}
    had = (before.get("known_good") or {}).get("current")
    now = known_good.get("current")
    # This run saved a new snapshot (its gate passed) when current is not the one the run started with.
    saved_now = bool(had) and bool(now) and now.get("saved_at") != had.get("saved_at")
    if kind == "batch_revert":
        needed, target = saved_now or (not had and bool(now)), "previous" if had else ""
    else:
        needed, target = True, ("previous" if saved_now else "current") if had else ""
    kept = known_good.get(target) if target else None
    if kind == "deploy_failed" and before.get("sources_cannot_return"):
        sources, label = {}, "the sources stay as they are"
    elif target and _returns_sources(kept):
        sources, label = {"known_good_snapshot": target}, _sources_label(target, kept)
    else:
        state = before.get("patch_state") or UNKNOWN_STATE
        sources = {"target_state_id": state} if state not in (UNKNOWN_STATE, "modified", "interrupted") else {}
        label = f"patch state {state}, as before the run" if sources else "the sources stay as they are"
    return {
        "needed": needed,
        "snapshot": target,
        "sources_target": sources,
        "sources_label": label,
        "action": RESTART if had else STOP,
    }


def _run_target(kind: str, known_good: dict, snapshot: str, backup_id: str) -> dict:
    summary = known_good.get(snapshot)
    if backup_id:
        sources, label, target = {"backup_id": backup_id}, f"the state before backup {backup_id}", ""
    elif _returns_sources(summary):
        sources, label, target = {"known_good_snapshot": snapshot}, _sources_label(snapshot, summary), snapshot
    elif kind == "deploy":
        sources, label = {"backup_id": "latest"}, "the state before the latest backup (no known-good state is recorded)"
        target = snapshot if summary else ""
    else:
        sources, label, target = {}, "the sources stay as they are (the snapshot records no patch state)", snapshot
    return {
        "needed": True,
        "snapshot": target,
        "sources_target": sources,
        "sources_label": label,
        "action": RESTART_IF_CHANGED if kind == "rollback" else RESTART,
    }


def require_snapshot(known_good: KnownGoodStore, which: str, host_label: str = "the host") -> None:
    """Fail naming what exists when snapshot ``which`` is absent, or what is damaged when it cannot be restored."""
    if which not in SNAPSHOTS:
        raise RecordError(f"snapshot {which!r} is not one of {', '.join(SNAPSHOTS)}")
    if known_good.read(which) is None:
        have = [name for name in SNAPSHOTS if known_good.read(name) is not None]
        raise RecordError(
            f"{host_label} has no {which} known-good snapshot under {known_good.root} (it has: "
            f"{', '.join(have) or 'none'}); a snapshot is saved each time the restart chain's gate passes"
        )
    problems = known_good.problems(which)
    if problems:
        raise RecordError(
            f"the {which} known-good snapshot under {known_good.root} cannot be restored: {'; '.join(problems)}"
        )


def after_deploy(state: dict, fingerprint: str, patch_state: str, sglang_version: str) -> dict:
    """The record a successful deploy step leaves, from the host's state just after it."""
    current = state["known_good"].get("current") or {}
    return {
        "fingerprint": fingerprint,
        "unit_sha256": state["unit_sha256"],
        "env_sha256": state["env_sha256"],
        "patch_state": patch_state,
        "sglang_version": sglang_version,
        "known_good_saved_at": current.get("saved_at"),
        "backups_digest": state["backups_digest"],
    }


def handle(params: dict, check_mode: bool) -> dict:
    """One deploy_record request, from the module's parameters to its result (with ``diff`` when writing)."""
    store = DeployRecordStore(params["root"], params["name"])
    known_good = KnownGoodStore(params["known_good_root"])
    state = read_state(store, params["unit_path"], params["env_path"], known_good, BackupStore(params["backup_root"]))
    if params["state"] == "written":
        record = after_deploy(state, params["fingerprint"], params["patch_state"], params["sglang_version"])
        before = state["record"]
        changed = store.write(record, check_mode)
        return dict(
            state,
            record=record,
            changed=changed,
            diff={"before": before or {}, "after": record},
            msg=f"{'recorded' if changed else 'already recorded'} the deploy in {store.path}",
        )
    if params["require_snapshot"]:
        require_snapshot(known_good, params["snapshot"])
    result = dict(state, changed=False, msg=f"read the state of {params['name']}")
    result.update(verdicts(state, params["snapshot"], params["fingerprint"], params["serving"]))
    if params["way_back"]:
        result["way_back"] = way_back(
            params["way_back"], state["known_good"], params["snapshot"], params["backup_id"], params["before"]
        )
    return result
