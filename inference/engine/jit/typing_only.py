"""Typing a numba kernel without compiling it (stage_calls.discover): numba's untyped passes
and type inference run, then the pipeline ends; no code is generated. Typing still compiles
the kernels the typed one calls directly (numba types a call by compiling its callee)."""

from __future__ import annotations

from numba.core import compiler
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import NopythonTypeInference


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
        dispatcher.targetdescr.typing_context,
        dispatcher.targetdescr.target_context,
        dispatcher.py_func,
        args=signature,
        return_type=None,
        flags=flags,
        locals=function_compiler.locals,
        pipeline_class=_TypeOnly,
    )
