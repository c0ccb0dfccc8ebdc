/* One part of a grouped projection (gemm.c's gemm_grouped_par, called by moe.c): rows [start, end) of x go
   through this part's weight, GGUF block runs as gemm_blocks_par takes them (segs, ptrs, nseg). */
#ifndef SWITCHYARD_GEMM_GROUPED_H
#define SWITCHYARD_GEMM_GROUPED_H
#include <stdint.h>
typedef struct {
    const int* segs;
    const int64_t* ptrs;
    int nseg, start, end;
} grouped_part;
#endif
