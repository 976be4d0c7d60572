"""Per-document fan-out: run one pure function over many items, in-process or as a Celery group.

A fleet build's embarrassingly parallel work (each document's initialisation pass, the index's
chunk embeddings, ...) is written as top-level functions of one JSON-able argument returning a
JSON-able value, in the ``fleet`` package or marked with :func:`document_task`, and named by
``module:function`` or ``module.function``. The builder calls :func:`map_documents` (or the
``mapper(name, items)`` it was handed, which has the same first two arguments); where
the items run is decided by whoever runs the build, not by the builder: in this process by
default, on Celery workers inside ``with using(mapper)`` (the job service installs the Celery
mapper when a broker is configured). Results come back in the items' order either way.

This module imports nothing from Django or Celery: the Django-free builders import it freely.
Large arrays do not travel through the broker: a task writes them to a file under the build's
output directory (workers on other machines share that directory) and returns its path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

MARK = "__lmserve_document_task__"
OWN_PACKAGE = "fleet."  # top-level functions of these modules may run without the mark


class Cancelled(Exception):
    """The caller's ``cancelled()`` turned true while items were still running."""


class Mapper(Protocol):
    """Runs the task named ``name`` over ``items``; returns the results in the items' order."""

    def __call__(
        self,
        name: str,
        items: Sequence[Any],
        on_done: Callable[[int, int], None] | None,
        cancelled: Callable[[], bool] | None,
    ) -> list: ...


def document_task(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Mark a top-level function of one JSON-able argument as runnable by the fan-out (a worker
    runs only marked functions, whatever name a message carries)."""
    if "<locals>" in fn.__qualname__:
        raise TypeError(f"{fn.__qualname__}: a document task must be a top-level function")
    setattr(fn, MARK, True)
    return fn


def task_name(fn: Callable | str) -> str:
    """``module:function`` of a function that may fan out (a name is returned as it is)."""
    if isinstance(fn, str):
        return fn
    name = f"{fn.__module__}:{fn.__qualname__}"
    if not (
        getattr(fn, MARK, False) or (fn.__module__.startswith(OWN_PACKAGE) and "." not in fn.__qualname__)
    ):
        raise TypeError(f"{name} is neither marked with @document_task nor a top-level fleet function")
    return name


def resolve(name: str) -> Callable[[Any], Any]:
    """The function ``module:function`` (or ``module.function``) names, if it may run here: marked
    with :func:`document_task`, or a top-level function of this app's own ``fleet.`` modules.
    ValueError for anything else, whatever a broker message says."""
    module_name, sep, attr = name.partition(":")
    if not sep:
        module_name, _, attr = name.rpartition(".")
    if not module_name or not attr or "." in attr:
        raise ValueError(f"{name!r}: expected 'module:function'")
    fn = getattr(importlib.import_module(module_name), attr, None)
    own = module_name.startswith(OWN_PACKAGE) and getattr(fn, "__module__", None) == module_name
    if not callable(fn) or not (getattr(fn, MARK, False) or own):
        raise ValueError(f"{name!r} is not a document task")
    return fn


def run_in_process(
    name: str,
    items: Sequence[Any],
    on_done: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list:
    """The default mapper: one item after another in this process."""
    fn = resolve(name)
    results = []
    for item in items:
        if cancelled is not None and cancelled():
            raise Cancelled(f"cancelled after {len(results)} of {len(items)} items")
        results.append(fn(item))
        if on_done is not None:
            on_done(len(results), len(items))
    return results


_mapper: ContextVar[Mapper | None] = ContextVar("lmserve_fanout_mapper", default=None)


@contextmanager
def using(mapper: Mapper) -> Iterator[None]:
    """Run every :func:`map_documents` of this context (thread, task) through ``mapper``."""
    token = _mapper.set(mapper)
    try:
        yield
    finally:
        _mapper.reset(token)


def map_documents(
    fn: Callable[[Any], Any] | str,
    items: Sequence[Any],
    on_done: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list:
    """``[fn(item) for item in items]``, wherever the current mapper runs them (in-process unless a
    caller installed another with :func:`using`). ``on_done(done, total)`` reports completions;
    ``cancelled()`` is polled, and :class:`Cancelled` raised when it turns true."""
    mapper = _mapper.get() or run_in_process
    return mapper(task_name(fn), list(items), on_done, cancelled)


def current_mapper_name() -> str:
    """``in-process`` or the installed mapper's name (for logs)."""
    mapper = _mapper.get()
    return "in-process" if mapper is None else getattr(mapper, "__name__", type(mapper).__name__)
