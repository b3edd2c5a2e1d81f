"""habu.bench.train_step_profile's parts that need no GPU."""

from __future__ import annotations

from habu.bench.train_step_profile import is_product


def test_the_profile_tells_torch_products_from_the_rest_by_kernel_name():
    assert is_product("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1")
    assert is_product("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT")
    assert not is_product("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl>")
    assert not is_product("triton_red_fused__to_copy_add_mul_pow_rsqrt_sum_0")
