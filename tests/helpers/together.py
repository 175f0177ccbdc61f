"""Jobs that share one KV pool, run at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_together(job: Callable[[int], None], items: Iterable[int], pool: Any) -> None:
    """Run ``job(i)`` for every ``i`` of ``items``, each in its own thread, all at once;
    then close ``pool`` (a ``KVPool``). A job's exception is raised here."""
    items = list(items)
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(items))) as threads:
            list(threads.map(job, items))
    finally:
        pool.close()
