/* Attention over the paged KV cache in place (engines/pytorch/paged_attention.py): decode rows (one query per
   sequence) and prefill chunks (causal), rope and the cache writes included, float32 and bfloat16, with their
   entry points on the helper-thread pool. Built by native.py. */
#include "paged_attention_common.h"
#include "pool_client.h"
#include "type_suffix.h"

#define TYPE_SUFFIX f32
#include "paged_attention_typed.h"
#undef TYPE_SUFFIX
#define TYPE_SUFFIX bf16
#include "paged_attention_typed.h"
#undef TYPE_SUFFIX
