"""The server's engine threads: requests queue and run, each in a session (a
sequence) of its own, so one request's eviction never touches another's cache.

With ``parallel > 1`` up to that many requests run at once as sequences of one
shared context (engine/pool/kvpool.py): their tokens are decoded in one batch per step
and they share ``kv_cells`` KV cells, each a share by its length. A request that
is cancelled or whose client went away frees its sequence and cells at once.

With ``parallel == 1`` requests run one at a time and the last session is kept
for the next request with the same policy, budget and parameters (``run``
starts it from an empty cache), which saves allocating a context per request.

A document asked about twice is read once (runtime/prefix.py): one at a time, the
read of each prompt's text (1,024 tokens or more) is saved in RAM and restored for
the next request with the same settings and text; in parallel, a finished request's
sequence is kept idle in the pool with its text (``_Parked``) and the next such
request continues it, until the pool needs its cells (``KVPool.reclaim``). The
reuse is reported as ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import Cancelled, KvtrimError
from ..policies import Needs, needs_of
from ..pool.kvpool import KVPool
from ..runtime.engine import Engine
from ..runtime.prefix import MIN_PREFIX_TOKENS, PrefixCache
from ..runtime.spec import RequestSpec
from ..runtime.states import RamStates
from ..session.core import Session, default_threads
from ..stats import Done, Event, Result

Sink = Callable[[Event], None]


class Overloaded(KvtrimError):
    """The queue is full; the client should retry later."""


class ShuttingDown(KvtrimError):
    """The server is stopping: the job was refused or cancelled."""


class Arrival:
    """A request on its way (``EngineRunner.arriving``): ``key`` goes to ``Job.arrival``
    (None: no round waits for it); ``built()`` once its job is built or failed to be
    (once: later calls do nothing)."""

    def __init__(self, key: object | None, on_built: Callable[[], None]) -> None:
        self.key = key
        self._on_built: Callable[[], None] | None = on_built

    def built(self) -> None:
        on_built, self._on_built = self._on_built, None
        if on_built is not None:
            on_built()


@dataclass
class Job:
    """One request's work: tokens to read (``tail`` votes), then generation, with
    the settings of ``spec``."""

    head: list[int]
    tail: list[int]
    spec: RequestSpec
    sink: Sink | None = None  # each event, called on the engine thread
    label: str = ""  # shown in /metrics (the endpoint)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _session: Session | None = None
    reuse: _Parked | None = None  # the parked sequence this job continues
    arrival: object | None = None  # its KVPool.expect key (``EngineRunner.arriving``)

    def cancel(self) -> None:
        """Stop this job (the client went away); thread-safe."""
        self._cancelled.set()
        session = self._session
        if session is not None:
            session.cancel()


@dataclass
class _Parked:
    """A finished request's sequence kept in the pool with the text it read: ids
    ``first`` on are its question and answer, forgotten when it is continued."""

    session: Session
    first: int
    text_tokens: int


class EngineRunner:
    """Runs ``Job``s on ``parallel`` engine threads, at most ``max_queue`` waiting
    or running; ``kv_cells``: the pool's cells when ``parallel > 1``."""

    def __init__(
        self,
        engine: Engine,
        max_queue: int = 16,
        *,
        parallel: int = 1,
        kv_cells: int = 2624,
        share: str = "length",
        layout: str = "shared",
    ) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.parallel = parallel
        self.pool: KVPool | None = None
        if parallel > 1:
            self.pool = KVPool(
                engine.model,
                cells=kv_cells,
                max_seqs=parallel,
                n_threads=engine.n_threads or default_threads(),
                needs=needs_of() if engine.model.info.global_layers else Needs(),
                kv_type=engine.kv_type,
                swa_cache=engine.swa_cache,
                share=share,
                layout=layout,
            )
        self._executor = ThreadPoolExecutor(
            max_workers=parallel, thread_name_prefix="kvtrim-engine"
        )
        self._lock = threading.Lock()
        self._waiting = 0
        self._building = 0  # requests on their way: from the handler to a built job
        self._session: Session | None = None
        self._key: tuple[Any, ...] | None = None
        self._jobs: dict[int, Job] = {}  # queued or running, by id
        self._stopping = False
        self._count = 0
        self.prefixes = PrefixCache(RamStates())  # one at a time: saved reads in RAM
        self._parked: OrderedDict[str, _Parked] = OrderedDict()  # in parallel: kept
        if self.pool is not None:
            self.pool.reclaim = self._reclaim

    @property
    def waiting(self) -> int:
        """Jobs queued or running."""
        return self._waiting

    @contextlib.contextmanager
    def arriving(self, expected: bool = True) -> Iterator[Arrival]:
        """A request the server has, from before it is parsed to its answer (call
        ``Arrival.built`` once its job is built; leaving the block does, if not): with
        ``expected``, the pool's rounds wait for its first step (``KVPool.expect``) so
        prompts that arrive together are read together. Only while no more requests are
        on their way than engine threads (one that would wait for others' parsing holds
        nothing), and a job that queues for a thread lets go at ``submit``."""
        pool = self.pool
        with self._lock:
            self._building += 1
            free = self._building <= self.parallel
        arrival = Arrival(None, self._built)
        try:
            if pool is not None and expected and free:
                arrival.key = pool.expect()
            yield arrival
        finally:
            arrival.built()
            if pool is not None:
                pool.unexpect(arrival.key)

    def _built(self) -> None:
        with self._lock:
            self._building -= 1

    def submit(self, job: Job) -> Future[Result]:
        with self._lock:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._waiting >= self.max_queue:
                raise Overloaded(f"{self._waiting} requests are queued; retry later")
            self._waiting += 1
            queued = self._waiting > self.parallel
            self._jobs[id(job)] = job
            self._count += 1
            job.label = job.label or f"request {self._count}"
        if queued and self.pool is not None:  # it waits for an engine thread: no round does
            self.pool.unexpect(job.arrival)
        future = self._executor.submit(self._run, job)

        def forget_if_cancelled(done: Future[Result]) -> None:
            if done.cancelled():  # cancelled while queued: ``_run`` never counts it
                self._finished(job)

        future.add_done_callback(forget_if_cancelled)
        return future

    def stop(self) -> None:
        """Refuse new jobs and cancel the queued and running ones: the server
        is shutting down (thread-safe)."""
        with self._lock:
            self._stopping = True
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel()

    def _finished(self, job: Job) -> None:
        with self._lock:
            self._waiting -= 1
            self._jobs.pop(id(job), None)

    def _run(self, job: Job) -> Result:
        """The job in its session: a new sequence of the pool (freed when it ends),
        or the kept session (closed when it fails: a failed context is not reused)."""
        session: Session | None = None
        try:
            if job._cancelled.is_set():
                raise Cancelled("the client went away before the request started")
            session = self._session_for(job)
            job._session = session
            if job._cancelled.is_set():  # cancelled while the session was made
                raise Cancelled("cancelled")
            return self._events(job, session)
        except Cancelled:
            if self._stopping:
                raise ShuttingDown("the server is shutting down") from None
            raise
        except BaseException:
            if self.pool is None:
                self._close_session()
            raise
        finally:
            job._session = None
            if self.pool is not None and session is not None and not self._park(job, session):
                session.close()
            self._finished(job)

    def _job_events(self, job: Job, session: Session) -> Iterator[Event]:
        """The job's events: its text read, or the read of the same text kept from an
        earlier request (a sequence parked in the pool, or a saved read in RAM)."""
        spec = job.spec
        gen = {"max_tokens": spec.max_tokens, "sampling": spec.sampling, "stops": spec.stops or ()}
        if self._text_key(job) is None:  # a short text: reading it costs little
            return session.run_tokens(job.head, job.tail, **gen)  # type: ignore[arg-type]
        question = self.engine.model.detokenize(job.tail)  # what recall looks for
        if self.pool is None:
            stops = gen["stops"]
            return self.prefixes.run(session, spec, job.head, job.tail, question, None, stops)
        if job.reuse is not None:
            session.rewind(job.reuse.first)
            session.stats.cached_tokens = job.reuse.text_tokens
            return session.reask(job.tail, question, **gen)  # type: ignore[arg-type]
        return session.run_tokens(job.head, job.tail, **gen)  # type: ignore[arg-type]

    def _events(self, job: Job, session: Session) -> Result:
        events = self._job_events(job, session)
        for event in events:
            if job._cancelled.is_set():  # a cancel before the run cleared its flag
                session.cancel()
            if job.sink is not None:
                job.sink(event)
            if isinstance(event, Done):
                return Result(event.text, event.reason, event.stats, self.engine.model_name)
        raise Cancelled("the run ended without an answer")

    def _session_for(self, job: Job) -> Session:
        """A new sequence of the pool (or one parked with the job's text), or the kept
        session when its settings match."""
        if self.pool is not None:
            job.reuse = self._unpark(job)
            if job.reuse is not None:
                self.pool.unexpect(job.arrival)  # its sequence is parked, not new
                return job.reuse.session
            n_tokens = len(job.head) + len(job.tail) + job.spec.max_tokens
            return job.spec.open_in(
                self.engine,
                self.pool,
                n_tokens,
                cancel=job._cancelled,
                label=job.label,
                arrival=job.arrival,
            )
        key = job.spec.session_key()
        if self._session is None or key != self._key:
            self._close_session()
            self._session = job.spec.open(self.engine)
            self._key = key
        return self._session

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
        self._session, self._key = None, None

    def _text_key(self, job: Job) -> str | None:
        if len(job.head) < MIN_PREFIX_TOKENS:
            return None
        return self.prefixes.key(job.spec, job.head)

    def _park(self, job: Job, session: Session) -> bool:
        """Keep a finished request's sequence for the next one with its text (True),
        unless it did not finish, its text is short or the server stops."""
        key = self._text_key(job)
        if key is None or self._stopping or not session.can_follow_up:
            return False
        # the text's ids are 0.. len(head) - 1: a continued request's question and
        # answer came after, and go with the next rewind to the same id
        parked = _Parked(session, len(job.head), len(job.head))
        session.ctx.kept = True  # type: ignore[attr-defined]  # a pool Slot
        with self._lock:
            old = self._parked.pop(key, None)
            self._parked[key] = parked
        if old is not None:
            old.session.close()
        return True

    def _unpark(self, job: Job) -> _Parked | None:
        key = self._text_key(job)
        with self._lock:
            parked = self._parked.pop(key, None) if key is not None else None
        if parked is not None:
            parked.session.ctx.kept = False  # type: ignore[attr-defined]
        return parked

    def _reclaim(self) -> bool:
        """Free the least recently parked sequence (the pool needs room); False when
        none is parked."""
        with self._lock:
            if not self._parked:
                return False
            _, parked = self._parked.popitem(last=False)
        parked.session.close()
        return True

    def close(self) -> None:
        """Finish the queue and free the session (or the pool)."""
        self._executor.submit(self._close_session).result()
        self._executor.shutdown(wait=True)
        while self._reclaim():
            pass
        if self.pool is not None:
            self.pool.close()
