/** @brief Habu's device header: everything generated kernels call. No CUDA system headers. */
#pragma once
#include "types.cuh"
#include "math.cuh"
#include "reduce/block.cuh"
#include "reduce/columns.cuh"
#include "memory/global.cuh"
#include "memory/async.cuh"
#include "memory/index.cuh"
#include "rows/chunk.cuh"
#include "sync/mbarrier.cuh"
#include "sync/grid.cuh"
#include "mma/sync.cuh"
#include "grouped/schedule.cuh"
#include "grouped/split.cuh"
#include "attention/online.cuh"
#include "attention/wgmma.cuh"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include "memory/tma.cuh"
#include "sync/cluster.cuh"
#include "reduce/cluster.cuh"
#include "reduce/split_tile.cuh"
#include "mma/wgmma.cuh"
#endif
