"""Run an unmodified Pulumi program (`__main__.py`) offline, the way the Python language host runs it."""

from __future__ import annotations

import _thread
import asyncio
import builtins
import contextvars
import gc
import os
import sys
import threading
import time
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pulumi
from pulumi.runtime import settings as _settings
from pulumi.runtime.mocks import Mocks
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _sync_await

from .config import load_stack_config
from .recorder import Record, RecordingMonitor

ORGANIZATION = "organization"
# A run's bound: the largest plan the benchmark measures takes a minute or two; a run past this is stuck.
PROGRAM_TIMEOUT_S = 1800.0
STOP_TIMEOUT_S = 30.0     # for a failed run's thread to wind down once cancelled


class ProgramTimeout(RuntimeError):
    """The program did not finish within its bound; the message says where its threads were."""


@dataclass
class ProgramRun:
    project: str
    stack: str
    records: list[Record]
    outputs: dict[str, tuple[Any, bool]]   # export -> (value, is_secret)
    component_outputs: dict[str, dict[str, Any]]
    duplicates: list[str]
    unresolved_secrets: list[str]
    seconds: float


@contextmanager
def _program_dir(path: Path) -> Iterator[None]:
    """The language host runs the program from its project directory, with that directory importable."""
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(path)
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path


def _resolve(value: Any) -> tuple[Any, bool]:
    out = pulumi.Output.from_input(value)
    return _sync_await(out.future(with_unknowns=True)), bool(_sync_await(out.is_secret()))


def run_offline(program: Callable[[], Any], *, project: str, stack: str,
                config: dict[str, str] | None = None, secret_keys: list[str] | None = None,
                unresolved_secrets: list[str] | None = None, mocks: Mocks | None = None,
                timeout_s: float = PROGRAM_TIMEOUT_S) -> ProgramRun:
    """Run `program` inside a fresh Stack under mocks, as a preview, and record every registration.

    Exceptions from the program, an RPC or an apply propagate, as they would fail `pulumi preview`. A run
    that has not ended within `timeout_s` raises ProgramTimeout with where its threads were.
    """
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_all_config(dict(config or {}), list(secret_keys or []))
    # set_mocks builds and finishes a Stack of its own when none exists; a placeholder root prevents that
    # so the program runs inside a fresh Stack exactly as under the language host (run_in_stack).
    _settings.ROOT.set(object())
    pulumi.runtime.set_mocks(monitor.mocks, project=project, stack=stack, preview=True, monitor=monitor,
                             organization=ORGANIZATION)
    # The SDK waits for every output in SETTINGS.outputs before a run ends, and set_mocks (unlike the language
    # host, one program a process) leaves that set and its lock as they were: one for every run in the process,
    # so a failed run's outputs, never to resolve on its loop, were waited on by the next run, for ever.
    _settings.SETTINGS.outputs = set()
    _settings.SETTINGS.lock = threading.Lock()
    _settings.ROOT.set(None)
    holder: dict[str, Any] = {}
    outcome: dict[str, Any] = {}
    done, ended = threading.Event(), threading.Event()
    threads = _RunThreads()

    def body() -> None:
        holder["stack"] = _settings.get_root_resource()
        try:
            program()
        except BaseException as e:      # noqa: BLE001 - raised again in the caller's thread
            # at once: the SDK then waits for every output the program left, and under the mocks one whose
            # resource never registered (its constructor raised half way) is never resolved (see _stop)
            outcome.setdefault("error", e)
            done.set()
            raise

    def run() -> None:
        try:
            with threads.own_loop() as loop:
                task = loop.create_task(run_in_stack(body))
                holder["stop"] = lambda: loop.call_soon_threadsafe(task.cancel)
                _sync_await(task)
                outcome["outputs"] = {k: _resolve(v) for k, v in sorted(holder["stack"].outputs.items())}
        except BaseException as e:      # noqa: BLE001 - raised again in the caller's thread
            outcome.setdefault("error", e)
        finally:
            done.set()
            ended.set()

    gc_was_enabled = gc.isenabled()
    gc.disable()              # the cyclic GC costs a third or more of a large run and frees nothing here
    started = time.perf_counter()
    try:
        # The program runs near the root of a stack, as under the language host: the SDK turns every frame
        # of the stack into a source position on every registration, so each frame of a caller's (a CLI's)
        # would cost every resource. So `run` is the first frame of a thread of its own (not under
        # threading.Thread's three), in a copy of this context (the runtime's settings).
        threads.add(_thread.start_new_thread(contextvars.copy_context().run, (run,)))
        finished = done.wait(timeout_s)
    finally:
        if gc_was_enabled:
            gc.enable()
    if not finished:
        where = threads.stacks()
        _stop(holder, ended, wait_s=0)    # a thread stuck outside its loop cannot be stopped: left to end
        raise ProgramTimeout(f"the Pulumi program of stack {stack!r} did not finish within {timeout_s:g} s "
                             f"under the offline runner; where its threads were:\n{where}")
    if "error" in outcome:
        _stop(holder, ended)
        raise outcome["error"]
    outputs = outcome["outputs"]
    seconds = time.perf_counter() - started
    monitor.finalize()
    return ProgramRun(project=project, stack=stack, records=monitor.records, outputs=outputs,
                      component_outputs=monitor.component_outputs, duplicates=monitor.duplicates,
                      unresolved_secrets=list(unresolved_secrets or []), seconds=seconds)


def _stop(holder: dict[str, Any], ended: threading.Event, wait_s: float = STOP_TIMEOUT_S) -> None:
    """Cancel what the SDK still waits on after the program failed (outputs that will never resolve), so the
    run's thread, its executor and its loops end instead of waiting for the rest of the process."""
    stop = holder.get("stop")
    if stop is not None and not ended.is_set():
        try:
            stop()
        except RuntimeError:        # its loop closed meanwhile: the thread is ending on its own
            pass
    ended.wait(wait_s)


class _RunThreads:
    """The threads and event loops of one run: the SDK answers each registration on its loop's default
    executor, and the mock monitor opens a loop on each executor thread. Left to the defaults, the executor
    and every loop (six threads and some twenty descriptors a run) outlived the run until the process ended."""

    def __init__(self) -> None:
        self._idents: list[int] = []
        self._loops: list[asyncio.AbstractEventLoop] = []

    def add(self, ident: int) -> None:
        self._idents.append(ident)

    def _open_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loops.append(loop)
        return loop

    def _executor_thread(self) -> None:
        self.add(threading.get_ident())
        self._open_loop()

    @contextmanager
    def own_loop(self) -> Iterator[asyncio.AbstractEventLoop]:
        """This thread's loop, with an executor of this run's own; both closed with every loop its threads
        opened when the run ends."""
        loop = self._open_loop()
        executor = ThreadPoolExecutor(thread_name_prefix="offline-rpc", initializer=self._executor_thread)
        loop.set_default_executor(executor)
        try:
            yield loop
        finally:
            # What a failed run left waiting is cancelled and run to its end, so each coroutine closes here
            # rather than being destroyed pending later, in whatever code the collector interrupts.
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            executor.shutdown(wait=True, cancel_futures=True)
            asyncio.set_event_loop(None)
            for each in self._loops:
                each.close()

    def stacks(self) -> str:
        frames = sys._current_frames()
        return "\n".join(f"thread {ident}:\n" + "".join(traceback.format_stack(frames[ident]))
                         for ident in self._idents if ident in frames)


def _as_main(path: Path) -> Callable[[], None]:
    """The program file as a function that runs it as `__main__` (as runpy.run_path does, in a fresh module
    namespace), its module frame called directly, with no frame of exec's caller around it (see run_offline)."""
    code = compile(path.read_bytes(), str(path), "exec")
    return types.FunctionType(code, {"__name__": "__main__", "__file__": str(path), "__builtins__": builtins,
                                     "__package__": None, "__spec__": None, "__loader__": None, "__cached__": None})


def run_program(project_dir: str | Path, stack: str, spec_file: Path | None = None,
                mocks: Mocks | None = None, secrets: tuple[str, ...] = (),
                settings: Mapping[str, str] | None = None) -> ProgramRun:
    """Run `<project_dir>/__main__.py` for `stack` with the stack's config, as `pulumi preview` would;
    `spec_file` stands for the stack's specFile config (`pulumi config set specFile PATH`), `settings` for
    more of the project's own (`pulumi config set KEY VALUE`), neither written to the stack's file; `secrets`:
    the optional secret settings the spec needs (a placeholder where the stack has none)."""
    project_dir = Path(project_dir).resolve()
    cfg = load_stack_config(project_dir, stack, secrets)
    for key, value in {**(settings or {}), **({"specFile": str(spec_file)} if spec_file is not None else {})}.items():
        cfg.values[f"{cfg.project}:{key}"] = value
    with _program_dir(project_dir):
        return run_offline(_as_main(project_dir / "__main__.py"),
                           project=cfg.project, stack=stack, config=cfg.values, secret_keys=cfg.secret_keys,
                           unresolved_secrets=cfg.unresolved_secrets, mocks=mocks)
