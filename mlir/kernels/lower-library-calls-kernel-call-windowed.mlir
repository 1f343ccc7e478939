// RUN: blade-opt --pass lower-library-calls %s | FileCheck %s
// Kernel calls of dynamic size whose results are a window's output over their first
// operand: an int8 convolution (NHWC uint8 in and out, a 3x3 filter of stride 2, padding 1)
// and a float32 one into an NCHW buffer, whose batch and spatial sizes are computed from
// their inputs', and an int8 max pool rounding its size up (ceil_mode).

func.func @main(%arg0: memref<?x?x?x16xi8>, %arg1: memref<32x16x3x3xi8>, %arg2: memref<32xf32>, %arg3: memref<2xf32>, %arg4: memref<2xf32>) -> (memref<?x?x?x32xi8>, memref<?x32x?x?xf32>, memref<?x?x?x16xi8>) {
  %0 = call @blade_kernel_0(%arg0, %arg1, %arg2, %arg3, %arg4) : (memref<?x?x?x16xi8>, memref<32x16x3x3xi8>, memref<32xf32>, memref<2xf32>, memref<2xf32>) -> memref<?x?x?x32xi8>
  %1 = call @blade_kernel_1(%arg0, %arg1, %arg2, %arg3) : (memref<?x?x?x16xi8>, memref<32x16x3x3xi8>, memref<32xf32>, memref<2xf32>) -> memref<?x32x?x?xf32>
  %2 = call @blade_kernel_2(%arg0) : (memref<?x?x?x16xi8>) -> memref<?x?x?x16xi8>
  return %0, %1, %2 : memref<?x?x?x32xi8>, memref<?x32x?x?xf32>, memref<?x?x?x16xi8>
}
func.func private @blade_kernel_0(memref<?x?x?x16xi8> {bufferization.access = "read"}, memref<32x16x3x3xi8> {bufferization.access = "read"}, memref<32xf32> {bufferization.access = "read"}, memref<2xf32> {bufferization.access = "read"}, memref<2xf32> {bufferization.access = "read"}) -> memref<?x?x?x32xi8> attributes {blade.call = 0 : i64, blade.kernel_call = "blade::quantized_conv2d int8,int8,float32,float32,float32 int8 T0 T1 T2 N I2,2 I1,1 I1,1 i1 T3 T4 s6e6f6e65", blade.library_call = "kernel_call"}
func.func private @blade_kernel_1(memref<?x?x?x16xi8> {bufferization.access = "read"}, memref<32x16x3x3xi8> {bufferization.access = "read"}, memref<32xf32> {bufferization.access = "read"}, memref<2xf32> {bufferization.access = "read"}) -> memref<?x32x?x?xf32> attributes {blade.call = 1 : i64, blade.kernel_call = "blade::quantized_conv2d int8,int8,float32,float32 float32 T0 T1 T2 N I2,2 I1,1 I1,1 i1 T3 N s6e6f6e65", blade.library_call = "kernel_call"}
func.func private @blade_kernel_2(memref<?x?x?x16xi8> {bufferization.access = "read"}) -> memref<?x?x?x16xi8> attributes {blade.call = 2 : i64, blade.kernel_call = "blade::quantized_max_pool2d int8 int8 T0 I3,3 I2,2 I1,1 I1,1 b1", blade.library_call = "kernel_call"}

// The convolution's NHWC result: the batch, then (H + 2 - 2 - 1) floordiv 2 + 1, at least 0,
// from dim 1, and the same from dim 2.
// CHECK-LABEL: func.func private @blade_kernel_0
// CHECK: [[N:%.+]] = memref.dim %arg0, %c0{{(_[0-9]+)?}}
// CHECK: [[H:%.+]] = memref.dim %arg0, %c1{{(_[0-9]+)?}}
// CHECK: [[HS:%.+]] = arith.addi [[H]], %c-1{{(_[0-9]+)?}}
// CHECK: [[HD:%.+]] = arith.floordivsi [[HS]], %c2{{(_[0-9]+)?}}
// CHECK: [[HO:%.+]] = arith.addi [[HD]], %c1{{(_[0-9]+)?}}
// CHECK: [[HM:%.+]] = arith.maxsi [[HO]], %c0{{(_[0-9]+)?}}
// CHECK: memref.dim %arg0, %c2{{(_[0-9]+)?}}
// CHECK: [[WM:%.+]] = arith.maxsi
// CHECK: memref.alloc([[N]], [[HM]], [[WM]]) : memref<?x?x?x32xi8>
// CHECK: call @blade_ral_kernel_call_6(

// The float32 result lies NCHW: its spatial dims are 2 and 3, from the input's 1 and 2.
// CHECK-LABEL: func.func private @blade_kernel_1
// CHECK: [[N1:%.+]] = memref.dim %arg0, %c0{{(_[0-9]+)?}}
// CHECK: memref.dim %arg0, %c1{{(_[0-9]+)?}}
// CHECK: [[H1:%.+]] = arith.maxsi
// CHECK: memref.dim %arg0, %c2{{(_[0-9]+)?}}
// CHECK: [[W1:%.+]] = arith.maxsi
// CHECK: memref.alloc([[N1]], [[H1]], [[W1]]) : memref<?x32x?x?xf32>

// ceil_mode: (H + 2 - 2 - 1 + 1) floordiv 2 + 1, less one where the last window would start
// at H + 1 or later.
// CHECK-LABEL: func.func private @blade_kernel_2
// CHECK: [[H2:%.+]] = memref.dim %arg0, %c1{{(_[0-9]+)?}}
// CHECK: [[S2:%.+]] = arith.floordivsi
// CHECK: [[O2:%.+]] = arith.addi [[S2]], %c1{{(_[0-9]+)?}}
// CHECK: [[START:%.+]] = arith.muli [[S2]], %c2{{(_[0-9]+)?}}
// CHECK: [[END:%.+]] = arith.addi [[H2]], %c1{{(_[0-9]+)?}}
// CHECK: [[PAST:%.+]] = arith.cmpi sge, [[START]], [[END]]
// CHECK: [[H2O:%.+]] = arith.select [[PAST]], [[S2]], [[O2]]
// CHECK: arith.maxsi [[H2O]], %c0{{(_[0-9]+)?}}
