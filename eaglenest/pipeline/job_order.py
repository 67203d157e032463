"""The order Snakemake will run planned jobs in, and what each GPU stage waits for.

Jobs are anything with `rule`, `inputs`, `outputs` and `gpu` (eaglenest.pipeline.job_events.JobRecord
and the plan's jobs): a job needs the jobs that make its inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

Jobs = Sequence[Any]  # JobRecord-like: rule, inputs, outputs, gpu


def dependencies(jobs: Jobs) -> dict[int, set[int]]:
    """For each job (by index), the indices of the planned jobs it needs."""
    producer = {}
    for i, j in enumerate(jobs):
        for f in j.outputs:
            producer[f] = i
    return {
        i: {producer[f] for f in j.inputs if f in producer and producer[f] != i} for i, j in enumerate(jobs)
    }


def topological_order(jobs: Jobs) -> list[int]:
    """Indices of `jobs` so that every job comes after what it needs (ties: printed order)."""
    deps = dependencies(jobs)
    users: dict[int, list[int]] = {i: [] for i in deps}
    for i, ds in deps.items():
        for d in ds:
            users[d].append(i)
    waiting = {i: len(ds) for i, ds in deps.items()}
    ready = [i for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(jobs):  # a cycle cannot come out of Snakemake; keep what we have
        order += [i for i in range(len(jobs)) if i not in set(order)]
    return order


def _ancestors(i: int, deps: dict[int, set[int]]) -> set[int]:
    seen: set[int] = set()
    stack = list(deps[i])
    while stack:
        d = stack.pop()
        if d not in seen:
            seen.add(d)
            stack.extend(deps[d])
    return seen


def gpu_stages(jobs: Jobs) -> list[dict]:
    """GPU jobs in run order, grouped by rule, each with the CPU jobs it waits for after the
    previous GPU stage (CPU work between two GPU stages: the GPU idles while it runs)."""
    deps = dependencies(jobs)
    order = topological_order(jobs)
    stages: list[dict] = []
    for i in order:
        if not jobs[i].gpu:
            continue
        if stages and stages[-1]["rule"] == jobs[i].rule:
            stages[-1]["jobs"].append(i)
        else:
            stages.append({"rule": jobs[i].rule, "jobs": [i]})
    anc = {i: _ancestors(i, deps) for i in range(len(jobs))}
    prev: list[int] = []
    for st in stages:
        needed = set().union(*(anc[i] for i in st["jobs"]))
        between = [i for i in needed if not jobs[i].gpu and any(p in anc[i] for p in prev)]
        st["waits_on_cpu"] = sorted(
            {jobs[i].rule for i in between},
            key=lambda r: min(order.index(i) for i in between if jobs[i].rule == r),
        )
        prev = st["jobs"]
    return [
        {"rule": st["rule"], "jobs": len(st["jobs"]), "waits_on_cpu": st["waits_on_cpu"]} for st in stages
    ]


__all__ = ["dependencies", "gpu_stages", "topological_order"]
