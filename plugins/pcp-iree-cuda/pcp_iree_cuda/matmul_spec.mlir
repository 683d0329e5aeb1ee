// IREE transform library: lowering configs for float32 matrix products on NVIDIA GPUs.
//
// IREE 3.13 has no float32 matrix-unit path on NVIDIA, and its default SIMT configs
// for f32 contractions read both operands straight from global memory with 1x16
// outputs per thread: 2-3 TFLOP/s on an H200. These stage both operands in shared
// memory (promote_operands) and give each thread an 8x8 block of outputs (4x4 for the
// batched products). Chosen with benchmarks/gpu_matmul_configs.py on an H200, one
// product at a time: 8192x1536x384 3.4 -> 16.4 TFLOP/s; with a transposed right
// operand 1.9 -> 14.0; a transposed left one (a weight gradient) 2.0 -> 10.9.
// Shapes the tiles do not divide keep IREE's default. bf16 products are left alone:
// IREE already maps them to mma.sync.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @apply_op_config(%op: !transform.any_op {transform.readonly},
                                            %config: !transform.any_param {transform.readonly}) {
    transform.annotate %op "compilation_info" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }

  // [M, K] x [K, N].
  transform.named_sequence @match_nn(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = f32, rhs_type = f32, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                       affine_map<(d0, d1, d2) -> (d2, d1)>,
                       affine_map<(d0, d1, d2) -> (d0, d1)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[0], 128 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 8 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[1], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [128, 64, 0], thread = [8, 8, 0],
                                                   reduction = [0, 0, 8], promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // [M, K] x [N, K]ᵀ.
  transform.named_sequence @match_nt(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = f32, rhs_type = f32, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                       affine_map<(d0, d1, d2) -> (d1, d2)>,
                       affine_map<(d0, d1, d2) -> (d0, d1)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[0], 128 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 8 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[0], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [128, 64, 0], thread = [8, 8, 0],
                                                   reduction = [0, 0, 8], promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // Attention: [B, M, K] x [B, K, N].
  transform.named_sequence @match_batch_nn(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = f32, rhs_type = f32, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[2], 16 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[2], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [1, 64, 64, 0], thread = [1, 4, 4, 0],
                                                   reduction = [0, 0, 0, 16], promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // Weight gradients, summed over blocks of rows (pcp_core.precision): [B, K, M]ᵀ x [B, K, N].
  transform.named_sequence @match_batch_tn(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = f32, rhs_type = f32, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d3, d1)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[2], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 16 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[2], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [1, 64, 64, 0], thread = [1, 4, 4, 0],
                                                   reduction = [0, 0, 0, 16], promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  transform.named_sequence @__kernel_config(%variant_op: !transform.any_op {transform.consumed})
      -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %res = transform.foreach_match in %variant_op
        @match_nn -> @apply_op_config,
        @match_nt -> @apply_op_config,
        @match_batch_nn -> @apply_op_config,
        @match_batch_tn -> @apply_op_config
      : (!transform.any_op) -> !transform.any_op
    transform.yield %res : !transform.any_op
  }
}
