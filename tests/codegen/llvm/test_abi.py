"""codegen/llvm/abi.py and launchers.py: what the runtime calls, built once main is in the
LLVM dialect."""
from ir_runner import check_pass, run_pass

# main's C interface, as convert-func-to-llvm leaves it (two memref arguments).
LOWERED = """
llvm.func @main() {
  llvm.return
}
llvm.func @_mlir_ciface_main(%a: !llvm.ptr, %b: !llvm.ptr) {
  llvm.call @main() : () -> ()
  llvm.return
}
"""


def test_define_entry_point_unpacks_one_descriptor_pointer_per_argument():
    check_pass(LOWERED + """
    // CHECK: llvm.func @blade_entry([[ARGS:%[a-z0-9]+]]: !llvm.ptr)
    // CHECK: llvm.getelementptr [[ARGS]][0] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    // CHECK: [[A:%[0-9]+]] = llvm.load
    // CHECK: llvm.getelementptr [[ARGS]][1]
    // CHECK: [[B:%[0-9]+]] = llvm.load
    // CHECK-NOT: llvm.getelementptr [[ARGS]][2]
    // CHECK: llvm.call @_mlir_ciface_main([[A]], [[B]])
    """, "define-entry-point", num_buffers=2)


def test_define_entry_point_with_returned_outputs_reads_one_more_pointer_first():
    check_pass(LOWERED + """
    // CHECK: llvm.func @blade_entry
    // CHECK: llvm.getelementptr {{%[a-z0-9]+}}[1]
    // CHECK-NOT: llvm.getelementptr {{%[a-z0-9]+}}[2]
    // CHECK: llvm.call @_mlir_ciface_main
    """, "define-entry-point", num_buffers=1, returns_outputs=True)


def test_tune_for_host_asks_for_wide_vectors_only_with_avx512():
    check_pass(LOWERED + """
    // CHECK: llvm.func @main() attributes {prefer_vector_width = "512", reciprocal_estimates = "divf:1,vec-divf:1"}
    """, "tune-for-host", avx512=True)
    text, _ = run_pass(LOWERED, "tune-for-host", avx512=False)
    assert "prefer_vector_width" not in text and "reciprocal_estimates" in text, text


def test_mark_noalias_pointers_marks_the_data_pointers_of_noalias_memrefs():
    # A rank-1 memref argument is 5 words: allocated and aligned pointers, offset, size,
    # stride; the second memref is noalias.
    text = """
    llvm.func @task(%a0: !llvm.ptr, %a1: !llvm.ptr, %a2: i64, %a3: i64, %a4: i64,
                    %b0: !llvm.ptr, %b1: !llvm.ptr, %b2: i64, %b3: i64, %b4: i64) {
      llvm.return
    }
    // CHECK: llvm.func @task(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: i64, %arg3: i64, %arg4: i64, %arg5: !llvm.ptr {llvm.noalias}, %arg6: !llvm.ptr {llvm.noalias}, %arg7: i64
    """
    check_pass(text, "mark-noalias-pointers",
               handed_on={"noalias": {"task": [(5, False), (5, True)]}})


def test_no_launchers_without_parallel_tasks():
    text, _ = run_pass(LOWERED, "define-parallel-launchers")
    assert "blade_ral_parallel_for" not in text, text
