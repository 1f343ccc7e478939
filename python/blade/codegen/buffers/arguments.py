"""Main's buffers around bufferization: which arguments the code may write and which alias
nothing, one buffer per result, and results written straight into the caller's outputs
or over an input that dies.

Before bufferization (`mark_arguments`, `distinct_results`, `reuse_dead_inputs`) these
steer one-shot bufferization; after it (`mark_out_params`, `write_outputs_in_place`) they
mark and forward main's out-parameters, so that LLVM knows no two buffers alias.
"""
from torch_mlir import ir

from blade.codegen.ir_queries import all_parallel, output_count
from torch_mlir.dialects import bufferization


def mark_arguments(main) -> None:
    """The caller's buffers are read-only to the code (`bufferization.writable = false`:
    bufferization never computes in place in an input or a param), and no buffer the code
    writes is reachable through another argument (`llvm.noalias`: outputs are fresh
    tensors, inputs and params are only read). The second lets LLVM keep accumulators in
    registers and vectorize loops that read one buffer and write another."""
    attrs = []
    for arg in main.regions[0].blocks[0].arguments:
        entries = {}
        if isinstance(arg.type, ir.RankedTensorType):
            entries["bufferization.writable"] = ir.BoolAttr.get(False)
            entries["llvm.noalias"] = ir.UnitAttr.get()
        attrs.append(ir.DictAttr.get(entries))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def mark_out_params(main) -> None:
    """After bufferization main has an out-parameter per output: fresh tensors the engine
    allocates, one per output (distinct_results), so `llvm.noalias` like its inputs."""
    arguments = main.regions[0].blocks[0].arguments
    attrs = list(ir.ArrayAttr(main.attributes["arg_attrs"])) \
        if "arg_attrs" in main.attributes else []
    attrs += [ir.DictAttr.get({})] * (len(arguments) - len(attrs))
    marked = []
    for arg, attr in zip(arguments, attrs):
        entries = {named.name: named.attr for named in ir.DictAttr(attr)}
        if isinstance(arg.type, ir.MemRefType):
            entries["llvm.noalias"] = ir.UnitAttr.get()
        marked.append(ir.DictAttr.get(entries))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(marked)


def write_outputs_in_place(main) -> int:
    """`%t = memref.alloc; <ops writing %t>; memref.copy %t, %out` becomes the same ops
    writing %out, the caller's output buffer, when %out is used by nothing else and %t is
    an allocation of the same type in main: bufferization leaves such a copy where a
    result comes out of a call (a library call's out-parameter). Returns how many."""
    block = main.regions[0].blocks[0]
    arguments = list(block.arguments)
    forwarded = 0
    for op in list(block.operations):
        if op.name != "memref.copy":
            continue
        source, target = op.operands[0], op.operands[1]
        owner = source.owner
        if isinstance(owner, ir.Block) or not any(target == a for a in arguments):
            continue
        alloc = owner.operation if hasattr(owner, "operation") else owner
        if alloc.name != "memref.alloc" or source.type != target.type or \
                len(list(target.uses)) != 1:
            continue
        op.erase()
        source.replace_all_uses_with(target)
        alloc.erase()
        forwarded += 1
    return forwarded


def distinct_results(main) -> None:
    """Each result of `main` becomes its own buffer: a value returned twice (two cluster
    outputs that canonicalization proved equal) is copied into a fresh allocation for its
    later uses. Bufferization would otherwise return one buffer twice, and
    buffer-results-to-out-params crashes on that. (`bufferization.alloc_tensor` with a
    copy, unlike a copy into `tensor.empty`, is never folded back into its source.)"""

    block = main.regions[0].blocks[0]
    terminator = block.operations[len(block.operations) - 1]
    seen = []
    with ir.InsertionPoint(terminator), terminator.location:
        for i, value in enumerate(list(terminator.operands)):
            if not any(value == other for other in seen):
                seen.append(value)
                continue
            copy = bufferization.AllocTensorOp(value.type, [], copy=value)
            terminator.operands[i] = copy.result


_REUSABLE_PRODUCERS = ("linalg.generic", "func.call")


def _declarations(main) -> set:
    """The names of the functions of main's module that have no body."""
    module_body = main.operation.parent.regions[0].blocks[0]
    return {ir.StringAttr(op.attributes["sym_name"]).value for op in module_body.operations
            if op.operation.name == "func.func" and len(op.regions[0].blocks) == 0}


def reuse_dead_inputs(main) -> int:
    """An elementwise loop nest whose input dies there writes its result over that input
    (the bias and activation after a matmul overwrite the matmul's output) instead of into
    a fresh tensor: one buffer less, and the stores go to cache lines the loop has just
    read rather than to new ones the CPU must first fetch. Taken when the input is an
    intermediate (a loop's or a library call's result: never an argument or a constant,
    whose buffers must not be written) of the output's type and indexing, read by nothing
    else, and the body never reads the output's old value. One-shot bufferization then
    writes in place (an elementwise op may overwrite the operand it reads at the same
    index). Returns how many loops were rewritten.

    Example:
        >>> reuse_dead_inputs(main)   # generic ins(%mm, %bias) outs(tensor.empty) -> outs(%mm)
        1
    """
    rewritten = 0
    declared = _declarations(main)
    for op in main.regions[0].blocks[0].operations:
        if op.name != "linalg.generic":
            continue
        if output_count(op) != 1 or not all_parallel(op):
            continue
        inputs = len(op.operands) - 1
        init = op.operands[inputs]
        empty = init.owner
        if isinstance(empty, ir.Block) or empty.name != "tensor.empty":
            continue
        if list(op.regions[0].blocks[0].arguments[inputs].uses):
            continue
        maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
        for i in range(inputs):
            value = op.operands[i]
            owner = value.owner
            if isinstance(owner, ir.Block) or owner.name not in _REUSABLE_PRODUCERS or \
                    value.type != init.type or maps[i] != maps[inputs] or \
                    len(list(value.uses)) != 1:
                continue
            if owner.name == "func.call" and \
                    ir.FlatSymbolRefAttr(owner.attributes["callee"]).value in declared:
                # A declaration's results may alias its operands as far as bufferization
                # knows, so writing into one would make it copy every operand (a kernel
                # call's weights) before the call.
                continue
            op.operands[inputs] = value
            rewritten += 1
            break
    return rewritten
