# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sweep run's wall times and how much of them the engine itself used, from the records' own timestamps.

Private to the llmops.inference collection; not a public API. Pure functions, standard library only.
"""

from __future__ import annotations

from ansible_collections.llmops.inference.plugins.module_utils.engine_times import same_engine
from ansible_collections.llmops.inference.plugins.module_utils.sweep_records import MEASURED


def _loads(records: list) -> dict:
    """The distinct loads among ``records``: {(host, point id, run id, load start): [records]}."""
    loads = {}
    for record in records:
        load = record.get("load") or {}
        key = (record.get("host"), record["point"]["id"], record.get("run_id"), load.get("started_at"))
        loads.setdefault(key, []).append(record)
    return loads


def _fork_to_ready(load_records: list) -> float | None:
    for record in sorted(load_records, key=lambda item: item.get("started_at") or 0):
        engine = (record.get("bench") or {}).get("engine") or {}
        if engine.get("fork_to_ready_s") is not None:
            return engine["fork_to_ready_s"]
    return None


def _engines(records: list) -> list:
    """The distinct engine processes that served measured levels: [(host, engine reading)]."""
    engines = []
    for record in records:
        engine = (record.get("bench") or {}).get("engine") or {}
        if record["status"] != MEASURED or not engine.get("main_pid"):
            continue
        host = record.get("host")
        if not any(seen_host == host and same_engine(seen, engine) for seen_host, seen in engines):
            engines.append((host, engine))
    return engines


def _wall(records: list) -> float | None:
    starts = [(record.get("load") or {}).get("started_at") or record.get("started_at") for record in records]
    starts = [start for start in starts if start is not None]
    ends = [record["finished_at"] for record in records if record.get("finished_at") is not None]
    return max(ends) - min(starts) if starts and ends else None


def _engine_time(records: list) -> dict:
    """The engine's own time in ``records``: each load's fork-to-ready (the chain's time for a load that never
    got ready) plus every level's benchmark time."""
    loads = _loads(records)
    load_sum = 0.0
    unknown = 0
    for load_records in loads.values():
        fork_to_ready = _fork_to_ready(load_records)
        if fork_to_ready is None:
            unknown += 1
            fork_to_ready = (load_records[0].get("load") or {}).get("load_s") or 0.0
        load_sum += fork_to_ready
    bench_sum = sum((record.get("bench") or {}).get("elapsed_s") or 0.0 for record in records)
    return {"loads": len(loads), "loads_without_engine_time": unknown, "load_sum_s": load_sum, "bench_sum_s": bench_sum}


def timing(records: list, run: dict, reported_at: float) -> dict:
    """This run's wall times and ratios, from the records' own timestamps.

    ``sweep_wall_s`` runs from the first of this run's loads starting to the last level's record, over all
    hosts; ``run_wall_s`` also covers planning and the restore of the original configuration.
    ``overhead_ratio`` = sweep wall / (every load's restart-chain time + every level's benchmark time);
    ``engine_ratio`` = sweep wall / (every load's fork-to-ready from the engine's log + every level's benchmark
    time), the engine's own time with nothing of the collection in it (per host in ``per_host``).
    ``loads_per_point`` is the engine processes that served measured levels per point measured: 1.0 when
    adding load levels costs no extra engine loads.
    """
    mine = [record for record in records if record.get("run_id") == run.get("run_id")]
    result = {
        "run_id": run.get("run_id"),
        "hosts": run.get("hosts"),
        "points_run": len({record["point"]["id"] for record in mine}),
        "levels_run": len(mine),
        "run_started_at": run.get("started_at"),
        "reported_at": reported_at,
        "run_wall_s": reported_at - run["started_at"] if run.get("started_at") else None,
        "sweep_wall_s": None,
        "load_bench_sum_s": None,
        "apply_sum_s": None,
        "overhead_ratio": None,
        "engine_time_s": None,
        "engine_ratio": None,
        "engine_loads": 0,
        "loads_per_point": None,
        "per_host": {},
    }
    if not mine:
        return result
    loads = _loads(mine)
    chain_sum = sum((load_records[0].get("load") or {}).get("load_s") or 0.0 for load_records in loads.values())
    engine = _engine_time(mine)
    busy = chain_sum + engine["bench_sum_s"]
    engine_time = engine["load_sum_s"] + engine["bench_sum_s"]
    wall = _wall(mine)
    measured_points = {record["point"]["id"] for record in mine if record["status"] == MEASURED}
    engines = _engines(mine)
    result.update(
        sweep_wall_s=wall,
        load_bench_sum_s=busy,
        apply_sum_s=sum((load_records[0].get("load") or {}).get("apply_s") or 0.0 for load_records in loads.values()),
        overhead_ratio=wall / busy if wall and busy > 0 else None,
        loads=engine["loads"],
        engine_load_sum_s=engine["load_sum_s"],
        bench_sum_s=engine["bench_sum_s"],
        loads_without_engine_time=engine["loads_without_engine_time"],
        engine_time_s=engine_time,
        engine_ratio=wall / engine_time if wall and engine_time > 0 else None,
        engine_loads=len(engines),
        loads_per_point=len(engines) / len(measured_points) if measured_points else None,
    )
    for host in sorted({record.get("host") for record in mine}):
        on_host = [record for record in mine if record.get("host") == host]
        host_engine = _engine_time(on_host)
        host_time = host_engine["load_sum_s"] + host_engine["bench_sum_s"]
        host_wall = _wall(on_host)
        result["per_host"][host] = {
            "wall_s": host_wall,
            "engine_time_s": host_time,
            "engine_ratio": host_wall / host_time if host_wall and host_time > 0 else None,
            "loads": host_engine["loads"],
            "levels": len(on_host),
        }
    return result
