"""Calls from one numba kernel to another through a function pointer: a cold start compiles each
callee once instead of once more in every caller above it.

numba links the LLVM module of every kernel a kernel calls into the caller's module, then
optimizes and emits machine code for the whole linked module again. The fused forward calls
its stages from inside a parallel region (step_region.py), and the region's level alone cost
15-19 s of a cold start, re-optimizing every stage below it. A call through a pointer links
nothing: the caller knows only the callee's argument types.

``Sites`` holds the pointer-call sites of one module: site i calls ``functions[i]``. In a
kernel, ``SITES.call(SITE, (arg, ...))`` calls it with the arguments of the tuple. Each
(callee, argument types) has a slot in the module's address table, at a hash of the callee's
name and the types (the same in every process). The table is a numpy array of this process,
named to the linker (llvmlite's add_symbol): compiled code reads it by that name, so code
loaded from numba's cache by another process finds that process's table. No address is ever
baked into compiled code. An empty slot raises RuntimeError (never a jump to 0); the
callee's error status is passed up, so its exceptions reach the caller's caller as with a
direct call. Callees take and return nothing but their arguments (they must return None).

``prepare(caller, args)`` makes a kernel with pointer calls runnable: it types the caller only
(no code generated; the intrinsic's typer records each site's argument types), then each
nested callee (one that makes pointer calls itself, declared with ``Sites.add(f, table)``),
persists the types beside numba's cache (a warm start loads the caller from the cache and
types nothing), compiles or loads every callee and fills the slots. On a cold start the
callees are shared with a second process (compile_split.py): the two cores compile at once.
A kernel making pointer calls must run only after prepare() for its argument types.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llvmlite import binding, ir
from numba.core import cgutils, errors, types
from numba.extending import intrinsic

from . import compile_split
from .numba_cache import kernel_cache_dir
from .typing_only import type_only

log = logging.getLogger(__name__)

SITES_DIR = "lmserve_sites"  # under kernel_cache_dir(): the persisted argument types of each site


# Slots per table: a callee's slot is a hash of its name and argument types (the same in every
# process, so cached code reads the right one). calloc'd: untouched pages cost no memory.
SLOTS = 1 << 20


@dataclass(frozen=True)
class Callee:
    """One callee to compile: a kernel (numba dispatcher) and the argument types of a site."""

    function: object  # numba Dispatcher
    argtypes: tuple


def _pointer_call(context, builder, address, argtypes, args):
    """Call the numba function at ``address`` (an LLVM i64) with ``args`` of ``argtypes``; an
    error status it returns is returned from the calling function at once."""
    fnty = context.call_conv.get_function_type(types.none, argtypes)
    function = builder.inttoptr(address, fnty.as_pointer())
    status, _ = context.call_conv.call_function(builder, function, types.none, argtypes, args)
    with cgutils.if_unlikely(builder, status.is_error):
        context.call_conv.return_status_propagate(builder, status)


def _table_global(module, symbol: str):
    """The external global ``symbol`` ([SLOTS x i64]) declared in ``module``: resolved by
    name when the code is loaded, from this process's llvmlite symbol table."""
    table = module.globals.get(symbol)
    if table is None:
        table = ir.GlobalVariable(module, ir.ArrayType(ir.IntType(64), SLOTS), symbol)
        table.linkage = "external"
    return table


def slot_of(callee: Callee) -> int:
    """The table slot of a callee compiled for its argument types."""
    function = callee.function.py_func
    name = f"{function.__module__}.{function.__qualname__}\0{callee.argtypes}"
    if "0x" in name:  # a type named by an address would hash differently in each process
        raise errors.TypingError(f"a pointer call's argument types must not name addresses: {name}")
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") % SLOTS


class Sites:
    """The pointer-call sites of one module: site i calls ``functions[i]``, each distinct
    argument types at slot_of(...) of the module's address table (module docstring). The
    table lives in this process and is named to the linker by ``symbol``: compiled code reads
    it by that name, so code loaded from numba's cache finds this process's table."""

    def __init__(self, name: str):
        self.name = name
        self.symbol = f"lmserve_sites_{name}"
        self.functions: list = []
        self.typed: set[tuple[int, tuple]] = set()  # (site, argument types) seen by typing
        self.slots: dict[int, Callee] = {}  # slot -> its callee
        self.addresses = np.zeros(SLOTS, np.int64)  # (SLOTS,) where each slot's callee starts
        binding.add_symbol(self.symbol, self.addresses.ctypes.data)
        self.call = self._make_intrinsic()
        ALL_SITES.append(self)

    def add(self, function, calls_through: Sites | None = None, needs: str | None = None) -> int:
        """A site calling ``function``; its index (a constant the caller passes to ``call``).
        ``calls_through``: the table ``function`` itself makes pointer calls through, so typing
        it finds more sites. A function that makes pointer calls runs only after prepare().
        ``needs``: a feature of the model (prepare's ``features``) without which the site is
        never reached: ``function`` is then not compiled and its slot stays empty."""
        self.functions.append(function)
        if calls_through is not None:
            calls_from(function, calls_through)
        if needs is not None:
            NEEDS[function] = needs
        return len(self.functions) - 1

    def _make_intrinsic(self):
        sites = self

        @intrinsic(prefer_literal=True)
        def call(typingctx, site, args):
            if not isinstance(site, types.IntegerLiteral):
                raise errors.TypingError(f"{sites.name}: a pointer call's site must be a constant")
            if not isinstance(args, types.BaseTuple):
                raise errors.TypingError(f"{sites.name}: a pointer call's arguments must be a tuple")
            slot = sites.record(site.literal_value, tuple(args.types))
            name = sites.functions[site.literal_value].py_func.__qualname__

            def codegen(context, builder, signature, llvm_args):
                table = _table_global(builder.module, sites.symbol)
                at = [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), slot)]
                address = builder.load(builder.gep(table, at))
                with cgutils.if_unlikely(builder, cgutils.is_null(builder, address)):
                    message = f"{name} has no address: run stage_calls.prepare on the caller first"
                    context.call_conv.return_user_exc(builder, RuntimeError, (message,))
                argtypes = list(signature.args[1].types)
                values = cgutils.unpack_tuple(builder, llvm_args[1], len(argtypes))
                _pointer_call(context, builder, address, argtypes, values)
                return context.get_dummy_value()

            return types.none(site, args), codegen

        return call

    def record(self, site: int, argtypes: tuple) -> int:
        """Site ``site`` passes ``argtypes``; the slot of its callee for them."""
        if not 0 <= site < len(self.functions):
            raise errors.TypingError(f"{self.name}: no site {site}")
        callee = Callee(self.functions[site], argtypes)
        slot = slot_of(callee)
        if self.slots.setdefault(slot, callee) != callee:
            raise errors.TypingError(f"{self.name}: {callee} and {self.slots[slot]} hash to one slot")
        self.typed.add((site, argtypes))
        return slot


ALL_SITES: list[Sites] = []  # every table, in import order
NESTED: list[tuple] = []  # (function, the Sites it makes pointer calls through)
NEEDS: dict = {}  # function -> the model feature without which no site calls it
ELSEWHERE: list = []  # functions a cold start compiles in the second process
_prepared: set[tuple] = set()  # (caller, signature, features) whose sites have addresses
_PREPARING = threading.Lock()
_early: dict[tuple, object] = {}  # (caller, signature) -> its second process, started ahead


def calls_from(function, sites: Sites) -> None:
    """``function`` makes pointer calls through ``sites``: typing it finds them (a nested
    callee of a site, Sites.add's ``calls_through``, or a kernel a stage calls directly)."""
    if (function, sites) not in NESTED:
        NESTED.append((function, sites))


def compile_elsewhere(*functions) -> None:
    """On a cold start, compile these (callees, or a caller) in the second process."""
    ELSEWHERE.extend(functions)


def start_early(caller, signature: tuple) -> None:
    """A cold start will prepare ``caller`` for ``signature`` (numba types) soon: start the
    second compiling process now, so that it types and compiles while this one still loads
    the model (the argument types must be those prepare() will see: else it is stopped
    there and a second process started anew). Nothing on a warm start."""
    key = (caller, signature)
    if key in _early or load_sites(caller, signature) is not None:
        return
    helper = compile_split.start(caller, signature)
    if helper is not None:
        _early[key] = helper


def compiling_ahead() -> bool:
    """Whether a second process started by start_early is compiling for a caller not yet
    prepared (a cold start under way)."""
    return bool(_early)


def cancel_early() -> None:
    """Stop the second processes start_early started whose caller will not be prepared (the
    model turned out to have no fused forward)."""
    while _early:
        (caller, _), helper = _early.popitem()
        log.info("stopping the second process started ahead for %s: not needed", caller.py_func.__qualname__)
        helper.kill()
        helper.wait()


def prepare(caller, args: tuple, features: frozenset[str] = frozenset()) -> None:
    """Make ``caller`` (a numba dispatcher) callable with ``args``: every site it reaches,
    directly or through other pointer calls, has its callee compiled (or loaded from numba's
    cache) for the types the site passes, and its address in its table; but a callee added
    with ``needs`` only if ``features`` (what the caller's data has) holds that feature."""
    signature = tuple(caller.typeof_pyval(a) for a in args)
    if (caller, signature, features) in _prepared:
        return
    with _PREPARING:  # two threads' first forwards: one prepares, the other then finds it done
        if (caller, signature, features) not in _prepared:
            _prepare(caller, signature, features)


def wanted(callee: Callee, features: frozenset[str]) -> bool:
    """Whether prepare() with ``features`` compiles ``callee``."""
    needs = NEEDS.get(callee.function)
    return needs is None or needs in features


def _prepare(caller, signature: tuple, features: frozenset[str]) -> None:
    saved = load_sites(caller, signature)
    helper = _early.pop((caller, signature), None) if saved is None else None
    cancel_early()  # started for other argument types than the caller's: no use now
    if saved is None:  # a cold start: a second process discovers too, and compiles ELSEWHERE
        helper = helper or compile_split.start(caller, signature)
        discover(caller, signature, "here" if helper is not None else "all")
    else:
        record_sites(saved)
    reached = dict.fromkeys([Callee(caller, signature), *all_callees()])
    everything = [c for c in reached if wanted(c, features)]
    there = [c for c in everything if helper is not None and compiled_elsewhere(c)]
    helped = compile_split.compile_all([c for c in everything if c not in there], there, helper)
    if saved is None:  # the sites only the other process typed: reported by it, or typed here now
        adopt(compile_split.found(helper) if helper is not None and helped else None)
        discover(caller, signature)
        save_sites(caller, signature)
    for sites in ALL_SITES:
        for slot, callee in sites.slots.items():
            if wanted(callee, features):
                sites.addresses[slot] = address(callee)
    _prepared.add((caller, signature, features))


def all_callees() -> list[Callee]:
    """Every callee typing has reached so far, each table's in slot order."""
    return [callee for sites in ALL_SITES for _, callee in sorted(sites.slots.items())]


def compiled_elsewhere(callee: Callee) -> bool:
    """Whether a cold start compiles ``callee`` in the second process (never one that some
    model does not need: the second process does not know the model's features)."""
    return callee.function not in NEEDS and any(callee.function is f for f in ELSEWHERE)


def discover(caller, signature: tuple, side: str = "all") -> None:
    """Each site's argument types: ``caller`` typed for ``signature``, then each nested callee
    for the types its site passes, until no new site turns up. Nothing is compiled but the
    kernels their typing needs (those they call directly). ``side`` "here" or "there" (the
    two processes of a cold start) skips the nested callees whose sites call only what the
    other process compiles (typing attend_stage compiles ~2 s of helpers)."""
    _type_once(Callee(caller, signature))
    done: set[Callee] = set()
    while pending := [c for c in [*all_callees(), *_loaded_nested()] if c not in done and _nests(c)]:
        for callee in pending:
            done.add(callee)
            if _wanted(_table_of(callee.function), side):
                _type_once(callee)


def _nests(callee: Callee) -> bool:
    return _table_of(callee.function) is not None


def _loaded_nested() -> list[Callee]:
    """The functions making pointer calls that numba loaded from its cache for a direct call
    (a caller typed above calls them directly): loaded, they were not typed, so their sites
    are found only by typing them here (bench/lab/decode_breakdown's stages, called directly)."""
    return [
        Callee(function, signature)
        for function, _ in NESTED
        for signature in list(function.overloads)
        if function._cache_hits.get(signature)
    ]


_typed: set[Callee] = set()  # what type_only has typed in this process (or the second one)


def typed_sites() -> dict:
    """{table name: [(site, argument types)]} of every site typing has found here."""
    return {sites.name: sorted(sites.typed, key=str) for sites in ALL_SITES}


def record_sites(typed: dict) -> None:
    """Record the sites of a typed_sites() (persisted, or from the second process)."""
    for sites in ALL_SITES:
        for site, argtypes in typed.get(sites.name, ()):
            sites.record(site, argtypes)


def typed_report() -> tuple:
    """What this process's discover found: (typed_sites(), the nested callees it typed as
    (module, name, argument types)), for the first process of a cold start (adopt)."""
    typed = [(c.function.py_func.__module__, c.function.py_func.__qualname__, c.argtypes) for c in _typed]
    return typed_sites(), typed


def adopt(report: tuple | None) -> None:
    """Take the second process's typed_report: its sites recorded, the nested callees it typed
    not typed again here (typing attend_stage costs ~0.3 s even with its helpers cached)."""
    if report is None:
        return
    typed, callees = report
    record_sites(typed)
    named = {(f.py_func.__module__, f.py_func.__qualname__): f for f, _ in NESTED}
    _typed.update(Callee(named[m, n], t) for m, n, t in callees if (m, n) in named)


def _type_once(callee: Callee) -> None:
    if callee not in _typed:
        type_only(callee.function, callee.argtypes)
        _typed.add(callee)


def _table_of(function) -> Sites | None:
    """The table a function makes pointer calls through, if it makes any."""
    return next((sites for f, sites in NESTED if f is function), None)


def _wanted(sites: Sites, side: str) -> bool:
    """Whether a process on ``side`` needs the sites of a function calling through ``sites``."""
    elsewhere = [any(f is g for g in ELSEWHERE) for f in sites.functions]
    return side == "all" or (side == "here" and not all(elsewhere)) or (side == "there" and any(elsewhere))


def address(callee: Callee) -> int:
    """Where the compiled (or cache-loaded) callee starts; it must return nothing."""
    function = callee.function
    function.compile(callee.argtypes)
    result = function.overloads[callee.argtypes]
    if result.signature.return_type != types.none:
        raise TypeError(f"{function.py_func.__qualname__} returns a value: a pointer call takes none")
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


# -- persisted argument types ------------------------------------------------------------------


def _sites_path(caller, signature: tuple) -> Path:
    name = f"{caller.py_func.__module__}.{caller.py_func.__qualname__}"
    digest = hashlib.sha256(f"{name}\0{signature}".encode()).hexdigest()[:20]
    return kernel_cache_dir() / SITES_DIR / f"{caller.py_func.__qualname__}-{digest}.pkl"


def save_sites(caller, signature: tuple) -> None:
    """Keep every site's argument types beside numba's cache (written whole or not at all)."""
    path = _sites_path(caller, signature)
    typed = typed_sites()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps((signature, typed)))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache: the next process types the caller again


def load_sites(caller, signature: tuple) -> dict | None:
    """The persisted argument types, {table name: [(site, types)]}, for ``signature``, or None."""
    try:
        saved_signature, typed = pickle.loads(_sites_path(caller, signature).read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return typed if saved_signature == signature else None
