"""Arrays without a reference count, for the threads of one parallel region.

numba counts references to an array's memory with atomic adds on a shared word: every call of
a kernel with array arguments, every view, adds and subtracts. The fused forward's threads
pass the same arrays (the weight arenas, the activations) to thousands of work items, so both
cores kept taking the cache line of each of those words from each other: ~5-7% of a 16-token
prefill's CPU time on one thread in the add and subtract alone, more when the second thread
wants the same line. A ``borrowed`` view has the same data, shape and strides but no
reference count (like numba.carray's arrays): its views and the calls it goes to skip the
atomics. It must not outlive the array it borrows from (the region's caller holds them).
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array


@intrinsic
def borrowed(typingctx, array):
    """The same array without a reference count (module docstring)."""
    if not isinstance(array, types.Array):
        return None
    sig = array(array)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        source = context.make_array(array_type)(context, builder, args[0])
        view = context.make_array(array_type)(context, builder)
        populate_array(
            view,
            data=source.data,
            shape=cgutils.unpack_tuple(builder, source.shape),
            strides=cgutils.unpack_tuple(builder, source.strides),
            itemsize=source.itemsize,
            meminfo=None,
        )
        return view._getvalue()

    return sig, codegen
