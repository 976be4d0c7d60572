"""Calls from one numba kernel to another through a function pointer: a cold start compiles each
callee once instead of once more in every caller above it.

numba links the LLVM module of every kernel a kernel calls into the caller's module, then
optimizes and emits machine code for the whole linked module again. The fused forward calls
its stages from inside a parallel region (step_region.py), and the region's level alone cost
15-19 s of a cold start, re-optimizing every stage below it. A call through a pointer links
nothing: the caller knows only the callee's argument types.

``Sites`` names the call sites of one caller: site i calls ``functions[i]``. In the caller,
``sites.call(calls, SITE, (arg, ...))`` calls site SITE with the arguments of the tuple; the
address is ``calls[SITE]``, an int64 array the caller takes as a runtime argument. An address is
never baked into compiled code: the caller is cached by numba and loaded by another process,
where the callees live at other addresses. The callee's error status is passed up, so an
exception it raises reaches the caller's caller as with a direct call.

Which argument types each site passes is known when the caller is typed (the intrinsic's typer
sees them). ``Sites.table`` finds them by typing the caller only (no code generated, cheap),
persists them beside numba's cache (a warm start loads the caller from the cache and types
nothing), compiles or loads each callee for its types, and returns the address table. On a
cold start, the callees are shared between this process and a second one (compile_split.py):
the two cores compile at once.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba.core import cgutils, compiler, errors, types
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NopythonTypeInference
from numba.extending import intrinsic

SITES_DIR = "lmserve_sites"  # under NUMBA_CACHE_DIR: the persisted argument types of each site


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


class Sites:
    """The pointer-call sites of one caller; site i calls ``functions[i]`` (module docstring)."""

    def __init__(self, name: str, functions: list, elsewhere: tuple = ()):
        self.name = name
        self.functions = list(functions)
        self.elsewhere = elsewhere  # of functions: what a cold start compiles in a second process
        self.typed: dict[int, tuple] = {}  # site -> argument types, as the last typing saw them
        self._tables: dict[tuple, np.ndarray] = {}  # caller's argument types -> addresses
        self.call = self._make_intrinsic()

    def __len__(self) -> int:
        return len(self.functions)

    def _make_intrinsic(self):
        sites = self

        @intrinsic(prefer_literal=True)
        def call(typingctx, calls, site, args):
            if not isinstance(site, types.IntegerLiteral):
                raise errors.TypingError(f"{sites.name}: a pointer call's site must be a constant")
            if not isinstance(args, types.BaseTuple):
                raise errors.TypingError(f"{sites.name}: a pointer call's arguments must be a tuple")
            index = site.literal_value
            if not 0 <= index < len(sites.functions):
                raise errors.TypingError(f"{sites.name}: no site {index}")
            sites.typed[index] = tuple(args.types)

            def codegen(context, builder, signature, llvm_args):
                table_type = signature.args[0]
                table = context.make_array(table_type)(context, builder, llvm_args[0])
                at = [ir.Constant(ir.IntType(64), index)]
                address = builder.load(cgutils.get_item_pointer(context, builder, table_type, table, at))
                argtypes = list(signature.args[2].types)
                values = cgutils.unpack_tuple(builder, llvm_args[2], len(argtypes))
                _pointer_call(context, builder, address, argtypes, values)
                return context.get_dummy_value()

            return types.none(calls, site, args), codegen

        return call

    # -- the address table -------------------------------------------------------------------

    def table(self, caller, args: tuple) -> np.ndarray:
        """The address table for ``caller`` (a numba dispatcher whose last argument is the
        table) called with ``args`` (the table's place: any int64 array): every site's callee
        compiled, or loaded from numba's cache, for the types the caller passes it."""
        signature = tuple(caller.typeof_pyval(a) for a in args)
        found = self._tables.get(signature)
        if found is not None:
            return found
        argtypes = load_sites(self.name, signature)
        cold = argtypes is None
        if cold:
            argtypes = self.discover(caller, signature)
            save_sites(self.name, signature, argtypes)
        callees = [Callee(self.functions[i], argtypes[i]) for i in range(len(self))]
        self.compile(Callee(caller, signature), callees, cold)
        table = np.array([address(c) for c in callees], np.int64)  # (sites,)
        self._tables[signature] = table
        return table

    def compile(self, caller: Callee, callees: list[Callee], cold: bool) -> None:
        """Compile (or load) the caller and every distinct callee; on a cold start, those of
        ``elsewhere`` in a second process meanwhile (compile_split.py)."""
        from .compile_split import compile_all

        distinct = list(dict.fromkeys(callees))
        there = [c for c in distinct if cold and any(c.function is f for f in self.elsewhere)]
        here = [caller] + [c for c in distinct if c not in there]
        compile_all(here, there)

    def discover(self, caller, signature: tuple) -> list[tuple]:
        """Each site's argument types when ``caller`` takes ``signature``: the caller typed,
        nothing compiled but the kernels its typing needs (it calls them directly)."""
        self.typed.clear()
        type_only(caller, signature)
        missing = [i for i in range(len(self)) if i not in self.typed]
        if missing:
            raise RuntimeError(f"{self.name}: typing the caller reached no call at sites {missing}")
        return [self.typed[i] for i in range(len(self))]


def address(callee: Callee) -> int:
    """Where the compiled (or cache-loaded) callee starts; it must return nothing."""
    function = callee.function
    function.compile(callee.argtypes)
    result = function.overloads[callee.argtypes]
    if result.signature.return_type != types.none:
        raise TypeError(f"{function.py_func.__qualname__} returns a value: a pointer call takes none")
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


# -- typing a caller without compiling it ------------------------------------------------------


class _Typed(Exception):
    pass


@register_pass(mutates_CFG=False, analysis_only=True)
class _StopAfterTyping(FunctionPass):
    """Ends the pipeline once the function is typed (numba's early completion)."""

    _name = "lmserve_stop_after_typing"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        raise compiler._EarlyPipelineCompletion(True)


class _TypeOnly(compiler.CompilerBase):
    """numba's untyped passes (inlining included) and type inference; no lowering."""

    def define_pipelines(self):
        pm = compiler.DefaultPassBuilder.define_untyped_pipeline(self.state)
        pm.add_pass(NopythonTypeInference, "nopython frontend")
        pm.add_pass(_StopAfterTyping, "stop after typing")
        pm.finalize()
        return [pm]


def type_only(dispatcher, signature: tuple) -> None:
    """Type ``dispatcher``'s function for ``signature`` with its own flags (parallel, ...)."""
    function_compiler = dispatcher._compiler
    flags = compiler.Flags()
    function_compiler.targetdescr.options.parse_as_flags(flags, function_compiler.targetoptions)
    flags = function_compiler._customize_flags(flags)
    compiler.compile_extra(
        dispatcher.targetdescr.typing_context, dispatcher.targetdescr.target_context, dispatcher.py_func,
        args=signature, return_type=None, flags=flags, locals=function_compiler.locals,
        pipeline_class=_TypeOnly,
    )  # fmt: skip


# -- persisted argument types ------------------------------------------------------------------


def _sites_path(name: str, signature: tuple) -> Path:
    digest = hashlib.sha256(f"{name}\0{signature}".encode()).hexdigest()[:20]
    base = os.environ.get("NUMBA_CACHE_DIR") or "."
    return Path(base) / SITES_DIR / f"{name}-{digest}.pkl"


def save_sites(name: str, signature: tuple, argtypes: list[tuple]) -> None:
    """Keep each site's argument types beside numba's cache (written whole or not at all)."""
    path = _sites_path(name, signature)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps((signature, argtypes)))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache: the next process types the caller again


def load_sites(name: str, signature: tuple) -> list[tuple] | None:
    """The persisted argument types of each site for ``signature``, or None."""
    try:
        saved_signature, argtypes = pickle.loads(_sites_path(name, signature).read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return argtypes if saved_signature == signature else None
