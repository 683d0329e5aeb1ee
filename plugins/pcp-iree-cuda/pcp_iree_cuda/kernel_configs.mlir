// IREE transform library: lowering configs for a GPT step's kernels on NVIDIA GPUs: the
// matrix products, float32 and bf16, and the elementwise passes.
//
// float32: IREE 3.13 has no float32 matrix-unit path on NVIDIA, and its default SIMT
// configs for f32 contractions read both operands straight from global memory with 1x16
// outputs per thread: 2-3 TFLOP/s on an H200. These stage both operands in shared
// memory (promote_operands) and give each thread an 8x8 block of outputs (4x4 for the
// batched products). Chosen with benchmarks/gpu_matmul_configs.py on an H200, one
// product at a time: 8192x1536x384 3.4 -> 16.4 TFLOP/s; with a transposed right
// operand 1.9 -> 14.0; a transposed left one (a weight gradient) 2.0 -> 10.9.
//
// bf16: IREE maps these to mma.sync but gives every one the same tile, 64x64 with four
// warps of 32x32 and a 128-deep reduction tile. The bf16 entries below were chosen with
// benchmarks/gpu_dispatch_configs.py on the gpt-b32 step's own dispatches, epilogues
// included, and kept where Nsight Compute on the whole step agreed (H100, 2026-11-24;
// benchmarks/results/gpu/h100/2026-11-24c): the step's products 6.1 -> 5.1 ms, the
// step 14.05 -> 12.99 ms. Two-warp tiles won on the dispatch benchmark, whose operands
// sit in L2 between repeats, and lost 3 ms in the step, where they come from memory.
//
// Elementwise passes (casts, bias and residual adds, layer norm's normalisation,
// transposes): IREE gives every one a single warp a workgroup and 4 elements a thread,
// which holds a memory-bound pass to about 1 TB/s on an H100 (a [8192, 1536] f32 -> bf16
// cast, 75 MB, took 62 us). Eight warps a workgroup with the same 4 elements a thread:
// that cast 62 -> 23 us, the gpt-b32 bf16 step's elementwise passes 3.9 -> 2.5 ms and
// the step 13.07 -> 11.75 ms (H100, 2026-11-24; benchmarks/results/gpu/h100/2026-11-24d).
// The same change to the column sums (an outer reduction, also one warp a workgroup)
// made them slower; only their last, short sum has a config of its own.
//
// Shapes the tiles do not divide keep IREE's default.
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

  // bf16 [M, K] x [K, N], N of 1024 or more (an MLP's or attention's first product): 128x128, four warps of 64x64.
  transform.named_sequence @match_bf16_nn_wide(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = bf16, rhs_type = bf16, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                       affine_map<(d0, d1, d2) -> (d2, d1)>,
                       affine_map<(d0, d1, d2) -> (d0, d1)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[0], 128 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[1], 128 : !transform.any_value
    transform.iree.match.dim_bounds %rhs[1], umin = 1024, umax = 1099511627776 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>,
        workgroup = [128, 128, 0], subgroup = [4, 8, 0], reduction = [0, 0, 4],
        promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // bf16 [M, K] x [K, N], narrower: 128x64, eight warps of 32x32.
  transform.named_sequence @match_bf16_nn(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = bf16, rhs_type = bf16, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                       affine_map<(d0, d1, d2) -> (d2, d1)>,
                       affine_map<(d0, d1, d2) -> (d0, d1)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[0], 128 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[1], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>,
        workgroup = [128, 64, 0], subgroup = [2, 4, 0], reduction = [0, 0, 4],
        promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // bf16 [M, K] x [N, K]ᵀ with N up to 1152 (input gradients into the model width): 64x128, four warps of 32x64. Wider ones keep IREE's config, which beat every candidate.
  transform.named_sequence @match_bf16_nt(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = bf16, rhs_type = bf16, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>,
                       affine_map<(d0, d1, d2) -> (d1, d2)>,
                       affine_map<(d0, d1, d2) -> (d0, d1)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[0], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[0], 128 : !transform.any_value
    transform.iree.match.dim_bounds %rhs[0], umin = 1, umax = 1152 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>,
        workgroup = [64, 128, 0], subgroup = [2, 8, 0], reduction = [0, 0, 4],
        promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // bf16 weight gradients [B, K, M]ᵀ x [B, K, N] with N of 1024 or more: 128x128, four warps of 64x64.
  transform.named_sequence @match_bf16_batch_tn_wide_n(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = bf16, rhs_type = bf16, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d3, d1)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[2], 128 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[2], 128 : !transform.any_value
    transform.iree.match.dim_bounds %rhs[2], umin = 1024, umax = 1099511627776 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>,
        workgroup = [1, 128, 128, 0], subgroup = [0, 4, 8, 0], reduction = [0, 0, 0, 4],
        promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The same with M of 1024 or more. Smaller ones (384x384) keep IREE's 64x64: 128x128 tiles leave SMs idle.
  transform.named_sequence @match_bf16_batch_tn_wide_m(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = bf16, rhs_type = bf16, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d3, d1)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[2], 128 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[2], 128 : !transform.any_value
    transform.iree.match.dim_bounds %lhs[2], umin = 1024, umax = 1099511627776 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>,
        workgroup = [1, 128, 128, 0], subgroup = [0, 4, 8, 0], reduction = [0, 0, 0, 4],
        promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // bf16 attention products [B, M, K] x [B, K, N]: IREE's 64x64 with a 64-deep reduction tile instead of 128.
  transform.named_sequence @match_bf16_batch_nn(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %batch, %m, %n, %k = transform.iree.match.contraction %op,
      lhs_type = bf16, rhs_type = bf16, output_type = f32,
      indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d3)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>,
                       affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>] : !transform.any_op -> !transform.param<i64>
    %lhs = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    %rhs = transform.get_operand %op[1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %lhs[2], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %rhs[2], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_BF16>,
        workgroup = [1, 64, 64, 0], subgroup = [0, 2, 4, 0], reduction = [0, 0, 0, 4],
        promote_operands = [0, 1]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [128, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // An elementwise pass: a linalg.generic whose loops are all parallel and whose operands
  // are all read from memory, not computed in the dispatch (a product's epilogue has its
  // own config). Yields the rank. Only float inputs (the callers check the type): IREE
  // also compiles integer index arithmetic on constants for the host, where a GPU config
  // would not lower.
  transform.named_sequence @match_elementwise(%op: !transform.any_op {transform.readonly})
      -> !transform.param<i64> {
    transform.match.operation_name %op ["linalg.generic"] : !transform.any_op
    %rank = transform.match.structured failures(propagate) %op : (!transform.any_op) -> !transform.param<i64> {
    ^bb0(%s: !transform.any_op):
      transform.match.structured.dim %s[all] parallel : !transform.any_op
      %r = transform.match.structured.rank %s : (!transform.any_op) -> !transform.param<i64>
      transform.match.structured.yield %r : !transform.param<i64>
    }
    %operands = transform.get_operand %op[all] : (!transform.any_op) -> !transform.any_value
    %producers = transform.get_defining_op %operands : (!transform.any_value) -> !transform.any_op
    %none = transform.param.constant 0 : i64 -> !transform.param<i64>
    %generic = transform.select "linalg.generic" in %producers : (!transform.any_op) -> !transform.any_op
    %generic_count = transform.num_associations %generic : (!transform.any_op) -> !transform.param<i64>
    transform.match.param.cmpi eq %generic_count, %none : !transform.param<i64>
    %matmul = transform.select "linalg.matmul" in %producers : (!transform.any_op) -> !transform.any_op
    %matmul_count = transform.num_associations %matmul : (!transform.any_op) -> !transform.param<i64>
    transform.match.param.cmpi eq %matmul_count, %none : !transform.param<i64>
    %batch_matmul = transform.select "linalg.batch_matmul" in %producers : (!transform.any_op) -> !transform.any_op
    %batch_matmul_count = transform.num_associations %batch_matmul : (!transform.any_op) -> !transform.param<i64>
    transform.match.param.cmpi eq %batch_matmul_count, %none : !transform.param<i64>
    transform.yield %rank : !transform.param<i64>
  }

  // Elementwise over a vector (a multiple of 1024): 256 threads of 4 elements.
  transform.named_sequence @match_elementwise_1d(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %rank = transform.include @match_elementwise failures(propagate) (%op) : (!transform.any_op) -> !transform.param<i64>
    %one = transform.param.constant 1 : i64 -> !transform.param<i64>
    transform.match.param.cmpi eq %rank, %one : !transform.param<i64>
    %input = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %input = tensor<?xf32> : !transform.any_value
    %output = transform.get_operand %op[-1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[0], 1024 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [1024], thread = [4]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // Elementwise over rows (rows a multiple of 8, width of 128): 8 rows of 32 threads.
  transform.named_sequence @match_elementwise_2d(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %rank = transform.include @match_elementwise failures(propagate) (%op) : (!transform.any_op) -> !transform.param<i64>
    %two = transform.param.constant 2 : i64 -> !transform.param<i64>
    transform.match.param.cmpi eq %rank, %two : !transform.param<i64>
    %input = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %input = tensor<?x?xf32> : !transform.any_value
    %output = transform.get_operand %op[-1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[0], 8 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[1], 128 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [8, 128], thread = [1, 4]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // Elementwise over [batch, heads, time, head width] (attention's q, k, v and their
  // gradients): 16 positions of 16 threads.
  transform.named_sequence @match_elementwise_4d(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %rank = transform.include @match_elementwise failures(propagate) (%op) : (!transform.any_op) -> !transform.param<i64>
    %four = transform.param.constant 4 : i64 -> !transform.param<i64>
    transform.match.param.cmpi eq %rank, %four : !transform.param<i64>
    %input = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %input = tensor<?x?x?x?xf32> : !transform.any_value
    %output = transform.get_operand %op[-1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[2], 16 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[3], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [1, 1, 16, 64], thread = [1, 1, 1, 4]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // Elementwise over [batch, time, heads, head width] (attention's output, heads
  // joined back into rows): 16 positions of 16 threads.
  transform.named_sequence @match_elementwise_4d_rows(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %rank = transform.include @match_elementwise failures(propagate) (%op) : (!transform.any_op) -> !transform.param<i64>
    %four = transform.param.constant 4 : i64 -> !transform.param<i64>
    transform.match.param.cmpi eq %rank, %four : !transform.param<i64>
    %input = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %input = tensor<?x?x?x?xf32> : !transform.any_value
    %output = transform.get_operand %op[-1] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[1], 16 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %output[3], 64 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [1, 16, 1, 64], thread = [1, 1, 1, 4]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // Elementwise over [batch, time, 3, heads, head width] (attention's q/k/v split and its
  // gradient, which transpose between that and [3, batch, heads, time, head width]): 16
  // positions of 16 threads. The loops are the untransposed side's, so their sizes are
  // not an operand's to check; a tile they do not divide costs idle threads, not
  // correctness.
  transform.named_sequence @match_elementwise_5d(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %rank = transform.include @match_elementwise failures(propagate) (%op) : (!transform.any_op) -> !transform.param<i64>
    %five = transform.param.constant 5 : i64 -> !transform.param<i64>
    transform.match.param.cmpi eq %rank, %five : !transform.param<i64>
    %input = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.cast_compatible_type %input = tensor<?x?x?x?x?xf32> : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [1, 16, 1, 1, 64], thread = [1, 1, 1, 1, 4]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [256, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  // The last sum of a column sum (pcp_core.nanogpt._column_sum: [128, width] rows to add
  // after the folds): IREE gives it one warp a workgroup, 4 columns a thread and 4 rows an
  // iteration, 32 dependent iterations; here 64 threads of one column each, 16 rows an
  // iteration. H100 gpt-b32 bf16 step: those sums 0.37 -> 0.27 ms (50 launches).
  transform.named_sequence @match_column_sum_last(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%in: tensor<?x?xf32>, %out: tensor<?xf32>):
      %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d1, d0)>, affine_map<(d0, d1) -> (d0)>],
                           iterator_types = ["parallel", "reduction"]}
          ins(%in : tensor<?x?xf32>) outs(%out : tensor<?xf32>) {
      ^bb0(%a: f32, %b: f32):
        %s = arith.addf %b, %a : f32
        linalg.yield %s : f32
      } -> tensor<?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %input = transform.get_operand %op[0] : (!transform.any_op) -> !transform.any_value
    transform.iree.match.dim_is_multiple_of %input[1], 64 : !transform.any_value
    transform.iree.match.dim_is_multiple_of %input[0], 16 : !transform.any_value
    transform.iree.match.dim_bounds %input[1], umin = 1, umax = 4096 : !transform.any_value
    %config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_gpu.lowering_config<{workgroup = [64, 0], thread = [1, 0], reduction = [0, 16]}>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse>
                                                        workgroup_size = [64, 1, 1] subgroup_size = 32>
    > -> !transform.any_param
    transform.yield %op, %config : !transform.any_op, !transform.any_param
  }

  transform.named_sequence @__kernel_config(%variant_op: !transform.any_op {transform.consumed})
      -> !transform.any_op attributes {iree_codegen.tuning_spec_entrypoint} {
    %res = transform.foreach_match in %variant_op
        @match_nn -> @apply_op_config,
        @match_nt -> @apply_op_config,
        @match_batch_nn -> @apply_op_config,
        @match_batch_tn -> @apply_op_config,
        @match_bf16_nn_wide -> @apply_op_config,
        @match_bf16_nn -> @apply_op_config,
        @match_bf16_nt -> @apply_op_config,
        @match_bf16_batch_tn_wide_n -> @apply_op_config,
        @match_bf16_batch_tn_wide_m -> @apply_op_config,
        @match_bf16_batch_nn -> @apply_op_config,
        @match_elementwise_1d -> @apply_op_config,
        @match_elementwise_2d -> @apply_op_config,
        @match_elementwise_4d -> @apply_op_config,
        @match_elementwise_4d_rows -> @apply_op_config,
        @match_elementwise_5d -> @apply_op_config,
        @match_column_sum_last -> @apply_op_config
      : (!transform.any_op) -> !transform.any_op
    transform.yield %res : !transform.any_op
  }
}
