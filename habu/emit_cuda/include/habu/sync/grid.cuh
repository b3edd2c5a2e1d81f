/** @brief Programmatic dependent launch (sm_90+): the kernels of one plan overlap their launches. A kernel
 *  lets the next one of its stream start launching, and waits for the previous one before it touches what
 *  that one wrote. Without the launch attribute (or before sm_90) both are no-ops. */
#pragma once

namespace habu {

/** @brief The next kernel in the stream may begin launching (its blocks run up to their own wait). */
__device__ __forceinline__ void grid_dependency_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/** @brief Wait until the previous kernel of the stream has completed and its memory operations are visible. */
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace habu
