"""habu.bench.train_step_profile's parts that need no GPU."""

from __future__ import annotations

from habu.bench.train_step_profile import is_product


def test_the_profile_tells_torch_products_from_the_rest_by_kernel_name():
    assert is_product("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1")
    assert is_product("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT")
    assert not is_product("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl>")
    assert not is_product("triton_red_fused__to_copy_add_mul_pow_rsqrt_sum_0")


def test_regression_the_timeline_counted_the_gpu_sleep_the_calls_were_queued_behind():
    """Session 40's first timeline read "a step spans 25458.7 µs" for a 4.5 ms step: the 200 ms GPU sleep
    (`spin_kernel`, whose name the filter for "sleep" missed) was in the span and the busy time. The sleep is
    the first interval; two calls of two kernels each, 1 µs apart, then a 3 µs gap between the calls."""
    from habu.bench.kernel_times import timeline

    spans = [(0.0, 200_000.0, "at::cuda::(anonymous namespace)::spin_kernel(long)"),
             (200_000.0, 200_010.0, "k0"), (200_011.0, 200_020.0, "k1"),
             (200_023.0, 200_033.0, "k0"), (200_034.0, 200_043.0, "k1")]
    line = timeline(spans, reps=2, behind_a_sleep=True)
    assert line["span_us"] == 21.5 and line["busy_us"] == 19.0 and line["idle_us"] == 2.5
    assert line["gaps"][0] == {"us": 1.5, "after": "k1", "before": "k0"}
    assert line["gaps"][1] == {"us": 1.0, "after": "k0", "before": "k1"}
    assert timeline(spans[1:], reps=2, behind_a_sleep=False) == line


def test_the_ceiling_is_the_baselines_kernel_time_over_its_products():
    """Session 61's 4096-token eager profile in round figures: six products of 625 µs and 750 µs of the rest
    give 4500 / 3750 = 1.2; no product, no ceiling."""
    from habu.bench.train_step_profile import ceiling_ratio

    times = {f"nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT#{i}": 625.0 for i in range(6)}
    times["void at::native::vectorized_elementwise_kernel<4, GeluBackward>"] = 750.0
    assert ceiling_ratio(times) == 1.2
    assert ceiling_ratio({"triton_poi_fused_add_0": 3.0}) == float("inf")
