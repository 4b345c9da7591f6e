module @jit_layernorm_gelu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1024x1024xbf16>, %arg1: tensor<1024xbf16>, %arg2: tensor<1024xbf16>) -> (tensor<1024x1024xbf16> {jax.result_info = "result"}) {
    %0 = stablehlo.convert %arg0 : (tensor<1024x1024xbf16>) -> tensor<1024x1024xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<1024x1024xf32>, tensor<f32>) -> tensor<1024xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<1024xf32>) -> tensor<1024x1xf32>
    %cst_0 = stablehlo.constant dense<1.024000e+03> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<1024x1xf32>
    %4 = stablehlo.divide %2, %3 : tensor<1024x1xf32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0, 1] : (tensor<1024x1xf32>) -> tensor<1024x1024xf32>
    %6 = stablehlo.subtract %0, %5 : tensor<1024x1024xf32>
    %7 = stablehlo.multiply %6, %6 : tensor<1024x1024xf32>
    %cst_1 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %8 = stablehlo.reduce(%7 init: %cst_1) applies stablehlo.add across dimensions = [1] : (tensor<1024x1024xf32>, tensor<f32>) -> tensor<1024xf32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0] : (tensor<1024xf32>) -> tensor<1024x1xf32>
    %cst_2 = stablehlo.constant dense<1.024000e+03> : tensor<f32>
    %10 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1024x1xf32>
    %11 = stablehlo.divide %9, %10 : tensor<1024x1xf32>
    %12 = stablehlo.broadcast_in_dim %4, dims = [0, 1] : (tensor<1024x1xf32>) -> tensor<1024x1024xf32>
    %13 = stablehlo.subtract %0, %12 : tensor<1024x1024xf32>
    %cst_3 = stablehlo.constant dense<9.99999974E-6> : tensor<f32>
    %14 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<1024x1xf32>
    %15 = stablehlo.add %11, %14 : tensor<1024x1xf32>
    %16 = stablehlo.rsqrt %15 : tensor<1024x1xf32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [0, 1] : (tensor<1024x1xf32>) -> tensor<1024x1024xf32>
    %18 = stablehlo.multiply %13, %17 : tensor<1024x1024xf32>
    %19 = stablehlo.convert %arg1 : (tensor<1024xbf16>) -> tensor<1024xf32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [1] : (tensor<1024xf32>) -> tensor<1x1024xf32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [0, 1] : (tensor<1x1024xf32>) -> tensor<1024x1024xf32>
    %22 = stablehlo.multiply %18, %21 : tensor<1024x1024xf32>
    %23 = stablehlo.convert %arg2 : (tensor<1024xbf16>) -> tensor<1024xf32>
    %24 = stablehlo.broadcast_in_dim %23, dims = [1] : (tensor<1024xf32>) -> tensor<1x1024xf32>
    %25 = stablehlo.broadcast_in_dim %24, dims = [0, 1] : (tensor<1x1024xf32>) -> tensor<1024x1024xf32>
    %26 = stablehlo.add %22, %25 : tensor<1024x1024xf32>
    %27 = stablehlo.multiply %26, %26 : tensor<1024x1024xf32>
    %28 = stablehlo.multiply %27, %26 : tensor<1024x1024xf32>
    %cst_4 = stablehlo.constant dense<4.471500e-02> : tensor<f32>
    %29 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<1024x1024xf32>
    %30 = stablehlo.multiply %29, %28 : tensor<1024x1024xf32>
    %31 = stablehlo.add %26, %30 : tensor<1024x1024xf32>
    %cst_5 = stablehlo.constant dense<0.797884583> : tensor<f32>
    %32 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<1024x1024xf32>
    %33 = stablehlo.multiply %32, %31 : tensor<1024x1024xf32>
    %34 = stablehlo.tanh %33 : tensor<1024x1024xf32>
    %cst_6 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %35 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<1024x1024xf32>
    %36 = stablehlo.add %35, %34 : tensor<1024x1024xf32>
    %cst_7 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %37 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<1024x1024xf32>
    %38 = stablehlo.multiply %37, %36 : tensor<1024x1024xf32>
    %39 = stablehlo.multiply %26, %38 : tensor<1024x1024xf32>
    %40 = stablehlo.convert %39 : (tensor<1024x1024xf32>) -> tensor<1024x1024xbf16>
    return %40 : tensor<1024x1024xbf16>
  }
}
