# at::parallel_for is inline: with torch's OpenMP backend (AT_PARALLEL_OPENMP) its
# `omp parallel` runs serially in a file compiled without OpenMP, silently (memref.copy's
# split over the threads did, while only ral_parallel.cpp had the flag). So every file of
# the runtime and of its C++ tests is, and links torch's own libgomp: one OpenMP runtime
# in the process.
function(blade_use_torch_openmp target)
  target_compile_options(${target} PRIVATE -fopenmp)
  if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
    target_link_libraries(${target} PRIVATE "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
  else()
    find_package(OpenMP REQUIRED)
    target_link_libraries(${target} PRIVATE OpenMP::OpenMP_CXX)
  endif()
endfunction()
