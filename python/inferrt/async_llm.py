"""AsyncLLM: vLLM's asyncio engine over a plan, for callers that serve from Python.

    engine = AsyncLLM("model.plan")
    async for out in engine.generate("Hello", SamplingParams(max_tokens=32,
                                     output_kind=RequestOutputKind.DELTA), "req-1"):
        print(out.outputs[0].text, end="", flush=True)

The C engine steps on its own thread; one dispatcher thread drains its event queue (the GIL
released while it waits) and wakes each request's asyncio task through its loop. Leaving
the iteration early (break, cancellation, a client gone) cancels the request.
"""
import asyncio
import itertools
import threading

from .engine import Engine, Request
from .sampling_params import RequestOutputKind, SamplingParams


class AsyncLLM:
    def __init__(self, model, **kwargs):
        self._engine = Engine(model, **kwargs)
        self._mu = threading.Lock()  # guards _by_cid, _waiters and the requests' contents
        self._by_cid = {}
        self._waiters = {}  # engine id -> (loop, asyncio.Event)
        self._by_rid = {}
        self._ids = itertools.count()
        self._stop = False
        self._thread = threading.Thread(target=self._dispatch, name="inferrt-events",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, model, **kwargs):
        return cls(model, **kwargs)

    def _dispatch(self):
        eng = self._engine
        while not self._stop:
            try:
                events = eng.take(200)
            except Exception:  # the queue lost an event: end every request as aborted
                with self._mu:
                    for cid, req in list(self._by_cid.items()):
                        for c in req.comps:
                            c.finish_reason = c.finish_reason or "abort"
                        req.done = True
                    self._wake(list(self._by_cid))
                continue
            if not events:
                continue
            with self._mu:
                changed = eng.apply(events, self._by_cid)
                self._wake([r.cid for r in changed])

    def _wake(self, cids):
        for cid in cids:
            w = self._waiters.get(cid)
            if w is not None:
                loop, ev = w
                try:
                    loop.call_soon_threadsafe(ev.set)
                except RuntimeError:  # the loop is closed: nobody is listening
                    pass

    @property
    def errored(self):
        return self._engine._closed

    async def get_tokenizer(self):
        if self._engine.tokenizer is None:
            raise ValueError("this plan has no tokenizer")
        return self._engine.tokenizer

    async def generate(self, prompt, sampling_params=None, request_id=None, priority=0):
        """Yields RequestOutputs of one request as it runs: everything so far (CUMULATIVE,
        the default), what is new (output_kind=DELTA), or only the last (FINAL_ONLY)."""
        eng = self._engine
        eng.check_open()
        params = sampling_params or SamplingParams()
        if priority:
            params = params.clone()
            params.priority = int(priority)
        text, ids = eng.parse_prompt(prompt)
        rid = str(request_id) if request_id is not None else "req-%d" % next(self._ids)
        if rid in self._by_rid:
            raise ValueError("request id %r is already running" % rid)
        req = Request(rid, text, ids, params)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        kind = params.output_kind
        with self._mu:
            while not eng.submit(req):  # the engine's queue is full: wait for room
                self._mu.release()
                try:
                    await asyncio.sleep(0.01)
                finally:
                    self._mu.acquire()
            self._by_cid[req.cid] = req
            self._waiters[req.cid] = (loop, wake)
            self._by_rid[rid] = req
        try:
            while True:
                await wake.wait()
                wake.clear()
                with self._mu:
                    done = req.done
                    out = None
                    if kind is not RequestOutputKind.FINAL_ONLY or done:
                        out = eng.output(req, kind)
                if out is not None:
                    yield out
                if done:
                    break
        finally:
            with self._mu:
                if not req.done:
                    eng.cancel(req)
                    req.done = True
                self._by_cid.pop(req.cid, None)
                self._waiters.pop(req.cid, None)
                self._by_rid.pop(rid, None)

    async def abort(self, request_id):
        """Cancels a running request: its iteration ends with finish_reason "abort"."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        with self._mu:
            for rid in ids:
                req = self._by_rid.get(rid)
                if req is not None:
                    self._engine.cancel(req)

    def shutdown(self):
        """Stops the engine; requests still running end as aborted."""
        if self._stop:
            return
        self._stop = True
        self._engine.wake()
        self._thread.join()
        with self._mu:
            for req in self._by_cid.values():
                for c in req.comps:
                    c.finish_reason = c.finish_reason or "abort"
                req.done = True
            self._wake(list(self._by_cid))
        self._engine.close()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass
