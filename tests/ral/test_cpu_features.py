"""The host CPU's features have one reading (csrc/ral/cpu_features.h): what the compiler
records in an engine (blade.codegen.llvm.native.host_cpu_features) is what the runtime
checks when it loads one (missing_cpu_features)."""
from blade import _C
from blade.codegen.llvm import native


def test_the_compiler_records_what_the_runtime_finds():
    recorded = native.host_cpu_features()
    # What Engine::load_verified_code asks of an engine compiled here.
    assert _C.missing_cpu_features(recorded) == ""
    for feature in native.CPU_FEATURES:
        has = _C.missing_cpu_features(feature) == ""
        assert (feature in recorded.split(",")) == has, feature


def test_a_feature_this_host_lacks_is_named():
    assert _C.missing_cpu_features("no_such_feature,,") == "no_such_feature"
    assert _C.missing_cpu_features(",".join(sorted(_C.host_cpu_flags()))) == ""
